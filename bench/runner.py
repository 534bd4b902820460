"""The benchmark runner: expands a `RunSpec` into trials, attacks each, and writes the tables.

A trial is one (seed, batch of private examples, defense configuration, attack configuration).
For each seed the private examples are a seeded draw from the dataset's test split and the model
weights come from the same seed, so every cell of a run attacks the same images under the same
weights (paired comparisons). The defense draw depends on (seed, batch) only, and all attacks of
a defense configuration see the same observed gradient.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import tensorflow as tf
from tqdm.auto import tqdm

from leakbench.arrays import cell_id, encode_trial, export_arrays
from leakbench.attacks import Attack, AttackTarget, Reconstruction
from leakbench.config import RunSpec, canonical_json
from leakbench.datasets import Dataset, load_dataset
from leakbench.datasets.base import Split
from leakbench.defenses import Defense
from leakbench.defenses.base import defended_gradients
from leakbench.environment import ENVIRONMENT_FILE, describe_environment
from leakbench.errors import ConfigError
from leakbench.metrics import score_batch
from leakbench.models import build_model
from leakbench.shard import SHARD_FILE, WHOLE, Shard, read_record, write_record
from leakbench.store import Store, trial_key
from leakbench.tables import (
    LEADERBOARD_COLUMNS,
    TRIAL_COLUMNS,
    UTILITY_COLUMNS,
    leaderboard,
    write_csv,
    write_text,
)
from leakbench.training import TrainingConfig, train_steps, train_under_defense


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


@dataclasses.dataclass(frozen=True)
class _Trial:
    seed: int
    batch_index: int
    indices: tuple[int, ...]
    defense: Defense
    attack: Attack
    key: str


def private_split(spec: RunSpec, dataset: Dataset) -> Split:
    """The split the private examples come from (the threat model's ``private_split``)."""
    return dataset.train if spec.threat_model.private_split == "train" else dataset.test


def private_indices(split: Split, images: int, seed: int) -> np.ndarray:
    """The indices of ``split`` attacked under ``seed``: a prefix of a seeded permutation, so a
    run with more images extends a smaller one instead of drawing new ones."""
    return np.random.default_rng(seed).permutation(len(split))[:images]


def plan(spec: RunSpec, dataset: Dataset) -> list[_Trial]:
    """Every trial of the run in execution order (seed, batch, defense, attack)."""
    split = private_split(spec, dataset)
    if spec.images > len(split):
        raise ConfigError(
            f"images must be at most the size of {spec.dataset}'s "
            f"{spec.threat_model.private_split} split ({len(split)}), got {spec.images}"
        )
    attacks, defenses = spec.attack_grid(), spec.defense_grid()
    threat = spec.threat_model.changes()
    trials = []
    for seed in spec.seeds:
        order = private_indices(split, spec.images, seed)
        for b in range(spec.images // spec.batch_size):
            indices = tuple(int(i) for i in order[b * spec.batch_size : (b + 1) * spec.batch_size])
            for defense in defenses:
                for attack in attacks:
                    key = trial_key(
                        {
                            **({"threat_model": threat} if threat else {}),
                            "dataset": spec.dataset,
                            "image_size": spec.image_size,
                            "model": spec.model,
                            "attack": attack.name,
                            "attack_params": attack.params(),
                            "defense": defense.name,
                            "defense_params": defense.params(),
                            "seed": seed,
                            "indices": indices,
                        }
                    )
                    trials.append(_Trial(seed, b, indices, defense, attack, key))
    return trials


@dataclasses.dataclass(frozen=True)
class _Training:
    seed: int
    defense: Defense
    key: str


def plan_training(spec: RunSpec) -> list[_Training]:
    """One utility training per (seed, defense configuration), shared by all its attacks."""
    if spec.training is None:
        return []
    return [
        _Training(
            seed,
            defense,
            trial_key(
                {
                    "kind": "utility",
                    "dataset": spec.dataset,
                    "image_size": spec.image_size,
                    "model": spec.model,
                    "defense": defense.name,
                    "defense_params": defense.params(),
                    "seed": seed,
                    "training": dataclasses.asdict(spec.training),
                }
            ),
        )
        for seed in spec.seeds
        for defense in spec.defense_grid()
    ]


def run_benchmark(
    spec: RunSpec,
    out_dir: str | Path,
    *,
    extend: bool = False,
    progress: bool = True,
    shard: Shard = WHOLE,
    backend: str = "local",
    address: str | None = None,
) -> RunResult:
    """Runs (or resumes) a benchmark and writes ``config.toml``, ``trials.csv``,
    ``leaderboard.csv`` and ``store.sqlite`` into ``out_dir``.

    With ``shard`` ``i/n`` only that share of the attack groups and trainings runs (see
    `leakbench.shard`); ``out_dir`` records the shard and its tables hold what its store holds.
    ``backend`` is where the trainings and attack groups run: ``"local"`` in this process, or
    ``"ray"`` on Ray actors (`leakbench.ray_backend`; a private local Ray instance, or the
    cluster at ``address``), with the same groups and so the same tables. Everything a user
    can get wrong (names, parameters, data, a different config or shard already in
    ``out_dir``, a backend that cannot be used) is checked before anything is written.
    """
    start = time.perf_counter()
    out = Path(out_dir)
    # Checked first: a missing extra or an unreachable cluster must not cost a dataset load.
    cluster = _backend(backend, address)
    dataset = load_dataset(spec.dataset, spec.image_size)
    trials = plan(spec, dataset)
    # The groups are cut from the whole plan before sharding, so each shard attacks exactly
    # the groups an unsharded run would.
    groups = shard.take(attack_groups(trials, spec.parallel_trials))
    # An attack that cannot attack this model is refused now, not after hours of training.
    probe = build_model(spec.model, dataset.input_shape, dataset.num_classes, seed=spec.seeds[0])
    for attack in spec.attack_grid():
        attack.check_model(probe, dataset.input_shape)
    trainings = plan_training(spec)
    if spec.training is not None:
        spec.training.check_fits(len(dataset.train), f"{spec.dataset}'s training split")
    config_text = spec.to_toml()
    # With --address the cluster is joined first: one that refuses us leaves nothing written.
    with cluster if cluster is not None else contextlib.nullcontext():
        prepare_out_dir(out, config_text, extend, shard)
        store = Store(out / "store.sqlite")
        try:
            # The record goes first: a directory with a config but no record is an unsharded run.
            write_record(out, shard)
            write_text(out / "config.toml", config_text)
            # The environment of the latest invocation (a resumed run may change machines).
            write_text(out / ENVIRONMENT_FILE, json.dumps(describe_environment(), indent=2) + "\n")
            done = store.keys("utility")
            mine = shard.take(trainings)
            train_todo = [t for t in mine if t.key not in done]
            done = store.keys()
            todo = [t for group in groups for t in group if t.key not in done]
            if cluster is None:
                _train(spec, dataset, train_todo, store, progress)
                _execute(spec, dataset, groups, done, store, progress)
            else:
                cluster.run(spec, train_todo, groups, done, store, progress)
            frame, utility, board = export_tables(spec, store, trials, trainings, out)
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


BACKENDS = ("local", "ray")


def _backend(name: str, address: str | None) -> Any:
    """The `leakbench.ray_backend.RayCluster` that runs the work, or None for this process.

    Refuses what a user can get wrong (an unknown backend, ``address`` without Ray, Ray not
    installed, nothing answering at ``address``) before anything is loaded or written.
    """
    if name not in BACKENDS:
        raise ConfigError(f"--backend must be one of {', '.join(BACKENDS)}, got {name!r}")
    if name == "local":
        if address is not None:
            raise ConfigError("--address needs --backend ray (the local backend runs in-process)")
        return None
    # Imported here: the local backend and `import leakbench` never need the ray extra.
    from leakbench.ray_backend import RayCluster

    return RayCluster(address)


def export_tables(
    spec: RunSpec,
    store: Store,
    trials: list[_Trial],
    trainings: list[_Training],
    out: Path,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Writes ``trials.csv``, ``utility.csv`` and ``leaderboard.csv`` into ``out`` from the
    stored rows of the planned ``trials`` and ``trainings``, in plan order.

    Planned work the store lacks is left out, so the tables of a shard or of an interrupted
    run hold what it has, and a merged run's tables equal an unsharded run's.

    Returns:
        The trials, utility and leaderboard tables as written.
    """
    rows = store.rows([t.key for t in trials])
    utility_rows = store.rows([t.key for t in trainings], "utility")
    frame = pd.DataFrame(rows, columns=TRIAL_COLUMNS)
    utility = pd.DataFrame(utility_rows, columns=UTILITY_COLUMNS)
    board = leaderboard(frame, spec.success_mse, utility, spec.max_accuracy_drop)
    write_csv(frame, out / "trials.csv", TRIAL_COLUMNS)
    write_csv(utility, out / "utility.csv", UTILITY_COLUMNS)
    write_csv(board, out / "leaderboard.csv", LEADERBOARD_COLUMNS)
    stored = store.arrays([t.key for t in trials])
    blobs = {
        (t.seed, t.batch_index, _cell_of(spec, t)): stored[t.key] for t in trials if t.key in stored
    }
    export_arrays(frame, blobs, out)
    return frame, utility, board


def _cell_of(spec: RunSpec, trial: _Trial) -> str:
    """The `cell_id` of a planned trial's leaderboard cell."""
    return cell_id(
        {
            "dataset": spec.dataset,
            "model": spec.model,
            "attack": trial.attack.name,
            "attack_params": canonical_json(trial.attack.params()),
            "defense": trial.defense.name,
            "defense_params": canonical_json(trial.defense.params()),
        }
    )


def held_config(out: Path) -> str | None:
    """The text of the ``config.toml`` that ``out`` holds, or None if it holds none."""
    existing = out / "config.toml"
    if not existing.exists():
        return None
    try:
        return existing.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise ConfigError(f"--out {out}: cannot read config.toml: {err.strerror}") from None


def prepare_out_dir(out: Path, config_text: str, extend: bool, shard: Shard = WHOLE) -> None:
    """Refuses an ``out`` that holds a different config (unless ``extend``) or another shard,
    or that cannot be written; creates it otherwise."""
    existing = out / "config.toml"
    if not extend and held_config(out) not in (None, config_text):
        raise ConfigError(
            f"--out {out} holds a run with a different config; choose another directory, "
            "or pass --extend to add this config's trials to it"
        )
    if existing.exists() or (out / SHARD_FILE).exists():
        held = read_record(out)
        if held != shard:
            # Mixing shards in one store would make its tables neither shard's; merge does that
            # on purpose, into a directory of its own.
            what = "an unsharded run" if held.whole else f"shard {held}"
            asked = "without --shard" if shard.whole else f"with --shard {shard}"
            raise ConfigError(
                f"--out {out} holds {what}; rerun it with the same --shard, run {asked} into "
                "another directory, or combine shard directories with `leakbench merge`"
            )
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"--out {out} is not a writable directory: {err.strerror}") from None


def _train(
    spec: RunSpec, dataset: Dataset, todo: list[_Training], store: Store, progress: bool
) -> None:
    """Trains the model once per (seed, defense) and stores the utility rows."""
    if not todo or spec.training is None:
        return
    bar = tqdm(total=len(todo), desc=f"{spec.name} training", unit="model", disable=not progress)
    try:
        for job in todo:
            store.add(job.key, train_one(spec, dataset, job), "utility")
            bar.update(1)
    finally:
        bar.close()


def train_one(spec: RunSpec, dataset: Dataset, job: _Training) -> list[dict[str, Any]]:
    """The utility row (a one-row list, as stored) of one planned training."""
    config = spec.training
    if config is None:
        raise ValueError("train_one needs a spec with training enabled")
    # The same initial weights the attacks see under this seed.
    model = build_model(spec.model, dataset.input_shape, dataset.num_classes, job.seed)
    report = train_under_defense(
        model,
        job.defense,
        config,
        (dataset.train.x, dataset.train.y),
        (dataset.test.x, dataset.test.y),
        num_classes=dataset.num_classes,
        seed=job.seed,
    )
    return [
        {
            **_identity(spec, job.defense, job.seed),
            **{k: getattr(config, k) for k in ("epochs", "batch_size", "optimizer")},
            "learning_rate": config.learning_rate,
            **dataclasses.asdict(report),
        }
    ]


def attack_groups(trials: list[_Trial], width: int) -> list[list[_Trial]]:
    """The planned trials cut into the groups that are attacked together.

    Trials of one seed (one model) and one attack configuration form a run of consecutive
    (batch, defense) cells, cut into pieces of ``width``. The groups come from the whole plan,
    not from what is left to do, and each group is stored in one transaction, so a resumed run
    attacks exactly the groups of an uninterrupted one. That matters because batched arithmetic
    can differ from one-at-a-time arithmetic in the last bits: equal groups give equal numbers.

    Groups are ordered seed by seed, and within a seed piece by piece with every attack
    configuration's piece next to the others: they cover the same cells, so each cell's
    observed gradient is computed once and reused.
    """
    runs: dict[tuple[int, str], list[_Trial]] = {}
    for trial in trials:
        attack_text = canonical_json([trial.attack.name, trial.attack.params()])
        runs.setdefault((trial.seed, attack_text), []).append(trial)
    pieces: dict[tuple[int, int], list[list[_Trial]]] = {}
    for (seed, _), members in runs.items():
        for k in range(0, len(members), width):
            pieces.setdefault((seed, k), []).append(members[k : k + width])
    return [group for key in sorted(pieces) for group in pieces[key]]


def _execute(
    spec: RunSpec,
    dataset: Dataset,
    groups: list[list[_Trial]],
    done: set[str],
    store: Store,
    progress: bool,
) -> None:
    """Attacks ``groups`` (cut by `attack_groups`) and stores each group in one transaction."""
    groups = pending_groups(groups, done)
    if not groups:
        return
    cache = GroupCache()
    total = sum(t.key not in done for g in groups for t in g)
    bar = tqdm(total=total, desc=f"{spec.name} trials", unit="trial", disable=not progress)
    try:
        for group in groups:
            items, arrays = attack_group(spec, dataset, group, cache, skip=done)
            store.add_many(items, arrays=arrays)
            bar.update(len(items))
    finally:
        bar.close()


def pending_groups(groups: list[list[_Trial]], done: set[str]) -> list[list[_Trial]]:
    """The groups with any trial not in ``done``.

    Such a group is attacked whole (the same arithmetic as when it first ran) and only its
    missing trials are stored.
    """
    return [group for group in groups if any(t.key not in done for t in group)]


# What `attack_group` returns: the (key, rows) of each stored trial, and each one's arrays blob.
GroupResult = tuple[list[tuple[str, list[dict[str, Any]]]], dict[str, bytes]]


@dataclasses.dataclass
class GroupCache:
    """What one process keeps between calls of `attack_group`, so that consecutive groups load
    nothing twice: the attacked model of the latest seed, its observed-gradient functions (one
    per defense configuration) and the observed gradients of the latest group's cells.

    Only values that do not depend on the order of calls are kept (every entry is a pure
    function of the seed, the cell and the config), so a process that attacks any subset of the
    groups, in any order, computes the numbers a local run computes.
    """

    seed: int | None = None
    model: Any = None
    observers: dict[str, Any] = dataclasses.field(default_factory=dict)
    observed: dict[tuple[int, int, str], tuple[tf.Tensor, ...]] = dataclasses.field(
        default_factory=dict
    )

    def model_for(self, spec: RunSpec, dataset: Dataset, seed: int) -> Any:
        """The attacked model of ``seed``; a new seed drops everything kept for the last one
        (the local order runs groups seed by seed, so one model is enough)."""
        if seed != self.seed:
            self.seed, self.model = None, None
            self.observers.clear()
            self.observed.clear()
            self.model = attacked_model(spec, dataset, seed)
            self.seed = seed
        return self.model


def attack_group(
    spec: RunSpec,
    dataset: Dataset,
    group: list[_Trial],
    cache: GroupCache,
    *,
    skip: Collection[str] = frozenset(),
) -> GroupResult:
    """Attacks one group of `attack_groups` (one seed, one attack configuration) together.

    Both backends call this: the local one in its own process, the Ray actors in theirs. The
    whole group is always attacked (batched arithmetic depends on the group's composition);
    the trials whose keys are in ``skip`` (already stored) are left out of the result.

    Returns:
        The ``(key, rows)`` of each trial to store, in the group's order, and the arrays blob
        of each (`leakbench.arrays.encode_trial`), for one `Store.add_many` call.
    """
    seed = group[0].seed
    shape, classes = dataset.input_shape, dataset.num_classes
    split = private_split(spec, dataset)
    model = cache.model_for(spec, dataset, seed)
    cells = [(seed, t.batch_index, _defense_text(t.defense)) for t in group]
    for cell in [c for c in cache.observed if c not in cells]:
        del cache.observed[cell]  # consecutive groups share cells; keep only this group's
    targets = []
    private = [(split.x[list(t.indices)], split.y[list(t.indices)]) for t in group]
    for trial, cell, (x, y) in zip(group, cells, private, strict=True):
        if cell not in cache.observed:
            if cell[2] not in cache.observers:
                cache.observers[cell[2]] = _observer(trial.defense, model)
            grads = cache.observers[cell[2]](
                tf.constant(x),
                tf.one_hot(y, classes),
                tf.constant([seed, trial.batch_index], tf.int64),
            )
            cache.observed[cell] = tuple(grads)
        targets.append(
            AttackTarget(
                model=model,
                gradients=cache.observed[cell],
                input_shape=shape,
                batch_size=spec.batch_size,
                num_classes=classes,
                labels=y if spec.threat_model.labels_known else None,
            )
        )
    recs = group[0].attack.attack_many(
        targets,
        [t.seed * 1_000_003 + t.batch_index for t in group],
        width=spec.parallel_trials,
    )
    items, arrays = [], {}
    for trial, rec, (x, y) in zip(group, recs, private, strict=True):
        if trial.key in skip:
            continue
        rows, matched = _rows(spec, trial, y, x, rec)
        items.append((trial.key, rows))
        arrays[trial.key] = encode_trial(x, matched, rec.loss_history)
    return items, arrays


def attacked_model(spec: RunSpec, dataset: Dataset, seed: int) -> Any:
    """The model the server holds when the attacked gradient is sent: the seeded
    initialisation, trained for the threat model's ``train_steps`` without a defense first."""
    model = build_model(spec.model, dataset.input_shape, dataset.num_classes, seed=seed)
    steps = spec.threat_model.train_steps
    if steps:
        train_steps(
            model,
            steps,
            spec.training or TrainingConfig(),
            (dataset.train.x, dataset.train.y),
            num_classes=dataset.num_classes,
            seed=seed,
        )
    return model


def _defense_text(defense: Defense) -> str:
    return canonical_json([defense.name, defense.params()])


def _observer(defense: Defense, model: Any) -> Any:
    """The observed gradient of a batch under ``defense``: the same code path the trainer uses,
    with the draw keyed by (seed, batch) only. One ``tf.function`` per defense configuration
    and model, traced once for the run's batch shape (an eager call would rebuild the
    per-example vectorisation of example-level defenses for every batch)."""
    return tf.function(lambda x, y, seed: defended_gradients(defense, model, x, y, seed))


def _identity(spec: RunSpec, defense: Defense, seed: int) -> dict[str, Any]:
    """The columns that identify a row of either table (trials or utility)."""
    return {
        "run": spec.name,
        "dataset": spec.dataset,
        "model": spec.model,
        "defense": defense.name,
        "defense_params": canonical_json(defense.params()),
        "seed": seed,
    }


def _rows(
    spec: RunSpec, trial: _Trial, y: np.ndarray, x: np.ndarray, rec: Reconstruction
) -> tuple[list[dict[str, Any]], np.ndarray]:
    """The trial's rows (one per image) and its reconstructions matched to ``x``'s order."""
    scores = score_batch(x, y, rec.images, rec.labels)
    predicted = rec.labels[scores.order]
    common = {
        **_identity(spec, trial.defense, trial.seed),
        "attack": trial.attack.name,
        "attack_params": canonical_json(trial.attack.params()),
        "batch_index": trial.batch_index,
        "batch_size": spec.batch_size,
        "label_acc": scores.label_acc,
        "status": rec.status,
        "loss": rec.loss,
        "iterations": len(rec.loss_history),
        "evaluations": rec.evaluations,
        "attempts": rec.attempts,
        "seconds": rec.seconds,
    }
    rows = [
        {
            **common,
            "position": pos,
            "image_index": trial.indices[pos],
            "label": int(y[pos]),
            "predicted_label": int(predicted[pos]),
            "mse": float(scores.mse[pos]),
            "psnr": float(scores.psnr[pos]),
            "ssim": float(scores.ssim[pos]),
        }
        for pos in range(len(trial.indices))
    ]
    return rows, np.asarray(rec.images)[scores.order]
