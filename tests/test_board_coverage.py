"""The board's coverage driver (benchmarks/board_coverage.py): a trained cell may reuse its
initialisation cell's utility trainings, because their store keys are the same."""

from __future__ import annotations

import csv
import os
import platform
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from scripts import load_script

from leakbench.core.environment import describe_cpu
from leakbench.core.versions import ENGINE_VERSION
from leakbench.run.config import load_config
from leakbench.run.pipelines import pipeline_for
from leakbench.run.plan import plan_training
from leakbench.run.store import Store

coverage = load_script("board_coverage")
PAIRS = [
    ("mnist-lenet-init", "mnist-lenet-trained"),
    ("cifar10-lenet-init", "cifar10-lenet-trained"),
]
ROOT = Path(__file__).resolve().parents[1]
CELLS = ROOT / "benchmarks" / "board"
SHARED = ROOT.parent / "shared" / "data"


@pytest.mark.parametrize(("init", "trained"), PAIRS)
def test_trained_cell_plans_the_init_cells_trainings(init: str, trained: str) -> None:
    # What makes --trainings-from sound: the attacked model's state (threat_model.train_steps)
    # is in no training's key, so each training the trained cell plans for a seed of its
    # initialisation cell is one that cell plans, under the same key (a trained cell with more
    # seeds, for protocol 2's two model seeds, trains the others itself).
    cells = ROOT / "benchmarks" / "board"
    # One dataset for both, without the shared data (a relative path is checked when read).
    first = load_config(cells / f"{init}.toml", ["dataset=digits"])
    second = load_config(cells / f"{trained}.toml", ["dataset=digits"])
    assert first.threat_model.train_steps == 0 and second.threat_model.train_steps == 300
    assert set(first.seeds) <= set(second.seeds)
    keys = [t.key for t in plan_training(second) if t.seed in first.seeds]
    assert keys and set(keys) <= {t.key for t in plan_training(first)}


@pytest.mark.skipif(
    not SHARED.is_dir(), reason="the cells read MNIST, CIFAR-10 and LFW from ../shared/data"
)
@pytest.mark.parametrize("cell", sorted(path.stem for path in CELLS.glob("*.toml")))
def test_every_cell_passes_the_checks_a_run_makes_before_it_writes(
    cell: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The ConvNet cell once listed DP-SGD, which `leakbench run` refuses on a model with
    # BatchNorm; that surfaced only when the cell was started. Each cell must pass the checks a
    # run makes against its model, its audit and its trainings (its dataset path is relative to
    # the cell's folder, and recorded relative to the project root, where the driver runs).
    monkeypatch.chdir(ROOT)
    pipeline = pipeline_for(load_config(CELLS / f"{cell}.toml"))
    data = pipeline.load()
    pipeline.check(data, pipeline.plan(data))
    pipeline.trainings(data)


def _cells(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cells = tmp_path / "cells"
    cells.mkdir()
    for cell in "ab":
        text = f'name = "board-{cell}"\n[[attack]]\nname = "idlg"\n[[defense]]\nname = "none"\n'
        (cells / f"{cell}.toml").write_text(text, encoding="utf-8")
    monkeypatch.setattr(coverage, "CELLS", cells)
    monkeypatch.setattr(coverage, "OUT", tmp_path / "out")
    return tmp_path / "out"


def test_copy_trainings_renames_the_run_and_keeps_what_is_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _cells(tmp_path, monkeypatch)
    (out / "a").mkdir(parents=True)
    source = Store(out / "a" / "store.sqlite")
    source.add("k1", [{"run": "board-a", "test_accuracy": 0.9}], "utility")
    source.add("k2", [{"run": "board-a", "test_accuracy": 0.5}], "utility")
    source.add("t1", [{"run": "board-a", "mse": 0.1}])  # an attack trial: not copied
    source.close()
    (out / "b").mkdir()
    target = Store(out / "b" / "store.sqlite")
    target.add("k2", [{"run": "board-b", "test_accuracy": 0.25}], "utility")
    target.close()

    assert coverage.copy_trainings("a", "b") == 1
    assert coverage.copy_trainings("a", "b") == 0
    copied = Store(out / "b" / "store.sqlite", readonly=True)
    assert copied.rows(["k1", "k2"], "utility") == [
        {"run": "board-b", "test_accuracy": 0.9},
        {"run": "board-b", "test_accuracy": 0.25},  # its own training is kept
    ]
    assert copied.keys() == set()
    copied.close()


def test_trainings_from_a_cell_never_run_is_one_line_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _cells(tmp_path, monkeypatch)
    monkeypatch.setattr(coverage, "ORDER", ["a", "b"])
    ran: list[str] = []
    monkeypatch.setattr(coverage, "run_cell", lambda cell, extra, copied: ran.append(cell) or 0)
    assert coverage.main(["b", "--trainings-from", "a"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"--trainings-from: {out / 'a' / 'store.sqlite'} does not exist (run a first)"]
    assert not ran and not (out / "b").exists()


def test_cost_row_names_the_cell_whose_trainings_were_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = _cells(tmp_path, monkeypatch)
    calls: list[list[str]] = []
    monkeypatch.setattr(coverage, "call", lambda command: calls.append(command) or 0)
    assert coverage.run_cell("b", ["--quiet"], "a") == 0
    cli = coverage.cli_executable()  # the `leakbench` beside this interpreter
    assert calls == [
        [cli, "run", str(tmp_path / "cells" / "b.toml"), "--out", str(out / "b"), "--quiet"]
    ]
    rows = (out / "cost.csv").read_text(encoding="utf-8").splitlines()
    assert rows[0] == ",".join(coverage.COST_COLUMNS)
    assert rows[1].split(",")[0] == "b" and rows[1].split(",")[5] == "--trainings-from a --quiet"
    assert rows[1].split(",")[-1] == str(ENGINE_VERSION)
    # The machine is the CPU model, which sets a number's last bits (docs/reproducibility.md),
    # not the architecture that every machine here shares.
    (row,) = csv.DictReader(rows)
    assert row["machine"] == (describe_cpu()["cpu"] or platform.machine())


def test_a_sigterm_to_the_driver_stops_the_run_and_still_writes_the_cost_row(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a session's end or a `kill` does: the run is stopped (it resumes from its store) and
    # the driver records what it cost, instead of dying with it and losing the row.
    out = _cells(tmp_path, monkeypatch)
    ready = tmp_path / "ready"
    fake = tmp_path / "fake-leakbench"
    fake.write_text(f"#!/bin/sh\ntouch {ready}\nexec sleep 60\n", encoding="utf-8")
    fake.chmod(0o755)
    monkeypatch.setattr(coverage, "cli_executable", lambda: str(fake))

    def stop_when_ready() -> None:
        for _ in range(600):
            if ready.exists():
                break
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    killer = threading.Thread(target=stop_when_ready)
    killer.start()
    began = time.monotonic()
    code = coverage.run_cell("b", [], None)
    killer.join()
    assert code == -signal.SIGTERM
    assert time.monotonic() - began < 30  # it did not wait for the sleep to end
    rows = list(csv.DictReader((out / "cost.csv").open(encoding="utf-8")))
    assert [(r["cell"], r["returncode"]) for r in rows] == [("b", str(-signal.SIGTERM))]
    assert signal.getsignal(signal.SIGTERM) == before  # the driver's handler is gone


def test_a_stopped_cells_store_file_alone_holds_its_finished_trials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A run killed outright leaves its last commits in store.sqlite-wal, which git ignores; the
    # driver folds them into store.sqlite, the file a multi-session cell commits.
    out = _cells(tmp_path, monkeypatch)
    store = out / "b" / "store.sqlite"
    store.parent.mkdir(parents=True)
    killed = (
        "import os, sys\n"
        "from leakbench.run.store import Store\n"
        "Store(sys.argv[1]).add('trial-1', [{'run': 'b', 'psnr': 30.0}])\n"
        "os._exit(0)\n"  # no close: the commit stays in the journal
    )
    subprocess.run([sys.executable, "-c", killed, str(store)], check=True)
    assert Path(f"{store}-wal").stat().st_size > 0
    monkeypatch.setattr(coverage, "call", lambda command: -signal.SIGTERM)
    assert coverage.run_cell("b", [], None) == -signal.SIGTERM
    assert not Path(f"{store}-wal").exists()
    alone = tmp_path / "committed" / "store.sqlite"
    alone.parent.mkdir()
    shutil.copyfile(store, alone)  # what a fresh clone has
    copy = Store(alone, readonly=True)
    try:
        assert copy.rows(["trial-1"]) == [{"run": "b", "psnr": 30.0}]
    finally:
        copy.close()
