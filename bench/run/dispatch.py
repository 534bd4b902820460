"""Units of work for worker processes, and the order in which idle workers take them.

Shared by the backends whose workers are other processes (`leakbench.run.workers`, local processes,
and `leakbench.integrations.ray_backend`, Ray actors). A worker receives picklable text, never a
Keras model or a TensorFlow object: the resolved config (``spec.to_toml()``, parsed again by the
worker) and the keys of the planned work, which the worker looks up in its own plan (`WorkerState`).
A worker keeps the attacked model of one seed, with its observed gradients, in a
`leakbench.run.execute.GroupCache`, so `Scheduler` hands it units of that seed while there are any.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from leakbench.core.canonical import canonical_json
from leakbench.core.errors import ConfigError
from leakbench.run.config import parse_config
from leakbench.run.pipeline import GroupResult, Pipeline, trials_label
from leakbench.run.pipelines import pipeline_for
from leakbench.run.plan import Training, Trial
from leakbench.run.store import Store

# A backend's loop: runs ``units`` on its workers, passes each result to ``on_result`` as it
# arrives, updates and closes ``bar``.
Driver = Callable[[list["Unit"], Callable[["Unit", Any], None], Any], None]


@dataclasses.dataclass(frozen=True)
class Unit:
    """One unit of work for a worker: a training or an attack group."""

    method: str  # the `WorkerState` method: "train" or "attack"
    args: tuple[Any, ...]
    seed: int | None  # workers keep the model of one seed: groups go seed-first
    count: int  # progress units (trials, or one model)
    label: str
    # The compiled program the unit runs (its attack configuration; "" for a training): a
    # worker that compiled it takes its next unit of the same program first.
    program: str = ""


def training_units(trainings: list[Training]) -> list[Unit]:
    """One unit per planned training still to do."""
    return [
        Unit(
            "train",
            (t.key,),
            None,
            1,
            f"the training of seed {t.seed} (replicate {t.replicate}), {t.defense.name}",
        )
        for t in trainings
    ]


def attack_units(groups: list[list[Trial]], done: Collection[str]) -> list[Unit]:
    """One unit per attack group; a group is attacked whole, its stored trials left out of the
    result."""
    return [
        Unit(
            "attack",
            (tuple(t.key for t in group), tuple(t.key for t in group if t.key in done)),
            group[0].seed,
            sum(t.key not in done for t in group),
            f"the {group[0].attack.name} group of seed {group[0].seed} from batch "
            f"{group[0].batch_index}",
            canonical_json([group[0].attack.name, group[0].attack.params()]),
        )
        for group in groups
    ]


def run_units(
    name: str,
    trainings: list[Unit],
    groups: list[Unit],
    store: Store,
    progress: bool,
    drive: Driver,
    *,
    stage: str = "",
) -> None:
    """Runs the trainings, then the attack groups, through the backend's ``drive``, committing
    each result to ``store`` as it arrives, with one progress bar per phase (run ``name``, the
    trials' bar also the ``stage``, `leakbench.run.pipeline.Work.stage`)."""

    def store_training(unit: Unit, rows: Any) -> None:
        store.add(unit.args[0], rows, "utility")

    def store_group(unit: Unit, result: Any) -> None:
        items, arrays = result
        store.add_many(items, arrays=arrays)

    phases = (
        (trainings, store_training, "training", "model"),
        (groups, store_group, trials_label(stage), "trial"),
    )
    for units, on_result, what, unit_name in phases:
        bar = tqdm(
            total=sum(u.count for u in units),
            desc=f"{name} {what}",
            unit=unit_name,
            disable=not progress or not units,
        )
        drive(units, on_result, bar)


@dataclasses.dataclass
class Affinity:
    """What each worker of a backend holds between units: the seed of the model it keeps
    (``held``) and the programs it has compiled (``compiled``). A backend whose workers outlive
    one `Scheduler` (the stages of a run, `leakbench.run.stages`) passes its own, so that the
    next stage still sends each program to a worker that compiled it."""

    held: list[int | None]
    compiled: list[set[str]]

    @classmethod
    def fresh(cls, workers: int) -> Affinity:
        """No worker holds anything yet."""
        return cls([None] * workers, [set() for _ in range(workers)])

    def grow(self, workers: int) -> None:
        """Room for ``workers`` workers, those already counted keeping what they hold."""
        while len(self.held) < workers:
            self.held.append(None)
            self.compiled.append(set())


class Scheduler:
    """Which unit an idle worker takes next.

    An idle worker takes the next unit of the seed it holds, else of a seed no busy worker
    holds, else the next unit: each worker builds few models and reuses its observed
    gradients, and no worker waits for another. Within a seed it takes the first unit of a
    program (an attack configuration) it has compiled already, else the first of one no other
    worker has compiled, else the first: each compiled program is built by as few workers as
    possible (on 2 cores an XLA compile costs as much as dozens of digits trials). Which
    worker runs a unit never changes its numbers (`leakbench.run.execute.GroupCache`).
    """

    def __init__(self, units: list[Unit], workers: int, affinity: Affinity | None = None) -> None:
        self._queues: dict[int | None, collections.deque[Unit]] = {}
        for unit in units:
            self._queues.setdefault(unit.seed, collections.deque()).append(unit)
        if affinity is None:
            affinity = Affinity.fresh(workers)
        affinity.grow(workers)
        self._held = affinity.held
        self._busy: set[int] = set()
        self._compiled = affinity.compiled

    def __bool__(self) -> bool:
        """Whether a unit is still to be handed out."""
        return bool(self._queues)

    def take(self, worker: int) -> Unit:
        """The next unit for the idle ``worker`` (there must be one: see `__bool__`)."""
        seed = self._held[worker]
        if seed is None or seed not in self._queues:
            busy = {self._held[j] for j in self._busy}
            seed = next((s for s in self._queues if s not in busy), next(iter(self._queues)))
        queue = self._queues[seed]
        position = self._pick(worker, queue)
        unit = queue[position]
        del queue[position]
        if not queue:
            del self._queues[seed]
        self._compiled[worker].add(unit.program)
        if unit.seed is not None:
            self._held[worker] = unit.seed
        self._busy.add(worker)
        return unit

    def _pick(self, worker: int, queue: collections.deque[Unit]) -> int:
        """The position in ``queue`` of the unit ``worker`` takes (see the class docstring)."""
        mine = self._compiled[worker]
        others = set().union(*(c for j, c in enumerate(self._compiled) if j != worker))
        for wanted in (lambda p: p in mine, lambda p: p not in others):
            for position, unit in enumerate(queue):
                if wanted(unit.program):
                    return position
        return 0

    def done(self, worker: int) -> None:
        """``worker`` finished its unit and is idle again."""
        self._busy.discard(worker)


class WorkerState:
    """What a worker loads on its first unit (the parsed config, its pipeline, the data, the
    plan, the group cache) and the two kinds of unit it runs. ``folder`` is the run directory
    when the worker shares the driver's file system (local workers), else None."""

    def __init__(self, config_text: str, folder: Path | None = None) -> None:
        self._config_text = config_text
        self._folder = folder
        self._loaded: tuple[Pipeline, Any, dict[str, Trial], dict[str, Training]] | None = None
        self._cache: Any = None

    def _load(self) -> tuple[Pipeline, Any, dict[str, Trial], dict[str, Training]]:
        if self._loaded is None:
            pipeline = pipeline_for(parse_config(self._config_text, "config.toml"))
            data = pipeline.load()
            self._cache = pipeline.cache(data, self._folder)
            self._loaded = (
                pipeline,
                data,
                {t.key: t for t in pipeline.plan(data)},
                {t.key: t for t in pipeline.trainings(data)},
            )
        return self._loaded

    def train(self, key: str) -> list[dict[str, Any]]:
        """The utility row of the planned training ``key``."""
        pipeline, data, _, trainings = self._load()
        return pipeline.train(data, _planned(trainings, key))

    def attack(self, keys: tuple[str, ...], skip: tuple[str, ...]) -> GroupResult:
        """Attacks the group of planned trials ``keys``; leaves ``skip`` out of the result."""
        pipeline, data, trials, _ = self._load()
        group = [_planned(trials, key) for key in keys]
        return pipeline.attack(data, group, self._cache, frozenset(skip))


def _planned(planned: dict[str, Any], key: str) -> Any:
    try:
        return planned[key]
    except KeyError:
        raise ConfigError(
            f"a worker does not plan the driver's work {key}: install the same leakbench and "
            "plugins on every node of the cluster"
        ) from None
