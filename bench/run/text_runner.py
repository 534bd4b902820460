"""A text run (`leakbench.run.text_checks`): plan, execute, store, tables and report.

It joins the text parts as `leakbench.run.runner` joins the image ones, through the same run
directory: the checks before anything is written (`prepare_out_dir`, `check_engine_on_disk`,
the lock), the same store (one transaction per group, so an interrupted run resumes where it
stopped and redoes at most the group in flight), the epsilon audit where the config asks for
one (`leakbench.run.text_audit`, resumable too), then trials.csv, utility.csv, leaderboard.csv
and report.html. Everything a user can get wrong (the corpus file, the
vocabulary, the model and its input length, an attack that cannot attack the model) is refused
before the directory is touched.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm.auto import tqdm

from leakbench.core.errors import ConfigError
from leakbench.datasets.text_base import load_text_corpus
from leakbench.modalities.text import next_token_loss
from leakbench.outputs.tables import write_csv
from leakbench.outputs.text_page import write_text_report
from leakbench.outputs.text_tables import (
    TEXT_TRIAL_COLUMNS,
    TEXT_UTILITY_COLUMNS,
    text_leaderboard,
)
from leakbench.run.config import RunSpec
from leakbench.run.lock import hold_run_dir
from leakbench.run.rundir import check_engine_on_disk, prepare_out_dir, write_records
from leakbench.run.shard import WHOLE, Shard
from leakbench.run.store import Store
from leakbench.run.text_audit import (
    check_text_audit,
    run_text_epsilon_audit,
    text_leaderboard_columns,
    with_text_audit,
)
from leakbench.run.text_execute import TextContext, run_text_group, run_text_training
from leakbench.run.text_plan import (
    TextTraining,
    TextTrial,
    plan_text,
    plan_text_training,
    text_groups,
)


def run_text_benchmark(
    spec: RunSpec,
    out: Path,
    *,
    extend: bool = False,
    progress: bool = True,
    shard: Shard = WHOLE,
    backend: str = "local",
    address: str | None = None,
    workers: int | str = 1,
    wait: bool = False,
    notice: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Runs (or resumes) the text run ``spec`` into ``out``; returns the `RunResult` fields.
    The options are `leakbench.run.runner.run_benchmark`'s. ``shard`` ``i/n`` runs that share of
    the groups (one private batch each, `text_groups` of the whole plan) and of the trainings,
    as an image run's (`leakbench.run.shard`); `leakbench.run.merge` joins the shards. A text
    run runs in this process (``workers`` 1 or ``"auto"``, the local backend) and refuses the
    others in one line."""
    start = time.perf_counter()
    if backend != "local" or address is not None or workers not in (1, "auto"):
        raise ConfigError(
            "--backend and --workers: a text run runs in this process (split a bigger one with "
            "--shard I/N and `leakbench merge`)"
        )
    context = TextContext.of(spec, load_text_corpus(spec.dataset))
    trials = plan_text(spec, len(context.private_ids))
    trainings = plan_text_training(spec)
    # The groups are cut from the whole plan, so each shard runs the groups a whole run would.
    mine = [t for group in shard.take(text_groups(trials)) for t in group]
    my_trainings = shard.take(trainings)
    _check_model(spec, context, trials)
    check_text_audit(spec, len(context.private_ids))
    config_text = spec.to_toml()
    with hold_run_dir(out, wait=wait, notice=notice):
        prepare_out_dir(out, config_text, extend, shard)
        check_engine_on_disk(out)
        store = Store(out / "store.sqlite")
        try:
            write_records(out, shard, config_text)
            counts = _execute(spec, context, store, mine, my_trainings, progress)
            audit = None
            if spec.epsilon_audit is not None and shard.whole:  # `leakbench.run.text_audit`
                audit = run_text_epsilon_audit(spec, context, out, progress=progress)
            frame, utility, board = export_text_tables(spec, store, mine, my_trainings, out, audit)
        finally:
            store.close()
    return {
        "out_dir": out,
        "trials": frame,
        "utility": utility,
        "leaderboard": board,
        **counts,
        "seconds": time.perf_counter() - start,
    }


def plan_text_run(spec: RunSpec) -> tuple[list[TextTrial], list[TextTraining]]:
    """The whole plan of the text run ``spec``: its trials and utility trainings."""
    corpus = load_text_corpus(spec.dataset)
    return plan_text(spec, len(corpus.private)), plan_text_training(spec)


def export_text_tables(
    spec: RunSpec,
    store: Store,
    trials: list[TextTrial],
    trainings: list[TextTraining],
    out: Path,
    audit: pd.DataFrame | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Writes trials.csv, utility.csv, leaderboard.csv and report.html into ``out`` from the
    stored rows of ``trials`` and ``trainings``, in plan order (what the store lacks is left
    out: a shard's tables hold its share, a merged run's the whole), the leaderboard joined
    with the epsilon audit's rows ``audit`` if given; returns the three tables."""
    frame = pd.DataFrame(store.rows([t.key for t in trials]), columns=TEXT_TRIAL_COLUMNS)
    utility = pd.DataFrame(
        store.rows([t.key for t in trainings], "utility"), columns=TEXT_UTILITY_COLUMNS
    )
    board = text_leaderboard(frame, utility, spec.protocol)
    if audit is not None:
        board = with_text_audit(board, audit)
    write_csv(frame, out / "trials.csv", TEXT_TRIAL_COLUMNS)
    write_csv(utility, out / "utility.csv", TEXT_UTILITY_COLUMNS)
    write_csv(board, out / "leaderboard.csv", text_leaderboard_columns(audit is not None))
    write_text_report(out, frame, board)
    return frame, utility, board


def _check_model(spec: RunSpec, context: TextContext, trials: list[TextTrial]) -> None:
    """Refuses a model that cannot read the run's sequences, and attacks that cannot attack it
    (one line each), before anything is written."""
    assert spec.text is not None
    probe = context.model(spec.seeds[0])
    next_token_loss(probe, context.private_ids[:1])  # checks the input length
    seen = set()
    for trial in trials:
        if trial.attack not in seen:
            seen.add(trial.attack)
            try:
                trial.attack.check_model(probe)
            except ConfigError as error:
                if spec.suite != "standard":
                    raise
                # The standard suite adds every family; a model that one cannot attack runs
                # only with the attacks it lists.
                raise ConfigError(
                    f'{error}; the standard suite runs every text family: set suite = "listed" '
                    "and list the attacks this model can take"
                ) from None


def _execute(
    spec: RunSpec,
    context: TextContext,
    store: Store,
    trials: list[TextTrial],
    trainings: list[Any],
    progress: bool,
) -> dict[str, int]:
    """Runs the trainings and groups the store lacks, each stored as it finishes."""
    done = store.keys()
    groups = [g for g in text_groups(trials) if any(t.key not in done for t in g)]
    todo = sum(t.key not in done for g in groups for t in g)
    with tqdm(total=todo, desc=f"{spec.name} trials", unit="trial", disable=not progress) as bar:
        for group in groups:
            items = [item for item in run_text_group(context, group) if item[0] not in done]
            store.add_many(items)
            bar.update(len(items))
    held = store.keys("utility")
    train_todo = [t for t in trainings if t.key not in held]
    with tqdm(
        total=len(train_todo), desc=f"{spec.name} training", unit="model", disable=not progress
    ) as bar:
        for job in train_todo:
            store.add(job.key, run_text_training(context, job), "utility")
            bar.update(1)
    return {
        "ran": todo,
        "reused": len(trials) - todo,
        "trained": len(train_todo),
        "training_reused": len(trainings) - len(train_todo),
    }
