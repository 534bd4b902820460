"""The benchmark runner: plan, execute, and write the run directory.

`run_benchmark` joins the three parts of a run, each behind one seam:

* the plan (`leakbench.run.plan`): every trial and training of the config, their keys and the
  attack groups, a pure function of the config and the dataset;
* execution (`leakbench.run.execute`): a `Backend` (local or Ray) runs the units still to do;
* the run directory (`leakbench.run.rundir`, `leakbench.run.store`): the checks before anything is
  written, the store every result is committed to as it finishes, and the exported tables.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from leakbench.client.update import check_model
from leakbench.components.forward import examples_interact
from leakbench.components.models import build_model
from leakbench.core.errors import ConfigError
from leakbench.datasets import Dataset, load_dataset
from leakbench.run import stages
from leakbench.run.backends import make_backend
from leakbench.run.config import RunSpec
from leakbench.run.epsilon_audit import check_audit, run_epsilon_audit
from leakbench.run.execute import Work
from leakbench.run.lock import hold_run_dir
from leakbench.run.plan import Training, Trial, attack_groups, plan, plan_training
from leakbench.run.rundir import check_engine_on_disk, export_tables, prepare_out_dir, write_records
from leakbench.run.shard import WHOLE, Shard
from leakbench.run.store import Store
from leakbench.run.text_runner import run_text_benchmark


@dataclasses.dataclass(frozen=True)
class RunResult:
    """What a run produced: the exported tables and how many trials ran now or were reused."""

    out_dir: Path
    trials: pd.DataFrame
    utility: pd.DataFrame
    leaderboard: pd.DataFrame
    ran: int
    reused: int
    trained: int
    training_reused: int
    seconds: float


def run_benchmark(
    spec: RunSpec,
    out_dir: str | Path,
    *,
    extend: bool = False,
    progress: bool = True,
    shard: Shard = WHOLE,
    backend: str = "local",
    address: str | None = None,
    workers: int | str = 1,
    wait: bool = False,
    notice: Callable[[str], None] | None = None,
    utility: bool = True,
) -> RunResult:
    """Runs (or resumes) a benchmark and writes ``config.toml``, ``trials.csv``,
    ``leaderboard.csv`` and ``store.sqlite`` into ``out_dir``.

    With ``shard`` ``i/n`` only that share of the attack groups and trainings runs (see
    `leakbench.run.shard`); ``out_dir`` records the shard and its tables hold what its store holds.
    ``backend`` is where the trainings and attack groups run (a name of
    `leakbench.run.backends.backend_names`: ``"local"`` in this process, or ``"ray"`` on Ray
    actors, a private local Ray instance or the cluster at ``address``), with the same groups
    and so the same tables; ``workers`` (local backend only) is how many local worker processes
    run them: 1 (this process), a larger count, or ``"auto"`` (one per CPU, at most
    `leakbench.run.workers.MAX_AUTO_WORKERS`, and none for a small run), the same tables again.
    One process at a time writes ``out_dir`` (`leakbench.run.lock.hold_run_dir`): another live
    holder is refused with its pid and host, or with ``wait`` waited for (one line to
    ``notice``). Everything a user can get wrong (names, parameters, data, a different config
    or shard already in ``out_dir``, a backend that cannot be used) is checked before anything
    is written. ``utility`` false: an image run trains no utility model, only the attacked
    one of ``train_steps`` with its ``[training]`` recipe (`leakbench board --verify`'s rerun).
    """
    start, out = time.perf_counter(), Path(out_dir)
    options: dict[str, Any] = {"extend": extend, "progress": progress, "shard": shard,
                               "backend": backend, "address": address, "workers": workers,
                               "wait": wait, "notice": notice}  # fmt: skip
    if spec.text is not None:  # a text run (`leakbench.run.text_runner`)
        return RunResult(**run_text_benchmark(spec, out, **options))
    if spec.threat_model.checkpoints:
        return _run_checkpoints(spec, out, options, start)
    # Checked first: a missing extra or an unreachable cluster must not cost a dataset load.
    executor = make_backend(backend, address, workers)
    dataset = load_dataset(spec.dataset, spec.image_size)
    trials = plan(spec, dataset)
    # The groups are cut from the whole plan before sharding, so each shard attacks exactly
    # the groups an unsharded run would.
    first, *later = stages.split(spec, trials, shard.whole)
    groups = shard.take(attack_groups(first, spec.parallel_trials))
    trainings = _checked(spec, dataset)
    config_text = spec.to_toml()
    # A cluster is joined on entering: one that refuses us leaves nothing written.
    with executor, hold_run_dir(out, wait=wait, notice=notice):
        prepare_out_dir(out, config_text, extend, shard)
        check_engine_on_disk(out)
        store = Store(out / "store.sqlite")
        try:
            write_records(out, shard, config_text)
            mine, train_todo, done, todo = _pending(store, shard, trainings, groups, utility)
            executor.run(Work(spec, dataset, train_todo, groups, done), store, progress)
            groups, todo = _later_stages(spec, dataset, executor, store, out, progress,
                                         (first, later, groups, todo, done))  # fmt: skip
            audit = None
            if spec.epsilon_audit is not None and shard.whole:
                audit = run_epsilon_audit(spec, dataset, trials, out, progress=progress)
            frame, utility, board = export_tables(
                spec, store, trials, trainings, out, dataset, audit
            )
        finally:
            store.close()
    return RunResult(
        out_dir=out,
        trials=frame,
        utility=utility,
        leaderboard=board,
        ran=len(todo),
        reused=sum(len(group) for group in groups) - len(todo),
        trained=len(train_todo),
        training_reused=len(mine) - len(train_todo),
        seconds=time.perf_counter() - start,
    )


def _checked(spec: RunSpec, dataset: Dataset) -> list[Training]:
    """The run's checks against its model, its audit and its trainings, before anything is
    written; the trainings it plans."""
    _check_against_model(spec, dataset)
    check_audit(spec, dataset)
    return _checked_trainings(spec, dataset)


def _pending(
    store: Store, shard: Shard, trainings: list[Training], groups: list[list[Trial]],
    utility: bool = True,
) -> tuple[list[Training], list[Training], set[str], list[Trial]]:  # fmt: skip
    """This shard's trainings (none without ``utility``), those of them not stored yet, the keys
    of the stored trials and the trials of ``groups`` not stored yet."""
    done = store.keys("utility")
    mine = shard.take(trainings) if utility else []
    train_todo = [t for t in mine if t.key not in done]
    done = store.keys()
    todo = [t for group in groups for t in group if t.key not in done]
    return mine, train_todo, done, todo


def _checked_trainings(spec: RunSpec, dataset: Dataset) -> list[Training]:
    """The run's utility trainings, refused in one line when the training split cannot hold
    them (`leakbench.client.recipes.TrainingConfig.check_fits`)."""
    if spec.training is not None:
        spec.training.check_fits(
            len(dataset.train), spec.defense_grid(), f"{spec.dataset}'s training split"
        )
    return plan_training(spec)


def _later_stages(
    spec: RunSpec,
    dataset: Dataset,
    executor: Any,
    store: Store,
    out: Path,
    progress: bool,
    state: tuple[list[Trial], list[list[Trial]], list[list[Trial]], list[Trial], set[str]],
) -> tuple[list[list[Trial]], list[Trial]]:
    """Runs the stages after the first (`leakbench.run.stages`), each decided from the rows
    of the ones before it: which attacks broke ``none`` by the tables' own flags (the trials
    against ``none`` are exported first, identification included), which images leaked by
    their scores. Returns every group run and every trial run now."""
    ran, later, groups, todo, done = state
    if not later:
        return groups, todo
    against_none = [t for t in ran if t.defense.name == "none"]
    flagged, _, _ = export_tables(spec, store, against_none, [], out, dataset)
    flags = dict(zip(_row_keys(flagged), flagged["leaked"], strict=True))
    for stage in later:
        rows = store.rows([t.key for t in ran])
        for row in rows:
            row["leaked"] = flags.get(_row_key(row), float("nan"))
        chosen = stages.gate(ran, stage, rows, spec.success_mse)
        more = attack_groups(chosen, spec.parallel_trials)
        todo = todo + [t for group in more for t in group if t.key not in done]
        executor.run(Work(spec, dataset, [], more, done), store, progress)
        groups, ran = groups + more, ran + chosen
    return groups, todo


def _row_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(str(row[c]) for c in ROW_KEY)


def _row_keys(frame: pd.DataFrame) -> list[tuple[Any, ...]]:
    return [tuple(str(v) for v in values) for values in frame[ROW_KEY].itertuples(index=False)]


# What names one trial row: its cell, seed, batch and position.
ROW_KEY = ["attack", "attack_params", "defense", "defense_params", "seed", "batch_index",
           "position"]  # fmt: skip


def _run_checkpoints(spec: RunSpec, out: Path, options: dict[str, Any], start: float) -> RunResult:
    """A leakage-over-training run (`leakbench.run.checkpoints`): every checkpoint's run is
    checked before anything is written, then run into ``OUT/checkpoints/<label>``; the joined
    leaderboard and the figure are written beside them."""
    from leakbench.run import checkpoints

    if not options["shard"].whole:
        raise ConfigError("--shard: a checkpoints run is not sharded; shard each checkpoint's")
    dataset = load_dataset(spec.dataset, spec.image_size)
    points = checkpoints.expand(spec, dataset)
    for point in points:
        plan(point.spec, dataset)
        _check_against_model(point.spec, dataset)
    config_text = spec.to_toml()
    results = []
    with hold_run_dir(out, wait=options["wait"], notice=options["notice"]):
        prepare_out_dir(out, config_text, options["extend"], WHOLE)
        write_records(out, WHOLE, config_text)
        for point in points:
            results.append(run_benchmark(point.spec, out / checkpoints.FOLDER / point.label,
                                         **options))  # fmt: skip
        accuracy = [
            checkpoints.model_accuracy(point, dataset, out / checkpoints.FOLDER / point.label)
            for point in points
        ]
        board = checkpoints.joined(points, [r.leaderboard for r in results], accuracy)
        checkpoints.write_table(board, out)
        checkpoints.write_figure(board, out)
    labelled = [r.trials.assign(checkpoint=p.label) for p, r in zip(points, results, strict=True)]
    return RunResult(
        out_dir=out,
        trials=pd.concat(labelled, ignore_index=True),
        utility=pd.concat([r.utility for r in results], ignore_index=True),
        leaderboard=board,
        ran=sum(r.ran for r in results),
        reused=sum(r.reused for r in results),
        trained=sum(r.trained for r in results),
        training_reused=sum(r.training_reused for r in results),
        seconds=time.perf_counter() - start,
    )


def _check_against_model(spec: RunSpec, dataset: Dataset) -> None:
    """Refuses attacks, defenses and a threat model that the run's model cannot take (one
    line each)."""
    # An attack that cannot attack this model is refused now, not after hours of training.
    probe = build_model(spec.model, dataset.input_shape, dataset.num_classes, seed=spec.seeds[0])
    for attack in spec.all_attacks():
        attack.check_model(probe, dataset.input_shape)
    check_model(probe, spec.defense_grid(), spec.batch_size, spec.local)
    if spec.threat_model.bn_statistics_known and not examples_interact(probe):
        raise ConfigError(
            f"threat_model.bn_statistics_known: model {spec.model} has no BatchNorm layer"
        )
