"""Stores remember the engine version that made them; another version's store is refused."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import sqlite3
from pathlib import Path

from configs import run_config

from leakbench.cli import main
from leakbench.components.dsnr import KIND_THRESHOLDS
from leakbench.core.versions import ENGINE_VERSION, UNVERSIONED
from leakbench.run.config import parse_config
from leakbench.run.plan import plan
from leakbench.run.store import Store

CONFIG = run_config("versioned", images=1)

# The client check's thresholds (`leakbench.components.dsnr.KIND_THRESHOLDS`) that each engine
# holds, by a hash of their table. A stored trial's detection columns were judged by them and
# its key does not name them, so a resumed store would keep flags of other thresholds: a
# change to them is a change of engine (`leakbench.core.versions`).
DETECTION_THRESHOLDS = {8: "b05518c019eb99d8", 9: "b05518c019eb99d8"}


def _thresholds_hash() -> str:
    table = sorted((kind, sorted(rows.items())) for kind, rows in KIND_THRESHOLDS.items())
    return hashlib.sha256(repr(table).encode()).hexdigest()[:16]


def test_the_detection_thresholds_change_only_with_the_engine() -> None:
    assert DETECTION_THRESHOLDS.get(ENGINE_VERSION) == _thresholds_hash(), (
        "KIND_THRESHOLDS changed: raise ENGINE_VERSION (stores judged by the old ones must not "
        "be resumed) and record the new hash here"
    )


def _run(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, err.getvalue()


def test_a_new_store_records_this_engine_and_environment_json_too(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(CONFIG, encoding="utf-8")
    assert _run("run", str(config), "--out", str(tmp_path / "out"), "--quiet")[0] == 0
    store = Store(tmp_path / "out" / "store.sqlite", readonly=True)
    assert store.engine_version() == ENGINE_VERSION
    store.close()
    environment = json.loads((tmp_path / "out" / "environment.json").read_text(encoding="utf-8"))
    assert environment["engine_version"] == ENGINE_VERSION


def test_trial_keys_include_the_engine_version(monkeypatch) -> None:
    from leakbench.datasets import load_dataset
    from leakbench.run import store

    spec, digits = parse_config(CONFIG), load_dataset("digits")
    now = [t.key for t in plan(spec, digits)]
    monkeypatch.setattr(store, "ENGINE_VERSION", ENGINE_VERSION + 1)
    assert not set(now) & {t.key for t in plan(spec, digits)}


def _older_store(out: Path) -> None:
    """A run directory as code before engine versions left it: a store with results and no
    recorded version."""
    out.mkdir()
    db = sqlite3.connect(out / "store.sqlite")
    for table in ("trials", "utility"):
        db.execute(f"CREATE TABLE {table} (key TEXT PRIMARY KEY, rows TEXT NOT NULL)")
    db.execute("INSERT INTO trials VALUES ('0123', '[]')")
    db.commit()
    db.close()


def test_a_run_directory_of_an_older_engine_is_refused_in_one_line(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(CONFIG, encoding="utf-8")
    out = tmp_path / "old"
    _older_store(out)

    code, err = _run("run", str(config), "--out", str(out), "--extend")

    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1
    assert f"engine version {UNVERSIONED}" in lines[0]
    assert f"engine version {ENGINE_VERSION}" in lines[0] and "fresh --out" in lines[0]
    assert not (out / "trials.csv").exists() and not (out / "config.toml").exists()
    tables = sqlite3.connect(out / "store.sqlite").execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'"
    )
    assert {name for (name,) in tables} == {"trials", "utility"}  # the old store untouched
    # A fresh directory runs.
    assert _run("run", str(config), "--out", str(tmp_path / "new"), "--quiet")[0] == 0


def test_merge_refuses_a_shard_of_an_older_engine(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(CONFIG, encoding="utf-8")
    shard = tmp_path / "shard"
    assert _run("run", str(config), "--out", str(shard), "--shard", "1/1", "--quiet")[0] == 0
    db = sqlite3.connect(shard / "store.sqlite")
    db.execute("DROP TABLE meta")  # as a store made before engine versions
    db.commit()
    db.close()

    code, err = _run("merge", str(shard), "--out", str(tmp_path / "merged"))

    assert code == 2
    assert f"engine version {UNVERSIONED}" in err and len(err.strip().splitlines()) == 1
