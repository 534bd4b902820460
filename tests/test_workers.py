"""Local worker processes (``leakbench run --workers N``) give the in-process run's tables.

Two worker processes attack a run of two seeds and train its models; the trials, utility and
leaderboard CSVs equal those of the same config run in this process, but for the timing
columns. A unit that fails in a worker stops the run with the worker's traceback; bad
``--workers`` values are one line and exit status 2.
"""

from __future__ import annotations

import contextlib
import io
import multiprocessing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from configs import run_config

from leakbench.cli import main
from leakbench.outputs.tables import TIMING_COLUMNS
from leakbench.run.config import parse_config
from leakbench.run.dispatch import Affinity, Scheduler, Unit
from leakbench.run.pipeline import Work
from leakbench.run.pipelines import pipeline_for
from leakbench.run.runner import run_benchmark
from leakbench.run.store import Store
from leakbench.run.workers import (
    MAX_AUTO_WORKERS,
    UNITS_PER_WORKER,
    WorkerPool,
    _serve,
    auto_workers,
)

SEEDS = (0, 1)
# Two groups per seed and attack (parallel_trials 2 of 4 images), so both workers attack.
CONFIG = run_config(
    "workers",
    images=4,
    seeds=SEEDS,
    parallel_trials=2,
    attacks=({"name": "idlg", "iterations": 20}, {"name": "analytic"}),
    defenses=({"name": "none"}, {"name": "prune", "ratio": 0.5}),
    model="mlp",
    training={"epochs": 1, "batch_size": 256, "seeds": 2, "learning_rates": [1e-3]},
)
TABLES = ("trials.csv", "utility.csv", "leaderboard.csv")


def _tables(out: Path) -> dict[str, pd.DataFrame]:
    frames = {}
    for name in TABLES:
        frame = pd.read_csv(out / name)
        frames[name] = frame.drop(columns=[c for c in TIMING_COLUMNS if c in frame])
    return frames


@pytest.mark.slow
def test_two_workers_give_the_in_process_tables(tmp_path: Path) -> None:
    spec = parse_config(CONFIG)
    alone = run_benchmark(spec, tmp_path / "alone", progress=False, workers=1)
    pooled = run_benchmark(spec, tmp_path / "pooled", progress=False, workers=2)
    # Prune brings its adaptive idlg (match=kept): 3 attacks on prune, 2 on none.
    assert alone.ran == pooled.ran == (2 + 3) * 4 * len(SEEDS)
    assert alone.trained == pooled.trained == 2 * 2 * len(SEEDS)
    for name, frame in _tables(tmp_path / "alone").items():
        pd.testing.assert_frame_equal(_tables(tmp_path / "pooled")[name], frame, obj=name)
    # Resumed with workers: nothing is left to run, and no worker is started.
    again = run_benchmark(spec, tmp_path / "pooled", progress=False, workers=2)
    assert (again.ran, again.trained) == (0, 0)


@pytest.mark.slow
def test_the_workers_outlive_a_stage_and_stop_on_close(tmp_path: Path) -> None:
    # The stages of a run call the pool once each: the same processes serve them all.
    pipeline = pipeline_for(parse_config(CONFIG))
    dataset = pipeline.load()
    groups = pipeline.groups(pipeline.plan(dataset))
    store = Store(tmp_path / "store.sqlite")
    try:
        with WorkerPool(2) as pool:
            pool.run(Work(pipeline, dataset, [], groups[:2], set()), store, progress=False)
            first = pool.pids()
            pool.run(Work(pipeline, dataset, [], groups[2:], store.keys()), store, progress=False)
            assert pool.pids() == first and len(first) == 2
            processes = list(pool._processes)
        assert pool.pids() == [] and not any(p.is_alive() for p in processes)
        assert store.keys() == {t.key for group in groups for t in group}
    finally:
        store.close()


@contextlib.contextmanager
def _worker() -> Iterator[tuple[Any, Any]]:
    """One worker process serving ``CONFIG`` (the pipe's driver end and the process)."""
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_serve, args=(child, CONFIG), daemon=True)
    process.start()
    child.close()
    try:
        yield parent, process
    finally:
        if process.is_alive():
            process.terminate()


def test_a_failing_unit_stops_the_run_with_the_workers_traceback() -> None:
    with _worker() as (parent, process):
        units = [Unit("no_such_method", (), None, 1, "the unit under test")]
        with pytest.raises(RuntimeError, match="running the unit under test failed") as caught:
            WorkerPool._dispatch([parent], [process], units, lambda u, r: None, _Bar())
        assert "AttributeError" in str(caught.value)
        parent.send(None)
        process.join(timeout=60)
        assert process.exitcode == 0  # the worker survived the failure and stopped when told


def test_a_dead_worker_is_named_with_its_unit() -> None:
    with _worker() as (parent, process):
        process.terminate()
        process.join()
        units = [Unit("train", ("key",), None, 1, "the unit under test")]
        with pytest.raises(RuntimeError, match="running the unit under test died .*rerun"):
            WorkerPool._dispatch([parent], [process], units, lambda u, r: None, _Bar())


class _Bar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def test_auto_starts_one_worker_per_cpu_for_enough_work() -> None:
    assert auto_workers(UNITS_PER_WORKER * 2 - 1, cpus=2) == 1  # too little work for two
    assert auto_workers(UNITS_PER_WORKER * 2, cpus=2) == 2
    assert auto_workers(10_000, cpus=64) == MAX_AUTO_WORKERS
    assert auto_workers(10_000, cpus=1) == 1
    assert auto_workers(0, cpus=8) == 1


def test_the_scheduler_keeps_a_worker_on_its_seed() -> None:
    units = [Unit("attack", (i,), seed, 1, "") for i, seed in enumerate([0, 0, 0, 1, 1, 1])]
    scheduler = Scheduler(units, 2)
    first, second = scheduler.take(0), scheduler.take(1)
    assert (first.seed, second.seed) == (0, 1)  # the idle worker takes a seed nobody holds
    scheduler.done(1)
    assert scheduler.take(1).seed == 1  # and keeps it
    scheduler.done(0)
    assert [scheduler.take(0).seed, scheduler.take(0).seed] == [0, 0]
    scheduler.done(1)
    assert scheduler.take(1).seed == 1
    assert not scheduler


def test_the_scheduler_keeps_a_worker_on_the_programs_it_compiled() -> None:
    # Two attack configurations of one seed, interleaved as the plan cuts them: each worker
    # stays with the program it compiled first, so each is compiled once.
    units = [Unit("attack", (i,), 0, 1, "", program) for i, program in enumerate("ababab")]
    scheduler = Scheduler(units, 2)
    taken = {0: [scheduler.take(0).program], 1: [scheduler.take(1).program]}
    while scheduler:
        for worker in (0, 1):
            scheduler.done(worker)
            if scheduler:
                taken[worker].append(scheduler.take(worker).program)
    assert taken == {0: ["a", "a", "a"], 1: ["b", "b", "b"]}


def test_the_next_stage_sends_a_program_to_the_worker_that_compiled_it() -> None:
    affinity = Affinity.fresh(2)
    first = Scheduler([Unit("attack", (0,), 0, 1, "", "a"), Unit("attack", (1,), 0, 1, "", "b")],
                      2, affinity)  # fmt: skip
    assert [first.take(0).program, first.take(1).program] == ["a", "b"]
    # A later stage of the same run: worker 0 gets "a" again although "b" comes first.
    later = Scheduler([Unit("attack", (2,), 0, 1, "", "b"), Unit("attack", (3,), 0, 1, "", "a")],
                      2, affinity)  # fmt: skip
    assert later.take(0).program == "a"


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--workers", "0"], "--workers must be a whole number of at least 1 or auto, got 0"),
        (["--workers", "two"], "--workers must be a whole number of at least 1 or auto, got 'two'"),
        (["--workers", "2", "--backend", "ray"], "--workers is for the local backend"),
    ],
)
def test_bad_workers_are_one_line(tmp_path: Path, argv: list[str], needle: str) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["run", "--out", str(tmp_path / "run"), *argv])
    lines = err.getvalue().splitlines()
    assert code == 2 and len(lines) == 1 and needle in lines[0], err.getvalue()
    assert not (tmp_path / "run").exists()
