"""Acceptance: a run killed with SIGKILL in the middle resumes to the tables of an uninterrupted
run, with no duplicated rows.

The killed and the resumed run are fresh processes, as a user's would be; the uninterrupted
reference runs in-process (the same numbers: see test_cli.py's determinism test). The attack
parameters and ``parallel_trials`` are test_shard.py's, so in one pytest process the attack
compiles once for both files.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
from configs import run_config

from leakbench.cli import main
from leakbench.datasets import load_dataset
from leakbench.outputs.tables import TIMING_COLUMNS
from leakbench.run.config import parse_config
from leakbench.run.plan import attack_groups, plan

SEEDS = (0, 1)
IMAGES = 12
WIDTH = 2
TRIALS = 2 * IMAGES * len(SEEDS)  # idlg x (none, gaussian)
# Long enough that the kill lands between the first and the last group on a loaded machine
# (each group takes tens of milliseconds after the attack has compiled), short enough that the
# three runs take well under a minute on two cores.
CONFIG = run_config(
    "resumed",
    images=IMAGES,
    seeds=SEEDS,
    parallel_trials=WIDTH,
    defenses=({"name": "none"}, {"name": "gaussian", "sigma": 1e-3}),
)
# What identifies one image of one trial: each must occur once in trials.csv.
ROW_KEY = [
    "seed", "batch_index", "position", "attack", "attack_params", "defense", "defense_params",
]  # fmt: skip
TABLES = ("trials.csv", "leaderboard.csv", "utility.csv")
# Seconds to wait for the first stored trials (import, dataset and compile come first).
START_TIMEOUT = 300


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONSAFEPATH="1")


def _command(config: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "leakbench.cli", "run", str(config), "--out", str(out), "--quiet"]


def _entries(store: Path) -> dict[str, str] | None:
    """The committed trial entries of a store, read-only; None while it has no trials table."""
    if not store.exists():
        return None
    uri = f"{store.absolute().as_uri()}?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=5)) as db:
            return dict(db.execute("SELECT key, rows FROM trials"))
    except sqlite3.OperationalError:  # created but not yet initialised
        return None


def _kill_mid_run(config: Path, out: Path, log: Path) -> dict[str, str]:
    """Starts the run, SIGKILLs it once a quarter of the trials are stored, and returns the
    entries it committed."""
    store = out / "store.sqlite"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            _command(config, out), cwd=out.parent, env=_env(), stdout=err, stderr=err
        )
        try:
            deadline = time.monotonic() + START_TIMEOUT
            while True:
                held = _entries(store)
                if held is not None and len(held) >= TRIALS // 4:
                    break
                assert proc.poll() is None, f"the run ended unkilled:\n{log.read_text()}"
                assert time.monotonic() < deadline, "no trials stored in time"
                time.sleep(0.02)
            proc.send_signal(signal.SIGKILL)
        finally:
            if proc.poll() is None:  # a failed assertion above must not leave it running
                proc.kill()
            proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, log.read_text()
    held = _entries(store)
    assert held is not None
    return held


def _without_timing(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame.columns])


def test_a_run_killed_mid_way_resumes_to_the_uninterrupted_tables(tmp_path: Path) -> None:
    config = tmp_path / "resumed.toml"
    config.write_text(CONFIG, encoding="utf-8")
    out = tmp_path / "out"

    held = _kill_mid_run(config, out, tmp_path / "killed.log")

    assert 0 < len(held) < TRIALS, "the kill did not land mid-run; make the run longer"
    assert not (out / "trials.csv").exists()  # the tables come at the end
    with contextlib.closing(sqlite3.connect(out / "store.sqlite")) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    # Each attack group is committed in one transaction: the store holds whole groups.
    trials = plan(parse_config(CONFIG), load_dataset("digits"))
    groups = [{t.key for t in group} for group in attack_groups(trials, WIDTH)]
    assert all(group <= held.keys() or not group & held.keys() for group in groups)

    resumed = subprocess.run(
        _command(config, out), cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300
    )

    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith(f"{TRIALS - len(held)} trials run, {len(held)} reused")
    after = _entries(out / "store.sqlite")
    assert after is not None and len(after) == TRIALS
    # What the killed run committed is kept as it was, timings included.
    assert {key: after[key] for key in held} == held

    reference = tmp_path / "reference"
    assert main(["run", str(config), "--out", str(reference), "--quiet"]) == 0
    for table in TABLES:
        frames = [_without_timing(pd.read_csv(d / table)) for d in (reference, out)]
        pd.testing.assert_frame_equal(*frames, obj=table)
    rows = pd.read_csv(out / "trials.csv")
    assert len(rows) == TRIALS  # batch_size 1: one row per trial
    assert rows.groupby(ROW_KEY).size().max() == 1
