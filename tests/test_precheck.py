"""The checks made before TensorFlow loads: the shipped catalogue is the registries' (so
``leakbench list`` from it prints what the registries would), a config the full check accepts
passes the precheck, a mistake the precheck refuses is refused by the full check in the same
words, and ``list``, ``--help`` and a bad config answer with TensorFlow unimportable."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from leakbench.core import catalogue
from leakbench.core.errors import ConfigError, LeakbenchError
from leakbench.run import listing
from leakbench.run.config import RECORD_PROTOCOL, build_run
from leakbench.run.document import read_document
from leakbench.run.precheck import check_document

REPO = Path(__file__).resolve().parents[1]

BASE = {
    "name": "p",
    "dataset": "digits",
    "model": "lenet",
    "images": 4,
    "suite": "listed",
    "attack": [{"name": "dlg", "iterations": 50}, {"name": "idlg"}],
    "defense": [{"name": "none"}, {"name": "gaussian", "sigma": [0.01, 0.1]}],
    "training": {"enabled": True, "epochs": 1},
    "threat_model": {"labels_known": False},
}


def _full(doc: dict[str, Any]) -> str | None:
    """The full check's refusal of ``doc``, or None."""
    try:
        build_run(doc)
    except LeakbenchError as err:
        return str(err)
    return None


def _pre(doc: dict[str, Any]) -> str | None:
    try:
        check_document(doc, catalogue.load())
    except LeakbenchError as err:
        return str(err)
    return None


def test_the_shipped_catalogue_is_the_registries() -> None:
    shipped = catalogue.FILE.read_text(encoding="utf-8")
    assert shipped == listing.text(listing.build()), (
        "bench/core/catalogue.json is stale: run `python -m leakbench.run.listing --write`"
    )


def test_a_registered_plugin_is_listed_only_from_the_registries() -> None:
    from leakbench.defenses import DEFENSES
    from leakbench.defenses.gaussian import GaussianNoise

    class Louder(GaussianNoise):
        """A test's defense."""

    Louder.__module__ = "tests.louder"
    DEFENSES.register("louder_test")(Louder)
    try:
        assert "louder_test" not in listing.text(listing.build())
        live = catalogue.render(listing.build(builtin_only=False))
        assert "louder_test    A test's defense." in live
    finally:
        DEFENSES.unregister("louder_test")


# Single mistakes: each refused by the precheck, in the full check's words.
MISTAKES: list[tuple[str, Any]] = [
    ("colour", "blue"),
    ("images", 0),
    ("images", "8"),
    ("batch_size", 300),
    ("parallel_trials", True),
    ("first_batch", -1),
    ("model", "lenet5"),
    ("model", "keras:nowhere/model.keras"),
    ("dataset", "digitz"),
    ("dataset", "zip:data.zip"),
    ("training.epochs", 0),
    ("training.colour", 1),
    ("threat_model.labels_known", 2),
    ("threat_model.colour", 1),
    ("attack.0.name", "dlgg"),
    ("attack.0.name", 3),
    ("attack.0.iterations", 0),
    ("attack.0.iterations", [50, -1]),
    ("attack.0.iterations", []),
    ("attack.0.colour", 1),
    ("attack.1.retries", 1.5),
    ("defense.1.name", "gauss"),
    ("defense.1.sigma", -1.0),
    ("defense.1.sigma", [0.1, "x"]),
    ("defense.1.colour", 1),
]


def _with(key: str, value: Any) -> dict[str, Any]:
    doc = {
        k: ([dict(t) for t in v] if isinstance(v, list) else dict(v) if isinstance(v, dict) else v)
        for k, v in BASE.items()
    }
    parts = key.split(".")
    if len(parts) == 1:
        doc[key] = value
    elif len(parts) == 2:
        doc[parts[0]][parts[1]] = value
    else:
        doc[parts[0]][int(parts[1])][parts[2]] = value
    return doc


def test_the_base_config_passes_both() -> None:
    assert _full(BASE) is None
    assert _pre(BASE) is None


@pytest.mark.parametrize(("key", "value"), MISTAKES)
def test_a_mistake_is_refused_before_tensorflow_in_the_full_checks_words(
    key: str, value: Any
) -> None:
    doc = _with(key, value)
    full = _full(doc)
    assert full is not None, f"{key}={value!r} is no mistake"
    assert _pre(doc) == full


# Values of every kind the config holds, good and bad, for keys the precheck checks and keys
# it leaves to the full check: every pair is tried (374; about 60% refused by the precheck,
# 25% only by the full check, 15% by neither).
VALUES = [0, 1, 2, 8, 300, -1, 1.5, 0.1, 1e-3, True, "x", "dlg", "none", "image", [], [1, 2],
          [0.1, -1]]  # fmt: skip
KEYS = [
    "images", "batch_size", "seeds", "name", "lpips", "suite", "success_mse", "model",
    "training.epochs", "training.batch_size", "training.learning_rates", "training.enabled",
    "threat_model.labels_known", "threat_model.clients", "threat_model.server",
    "attack.0.iterations", "attack.0.retries", "attack.1.start", "attack.1.line_search",
    "defense.1.sigma", "defense.0.name", "attack.1.name",
]  # fmt: skip


@pytest.mark.parametrize("key", KEYS)
def test_the_precheck_never_refuses_what_the_full_check_accepts(key: str) -> None:
    for value in VALUES:
        doc = _with(key, value)
        pre, full = _pre(doc), _full(doc)
        if pre is not None:
            assert pre == full, (key, value)
        if full is None:
            assert pre is None, (key, value)


def _committed_configs() -> list[Path]:
    found = [*(REPO / "results").rglob("*.toml"), *(REPO / "benchmarks").rglob("*.toml")]
    return sorted(p for p in found if p.stat().st_size < 1_000_000)


def test_every_committed_config_passes_the_precheck(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run records (``config.toml``) hold paths relative to the repository's root, where they
    were run; other configs relative to their folder. A config whose data is absent here
    (``../shared/data``) is left out."""
    monkeypatch.chdir(REPO)
    checked = absent = 0
    for path in _committed_configs():
        try:
            if path.name == "config.toml":  # a record states its protocol, or is of protocol 1
                doc = {"protocol": RECORD_PROTOCOL}
                doc |= tomllib.loads(path.read_text(encoding="utf-8"))
            else:
                doc = read_document(path)
        except ConfigError as err:
            assert "does not exist" in str(err), path
            absent += 1
            continue
        if "plugins" in doc:
            continue
        message = _pre(doc)
        if message is not None and "no such file" in message:
            absent += 1
            continue
        assert message is None, path
        checked += 1
    assert checked > 50, (checked, absent)


BLOCK = """
import importlib.abc, sys
class _Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("tensorflow", "keras", "sklearn", "pandas"):
            raise ImportError("blocked by the test: " + name)
sys.meta_path.insert(0, _Block())
from leakbench.cli import main
code = main(sys.argv[1:])
assert "tensorflow" not in sys.modules
sys.exit(code)
"""


def _blocked(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    return subprocess.run(
        [sys.executable, "-c", BLOCK, *args], capture_output=True, text=True, cwd=cwd, env=env
    )


def test_a_reader_that_stops_early_gets_no_traceback(tmp_path: Path) -> None:
    """``leakbench list | head -1``: the listing is written into a pipe whose reader is gone
    (closed before the command starts, so the write fails whatever the pipe's buffer)."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "leakbench.cli", "list"], stdout=write, stderr=subprocess.PIPE,
            cwd=tmp_path, env={**os.environ, "PYTHONSAFEPATH": "1"}, text=True,
        )  # fmt: skip
    finally:
        os.close(write)
    assert done.returncode == 141
    assert "Traceback" not in done.stderr and "Error" not in done.stderr


def test_list_help_and_a_bad_config_need_no_tensorflow(tmp_path: Path) -> None:
    listed = _blocked("list", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout == catalogue.render(catalogue.load()) + "\n"
    assert "  learned        [image]" in listed.stdout
    helped = _blocked("--help", cwd=tmp_path)
    assert helped.returncode == 0 and "usage: leakbench" in helped.stdout
    (tmp_path / "bad.toml").write_text('dataset = "digits"\n[[defense]]\nname = "gauss"\n')
    refused = _blocked("run", "bad.toml", cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.startswith("leakbench: error: unknown defense 'gauss'; allowed: ")
    assert refused.stderr.count("\n") == 1
    assert not (tmp_path / "runs").exists()
    missing = _blocked("run", "nowhere.toml", cwd=tmp_path)
    assert (missing.returncode, missing.stderr) == (
        2,
        "leakbench: error: config file nowhere.toml does not exist\n",
    )


# Protocol 2's fair budget joins fields ([training], [training.dp], the defenses): refused in
# the full check's words before TensorFlow loads.
DPSGD = {"name": "dpsgd", "noise_multiplier": 1.0, "norm": 1.0}
DP_BASE = {**BASE, "defense": [{"name": "none"}, DPSGD],
           "training": {"epochs": 2, "learning_rates": [0.01, 0.03],
                        "dp": {"learning_rates": [2.0, 4.0]}}}  # fmt: skip
UNFAIR = [
    {"epochs": 3},
    {"epochs": 1, "learning_rates": [2.0, 4.0]},
    {"learning_rates": [2.0]},
    {"learning_rates": [2.0, 4.0, 8.0]},
]


@pytest.mark.parametrize("dp", UNFAIR)
def test_an_unfair_dp_budget_is_refused_before_tensorflow(dp: dict[str, Any]) -> None:
    doc = {**DP_BASE, "training": {**DP_BASE["training"], "dp": dp}}
    full = _full(doc)
    assert full is not None and full.startswith("training.dp.")
    assert _pre(doc) == full
    for fair in ({**doc, "protocol": 1}, {**doc, "defense": BASE["defense"]}):
        assert _pre(fair) is None and _full(fair) is None
    off = {**doc, "training": {**doc["training"], "dp": {**dp, "enabled": False}}}
    assert _pre(off) is None


def test_a_fair_dp_budget_passes_both() -> None:
    for dp in ({"learning_rates": [2.0, 4.0]}, {"epochs": 2, "learning_rates": [2.0, 4.0]}):
        doc = {**DP_BASE, "training": {**DP_BASE["training"], "dp": dp}}
        assert _pre(doc) is None and _full(doc) is None
