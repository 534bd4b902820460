"""The benchmark runner: plan, execute, and write the run directory.

`run_benchmark` joins the three parts of a run, each behind one seam:

* the plan: every trial and training of the config (`leakbench.run.plan`), their keys and the
  attack groups, a pure function of the config and the data, made by the run's modality's
  pipeline (`leakbench.run.pipeline`, `leakbench.run.pipelines.pipeline_for`);
* execution: a `Backend` (local, local worker processes, or Ray) runs the units still to do,
  each by the pipeline's hooks;
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

from leakbench.core.errors import ConfigError
from leakbench.datasets import load_dataset
from leakbench.run.backends import make_backend
from leakbench.run.config import RunSpec
from leakbench.run.lock import hold_run_dir
from leakbench.run.pipeline import Pipeline, Work
from leakbench.run.pipelines import check_against_model, pipeline_for
from leakbench.run.plan import Training, Trial, plan
from leakbench.run.rundir import check_engine_on_disk, prepare_out_dir, write_records
from leakbench.run.shard import WHOLE, Shard
from leakbench.run.store import Store


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
    if spec.threat_model.checkpoints:
        return _run_checkpoints(spec, out, options, start)
    # Checked first: a missing extra or an unreachable cluster must not cost a dataset load.
    executor = make_backend(backend, address, workers)
    pipeline = pipeline_for(spec)
    data = pipeline.load()
    trials = pipeline.plan(data)
    # The groups are cut from the whole plan before sharding, so each shard attacks exactly
    # the groups an unsharded run would.
    first, *later = pipeline.stages(trials, shard.whole)
    groups = shard.take(pipeline.groups(first))
    pipeline.check(data, trials)
    trainings = pipeline.trainings(data)
    config_text = spec.to_toml()
    labels = stage_labels([first, *later])
    # A cluster is joined on entering: one that refuses us leaves nothing written.
    with executor, hold_run_dir(out, wait=wait, notice=notice):
        prepare_out_dir(out, config_text, extend, shard)
        check_engine_on_disk(out)
        if progress:  # once nothing can refuse the run
            tell_plan(notice, spec.name, out, trials, len(trainings) * utility, labels, spec.images)
        store = Store(out / "store.sqlite")
        try:
            write_records(out, shard, config_text)
            mine, train_todo, done, todo = _pending(store, shard, trainings, groups, utility)
            work = Work(pipeline, data, train_todo, groups, done, labels[0])
            executor.run(work, store, progress)
            state = (first, later, groups, todo, done, labels[1:])
            groups, todo = _later_stages(pipeline, data, executor, store, out, progress, state)
            audit = pipeline.audit(data, trials, out, progress) if shard.whole else None
            frame, table, board = pipeline.export(store, trials, trainings, out, data, audit)
        finally:
            store.close()
    return RunResult(
        out_dir=out,
        trials=frame,
        utility=table,
        leaderboard=board,
        ran=len(todo),
        reused=sum(len(group) for group in groups) - len(todo),
        trained=len(train_todo),
        training_reused=len(mine) - len(train_todo),
        seconds=time.perf_counter() - start,
    )


def stage_labels(stages: list[list[Trial]]) -> list[str]:
    """How the progress bars name each stage of a run (`leakbench.run.stages`): ``"stage 2/4
    (dlg)"`` by the attack family it runs, the first ``"stage 1/4 (none)"``; nothing for a run
    of one stage."""
    if len(stages) == 1:
        return [""]
    names = ["none"] + [stage[0].attack.name for stage in stages[1:]]  # `stages.split`: none empty
    return [f"stage {i}/{len(stages)} ({name})" for i, name in enumerate(names, 1)]


def tell_plan(
    notice: Callable[[str], None] | None,
    name: str,
    out: Path,
    trials: list[Trial],
    trainings: int,
    labels: list[str],
    examples: int,
) -> None:
    """Gives ``notice`` (if any) the `plan_lines` of the run (``examples``: its private
    examples per seed; the seeds and defense configurations are its ``trials``')."""
    if notice is None:
        return
    scope = (examples, len({t.seed for t in trials}), len({repr(t.defense) for t in trials}))
    for line in plan_lines(name, out, len(trials), trainings, labels, scope):
        notice(line)


def plan_lines(
    name: str,
    out: Path,
    trials: int,
    trainings: int,
    labels: list[str],
    scope: tuple[int, int, int],
) -> list[str]:
    """The lines a run prints before it starts: where it writes, what it attacks (``scope``:
    the private examples per seed, the seeds, each with its own model and examples, and the
    defense configurations, ``none`` included) and what it plans (a stage after the first runs
    only where the earlier ones leave an example open, so "at most")."""
    stages = "in one stage" if len(labels) == 1 else f"in {len(labels)} stages"
    examples, seeds, configurations = scope
    per_seed = f" on each of {seeds} seeds" if seeds > 1 else ""
    return [
        f"run {name} into {out}",
        f"{examples:,} private examples{per_seed} under {configurations} defense configurations",
        f"{trainings} utility trainings, then at most {trials:,} attack trials {stages}; "
        "a rerun resumes",
    ]


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


def _later_stages(
    pipeline: Pipeline,
    data: Any,
    executor: Any,
    store: Store,
    out: Path,
    progress: bool,
    state: tuple[
        list[Trial], list[list[Trial]], list[list[Trial]], list[Trial], set[str], list[str]
    ],
) -> tuple[list[list[Trial]], list[Trial]]:
    """Runs the stages after the first (`Pipeline.stages`), each chosen by `Pipeline.gate`
    from the stored rows of the ones before it and named by its label (the state's last
    part). Returns every group run and every trial run now."""
    ran, later, groups, todo, done, labels = state
    for stage, label in zip(later, labels, strict=True):
        chosen = pipeline.gate(data, ran, stage, store, out)
        more = pipeline.groups(chosen)
        todo = todo + [t for group in more for t in group if t.key not in done]
        executor.run(Work(pipeline, data, [], more, done, label), store, progress)
        groups, ran = groups + more, ran + chosen
    return groups, todo


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
        child = point.spec
        plan(child, dataset)
        check_against_model(
            dataset, child.model, seed=child.seeds[0], attacks=child.all_attacks(),
            defenses=child.defense_grid(), threat=child.threat_model, batch_size=child.batch_size,
        )  # fmt: skip
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
