"""``leakbench merge``: shard directories of one config combined into one run directory.

Every stored entry (trial or training) of the shards is copied into the output store, and the
tables are exported from it by the run's own pipeline (`leakbench.run.pipeline`), in plan
order. Shards attack whole groups of the unsharded plan (`leakbench.run.shard`), so the
merged tables equal an unsharded run's. The output is an ordinary unsharded run directory:
``leakbench run`` on it resumes it (it runs what the shards missed), and merging again adds
only what is new.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from leakbench.core.errors import ConfigError
from leakbench.core.files import write_text
from leakbench.datasets import modality_of
from leakbench.run.config import RunSpec, parse_config
from leakbench.run.lock import hold_run_dir
from leakbench.run.pipelines import pipeline_for
from leakbench.run.rundir import (
    check_engine,
    check_engine_on_disk,
    held_config,
    prepare_out_dir,
    same_config,
)
from leakbench.run.shard import SHARD_FILE, Shard, read_record
from leakbench.run.store import Store


@dataclasses.dataclass(frozen=True)
class MergeResult:
    """What a merge wrote and how complete the merged run is."""

    out_dir: Path
    trials: pd.DataFrame
    utility: pd.DataFrame
    leaderboard: pd.DataFrame
    shards: tuple[Shard, ...]
    added: int
    training_added: int
    missing: int
    training_missing: int
    seconds: float
    modality: str = "image"  # the run's (`leakbench.run.pipeline`): what its tables hold


def merge_runs(
    dirs: Sequence[str | Path],
    out_dir: str | Path | None = None,
    *,
    allow_partial: bool = False,
    wait: bool = False,
    notice: Callable[[str], None] | None = None,
) -> MergeResult:
    """Combines the run directories of ``leakbench run --shard`` into ``out_dir``.

    Args:
        dirs: Shard directories of one config (equal ``config.toml``), each shard of one
            ``I/N`` split at most once.
        out_dir: The merged run directory (default ``runs/<name>``); it may already hold a run
            of the same config (an earlier merge, an interrupted run), whose entries are kept.
        allow_partial: Write the tables even when the shards lack some planned trials or
            trainings (the result counts them). Otherwise that is refused before anything is
            written.
        wait, notice: As in `leakbench.run.runner.run_benchmark`: ``out_dir`` is held while merging
            (`leakbench.run.lock.hold_run_dir`).

    Raises:
        ConfigError: On a missing directory, a directory without config or store, differing
            configs, shards of different splits or given twice, an ``out_dir`` that holds
            another config or a shard, or missing work without ``allow_partial``.
    """
    start = time.perf_counter()
    paths = [Path(d) for d in dirs]
    if not paths:
        raise ConfigError("merge needs at least one shard directory")
    text, spec = _common_config(paths)
    shards = _check_shards(paths)
    out = Path(out_dir) if out_dir is not None else Path("runs") / spec.name
    _check_out(out, paths, text)

    planned = _planned(spec)
    trials, trainings = planned.trials, planned.trainings
    with contextlib.ExitStack() as stack:
        stack.enter_context(hold_run_dir(out, wait=wait, notice=notice))
        sources, merged = _open_stores(stack, paths, out)
        readers = sources if merged is None else [*sources, merged]
        missing, training_missing = _missing(readers, trials, trainings)
        if (missing or training_missing) and not allow_partial:
            owners = _owners(
                planned.groups(), trainings, shards[0].count, {*missing, *training_missing}
            )
            raise ConfigError(
                f"merge: {len(missing)} of {len(trials)} trials and {len(training_missing)} of "
                f"{len(trainings)} trainings are missing (from shard {owners}); rerun those "
                "shards (a rerun resumes) or pass --allow-partial to merge what exists"
            )

        prepare_out_dir(out, text, extend=False)
        if merged is None:
            merged = stack.enter_context(contextlib.closing(Store(out / "store.sqlite")))
        added = {"trials": 0, "utility": 0}
        for store in sources:
            for table, count in merged.copy_from(store).items():
                added[table] += count
        write_text(out / "config.toml", text)
        frame, utility, board = planned.export(merged, out)
    return MergeResult(
        out_dir=out,
        trials=frame,
        utility=utility,
        leaderboard=board,
        shards=shards,
        added=added["trials"],
        training_added=added["utility"],
        missing=len(missing),
        training_missing=len(training_missing),
        seconds=time.perf_counter() - start,
        modality=modality_of(spec.dataset),
    )


@dataclasses.dataclass(frozen=True)
class _Planned:
    """The whole plan of a merged run (image or text): its trials and trainings, its groups
    (computed when asked: only a refused merge names the shards that own missing work), and
    its table export."""

    trials: list[Any]
    trainings: list[Any]
    groups: Callable[[], list[list[Any]]]
    export: Callable[[Store, Path], tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]]


def _planned(spec: RunSpec) -> _Planned:
    """The whole plan of ``spec`` by its modality's pipeline (`leakbench.run.pipelines`), its
    groups as the pipeline cuts the whole plan."""
    pipeline = pipeline_for(spec)
    data = pipeline.load()
    trials, trainings = pipeline.plan(data), pipeline.trainings(data)
    return _Planned(
        trials,
        trainings,
        lambda: pipeline.groups(trials),
        lambda store, out: pipeline.export(store, trials, trainings, out, data),
    )


def _open_stores(
    stack: contextlib.ExitStack, paths: list[Path], out: Path
) -> tuple[list[Store], Store | None]:
    """The shards' stores, read-only, and ``out``'s store if it has one (None otherwise), each
    closed with ``stack``; every one must have been written by this engine."""
    sources = [
        stack.enter_context(contextlib.closing(Store(p / "store.sqlite", readonly=True)))
        for p in paths
    ]
    readers = list(sources)
    merged: Store | None = None
    if (out / "store.sqlite").exists():
        check_engine_on_disk(out)
        # Then opened as the run opens it (a read-only connection would leave its -wal and
        # -shm files behind).
        merged = stack.enter_context(contextlib.closing(Store(out / "store.sqlite")))
        readers.append(merged)
    for store, where in zip(readers, [*map(str, paths), f"--out {out}"], strict=False):
        check_engine(store, where)
    return sources, merged


def _missing(
    readers: list[Store], trials: list[Any], trainings: list[Any]
) -> tuple[list[str], list[str]]:
    """The keys of the planned trials and trainings that none of ``readers`` holds."""
    held: dict[str, set[str]] = {"trials": set(), "utility": set()}
    for store in readers:
        for table, keys in held.items():
            keys |= store.keys(table)
    missing = [t.key for t in trials if t.key not in held["trials"]]
    training_missing = [t.key for t in trainings if t.key not in held["utility"]]
    return missing, training_missing


def _common_config(paths: list[Path]) -> tuple[str, RunSpec]:
    """The config text every directory holds (refusing any that is not a run directory or that
    holds another config), and its spec."""
    first: Path | None = None
    text = ""
    for path in paths:
        if not path.is_dir():
            raise ConfigError(
                f"merge: {path} is not a directory; give the --out directories "
                "of `leakbench run --shard`"
            )
        for name in ("config.toml", "store.sqlite"):
            if not (path / name).is_file():
                raise ConfigError(
                    f"merge: {path} has no {name}; give the --out directories of "
                    "`leakbench run --shard` (a shard writes both when it starts)"
                )
        try:
            mine = (path / "config.toml").read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise ConfigError(f"merge: {path / 'config.toml'} cannot be read ({err})") from None
        if first is None:
            first, text = path, mine
        elif mine != text:
            raise ConfigError(
                f"merge: {path / 'config.toml'} differs from {first / 'config.toml'}; merge only "
                "shards of one config"
            )
    assert first is not None
    return text, parse_config(text, source=str(first / "config.toml"))


def _check_shards(paths: list[Path]) -> tuple[Shard, ...]:
    """The shard each directory holds; all of one ``I/N`` split, none twice."""
    shards = tuple(read_record(p) for p in paths)
    seen: dict[Shard, Path] = {}
    for path, shard in zip(paths, shards, strict=True):
        if shard.count != shards[0].count:
            raise ConfigError(
                f"merge: {paths[0]} holds shard {shards[0]} but {path} holds shard {shard}; "
                "merge the shards of one --shard I/N split"
            )
        if shard in seen:
            raise ConfigError(
                f"merge: {seen[shard]} and {path} both hold shard {shard}; give each shard once"
            )
        seen[shard] = path
    return shards


def _check_out(out: Path, paths: list[Path], text: str) -> None:
    """Refuses an output directory that is an input, holds a shard or another config."""
    target = out.resolve()
    for path in paths:
        if path.resolve() == target:
            raise ConfigError(f"--out {out} is one of the merged directories; choose a new one")
    if (out / SHARD_FILE).exists():
        raise ConfigError(f"--out {out} holds shard {read_record(out)}; choose a new directory")
    if not same_config(held_config(out), text):
        raise ConfigError(
            f"--out {out} holds a run with a different config; choose a new directory"
        )


def _owners(groups: list[list[Any]], trainings: list[Any], count: int, keys: set[str]) -> str:
    """The shards (of ``count``) that own any of ``keys`` (trial keys of ``groups``, training
    keys of ``trainings``), as ``"2/4, 3/4"``."""
    owner: dict[str, int] = {}
    for group, index in zip(groups, Shard(1, count).owners(len(groups)), strict=True):
        owner.update((t.key, index) for t in group)
    for job, index in zip(trainings, Shard(1, count).owners(len(trainings)), strict=True):
        owner[job.key] = index
    return ", ".join(f"{i}/{count}" for i in sorted({owner[k] for k in keys}))
