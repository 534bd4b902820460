"""The plan of a run: every trial and training it holds, their identities and attack groups.

A trial is one (seed, batch of private examples, defense configuration, attack configuration).
For each seed the private examples are a seeded draw from the private split and the model
weights come from the same seed, so every cell of a run attacks the same images under the same
weights (paired comparisons). The plan is a pure function of the config and the dataset's
size: the executor, the run directory, ``merge`` and every Ray actor compute the same plan.

`Trial` and `Training` are the value objects of an identity: each produces its store key, and
a trial its leaderboard cell and its identity columns, so these are written in one place.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

from leakbench.attacks.base import AttackContract
from leakbench.client.recipes import TrainingConfig
from leakbench.components.saved_models import model_sha256
from leakbench.core.canonical import canonical_json
from leakbench.core.errors import ConfigError
from leakbench.core.seeds import private_indices
from leakbench.datasets import Dataset
from leakbench.datasets.base import Split
from leakbench.defenses import Defense
from leakbench.outputs.arrays import cell_id
from leakbench.run.config import RunSpec
from leakbench.run.sections import ThreatModel
from leakbench.run.store import trial_key


def row_columns(run: str, dataset: str, model: str, defense: Defense, seed: int) -> dict[str, Any]:
    """The columns that identify a row of a run's tables (trials or utility), image or text."""
    return {
        "run": run,
        "dataset": dataset,
        "model": model,
        "defense": defense.name,
        "defense_params": canonical_json(defense.params()),
        "seed": seed,
    }


@dataclasses.dataclass(frozen=True)
class Setting:
    """What every trial and training of a run shares: the run's name, data and model, the
    threat model's departures from the default (`leakbench.run.config.ThreatModel.changes`) and
    what the run's modality adds to every key (``fields``: an image run's input size and the
    recipe of its training before the attack; a text run's ``[text]`` settings)."""

    run: str
    dataset: str
    model: str
    threat: tuple[tuple[str, Any], ...] = ()
    # The SHA-256 of a saved model's file (``model = "keras:PATH"``), None for the zoo.
    model_sha256: str | None = None
    # What the modality adds to a trial's key (`leakbench.run.pipeline.Pipeline.setting`).
    fields: tuple[tuple[str, Any], ...] = ()
    # The batch index of each seed's first batch (the config's ``first_batch``).
    first_batch: int = 0

    @classmethod
    def of(cls, spec: RunSpec, **fields: Any) -> Setting:
        """The setting of ``spec`` with the modality's key ``fields``."""
        return cls(
            spec.name,
            spec.dataset,
            spec.model,
            tuple(sorted(spec.threat_model.changes().items())),
            model_sha256(spec.model),
            tuple(fields.items()),
            spec.first_batch,
        )

    def field(self, name: str) -> Any:
        """The modality's key field ``name`` (None if it has none)."""
        return dict(self.fields).get(name)

    def model_digest(self) -> dict[str, str]:
        """What a key adds for a saved model: its file's SHA-256 (nothing for the zoo, so the
        zoo's keys are those of runs made before saved models existed)."""
        return {"model_sha256": self.model_sha256} if self.model_sha256 else {}

    def columns(self, defense: Defense, seed: int) -> dict[str, Any]:
        """The columns that identify a row of either table (trials or utility)."""
        return row_columns(self.run, self.dataset, self.model, defense, seed)


@dataclasses.dataclass(frozen=True)
class Trial:
    """One planned attack trial, of any modality: the private examples ``indices`` of batch
    ``batch_index`` (``batch_size`` examples a client) under ``defense``, attacked by
    ``attack``."""

    setting: Setting
    seed: int
    batch_index: int
    indices: tuple[int, ...]
    defense: Defense
    attack: AttackContract
    batch_size: int = 0

    @functools.cached_property
    def key(self) -> str:
        """The store key: a hash of everything that determines the trial's numbers. The
        default threat model adds nothing, so runs made before it existed keep their keys;
        nor does a first batch of 0."""
        threat = dict(self.setting.threat)
        first = self.setting.first_batch
        return trial_key(
            {
                **({"threat_model": threat} if threat else {}),
                # Batches numbered from another start draw other noise and attack starts.
                **({"first_batch": first} if first else {}),
                **dict(self.setting.fields),
                "dataset": self.setting.dataset,
                "model": self.setting.model,
                **self.setting.model_digest(),
                "attack": self.attack.name,
                "attack_params": self.attack.params(),
                "defense": self.defense.name,
                "defense_params": self.defense.params(),
                "seed": self.seed,
                "indices": self.indices,
            }
        )

    @property
    def cell_id(self) -> str:
        """The `leakbench.outputs.arrays.cell_id` of the trial's leaderboard cell."""
        return cell_id(
            {
                "dataset": self.setting.dataset,
                "model": self.setting.model,
                **self.setting.model_digest(),
                "attack": self.attack.name,
                "attack_params": canonical_json(self.attack.params()),
                "defense": self.defense.name,
                "defense_params": canonical_json(self.defense.params()),
            }
        )

    def columns(self) -> dict[str, Any]:
        """The identity columns of the trial's rows in trials.csv."""
        return {
            **self.setting.columns(self.defense, self.seed),
            "attack": self.attack.name,
            "attack_params": canonical_json(self.attack.params()),
            "batch_index": self.batch_index,
            "batch_size": self.batch_size,
        }


@dataclasses.dataclass(frozen=True)
class Training:
    """One planned utility training: a (seed, replicate, defense configuration), shared by its
    attacks. Replicate r trains from `leakbench.core.seeds.training_seed` (seed, r); replicate 0
    starts from the weights the attacks see. ``fields`` is what the modality adds to the key
    (an image run's recipe for this defense; a text run's ``[text]`` settings) and ``config``
    its training settings."""

    setting: Setting
    seed: int
    defense: Defense
    config: Any
    replicate: int = 0
    fields: tuple[tuple[str, Any], ...] = ()

    @functools.cached_property
    def key(self) -> str:
        """The store key: everything that determines the training's numbers, and nothing
        else (not how many replicates the run has, so that more replicates extend fewer)."""
        return trial_key(
            {
                **dict(self.fields),
                "dataset": self.setting.dataset,
                "model": self.setting.model,
                **self.setting.model_digest(),
                "defense": self.defense.name,
                "defense_params": self.defense.params(),
                "seed": self.seed,
            }
        )

    def columns(self) -> dict[str, Any]:
        """The identity columns of the training's row in utility.csv."""
        return {**self.setting.columns(self.defense, self.seed), "replicate": self.replicate}


def private_split(threat: ThreatModel, dataset: Dataset) -> Split:
    """The split the private examples come from (the threat model's ``private_split``)."""
    return dataset.train if threat.private_split == "train" else dataset.test


def public_split(threat: ThreatModel, dataset: Dataset) -> Split:
    """The split the private examples do not come from: what a malicious server may build its
    model from (`leakbench.attacks.Attack.malicious_model`)."""
    return dataset.test if threat.private_split == "train" else dataset.train


def image_setting(spec: RunSpec) -> Setting:
    """The setting of an image run: its key adds the input size and, when the threat model
    trains the model before the attack, that training's recipe."""
    pretraining = {}
    if spec.threat_model.train_steps:
        recipe = (spec.training or TrainingConfig()).pretraining(spec.threat_model.train_lr)
        pretraining = {"pretraining": canonical_json(recipe)}
    return Setting.of(spec, image_size=spec.image_size, **pretraining)


def plan(spec: RunSpec, dataset: Dataset) -> list[Trial]:
    """Every trial of the run in execution order (seed, batch, defense, attack): each defense
    meets the configured attacks, then its adaptive ones
    (`leakbench.run.config.RunSpec.attacks_for`). Each seed's batches are numbered from the
    config's ``first_batch`` (0 by default)."""
    split = private_split(spec.threat_model, dataset)
    if spec.images > len(split):
        raise ConfigError(
            f"images must be at most the size of {spec.dataset}'s "
            f"{spec.threat_model.private_split} split ({len(split)}), got {spec.images}"
        )
    defenses = spec.defense_grid()
    return plan_batches(
        image_setting(spec),
        spec.seeds,
        lambda seed: private_indices(len(split), spec.images, seed),
        # Every client's batch: one trial attacks their mean, its batch_size column B x K.
        [spec.observed_batch],
        [(d, spec.attacks_for(d)) for d in defenses],
        first=spec.first_batch,
    )


def plan_batches(
    setting: Setting,
    seeds: tuple[int, ...],
    draw: Callable[[int], Any],
    sizes: list[int],
    cells: list[tuple[Defense, list[Any]]],
    *,
    first: int = 0,
    clients: int = 1,
) -> list[Trial]:
    """The trials of every modality: for each seed its private examples ``draw(seed)``, for
    each batch size B of ``sizes`` those examples cut into batches of B x ``clients`` (every
    client's examples behind one update; the trials' ``batch_size`` column is B), numbered
    from ``first``, each attacked under every defense by its attacks (``cells``)."""
    trials: list[Trial] = []
    for seed in seeds:
        order = draw(seed)
        for size in sizes:
            observed = size * clients
            for b in range(len(order) // observed):
                indices = tuple(int(i) for i in order[b * observed : (b + 1) * observed])
                trials.extend(
                    Trial(setting, seed, first + b, indices, defense, attack, size)
                    for defense, attacks in cells
                    for attack in attacks
                )  # fmt: skip
    return trials


def plan_training(spec: RunSpec) -> list[Training]:
    """The utility trainings: per seed and defense configuration, ``training.seeds``
    replicates, each shared by all the configuration's attacks."""
    if spec.training is None:
        return []
    setting, config = image_setting(spec), spec.training
    return [
        Training(
            setting,
            seed,
            defense,
            config,
            replicate,
            (
                ("kind", "utility"),
                ("image_size", spec.image_size),
                ("replicate", replicate),
                ("recipe", dataclasses.asdict(config.recipe(defense))),
                ("validation", config.validation),
                ("delta", config.delta),
            ),
        )  # fmt: skip
        for seed in spec.seeds
        for defense in spec.defense_grid()
        for replicate in range(spec.training.seeds)
    ]


def attack_groups(trials: list[Trial], width: int) -> list[list[Trial]]:
    """The planned trials cut into the groups that are attacked together.

    Trials of one seed (one model), one attack configuration and one architecture (a defense
    that changes the model, PRECODE, gets its own) form a run of consecutive (batch, defense)
    cells, cut into pieces of ``width``. The groups come from the whole plan,
    not from what is left to do, and each group is stored in one transaction, so a resumed run
    attacks exactly the groups of an uninterrupted one. That matters because batched arithmetic
    can differ from one-at-a-time arithmetic in the last bits: equal groups give equal numbers.

    Groups are ordered seed by seed, and within a seed piece by piece with every attack
    configuration's piece next to the others: they cover the same cells, so each cell's
    observed gradient is computed once and reused.

    An attack that learns from a simulator (`leakbench.attacks.Attack.uses_simulator`: the
    learned attack, or a start from it) trains one network per defense configuration: its
    trials of one seed and defense configuration form one group, uncut (it runs at most
    ``width`` of them at once all the same), so one process trains each network once.
    """
    runs: dict[tuple[int, str, Any, str], list[Trial]] = {}
    for trial in trials:
        attack_text = canonical_json([trial.attack.name, trial.attack.params()])
        # A defense that changes the model (PRECODE) is attacked on its own model.
        variant = trial.defense.architecture
        learns = trial.attack.uses_simulator()
        defense = canonical_json([trial.defense.name, trial.defense.params()]) if learns else ""
        runs.setdefault((trial.seed, attack_text, variant, defense), []).append(trial)
    pieces: dict[tuple[int, int], list[list[Trial]]] = {}
    for (seed, _, _, defense), members in runs.items():
        step = len(members) if defense else width
        for k in range(0, len(members), step):
            pieces.setdefault((seed, k), []).append(members[k : k + step])
    return [group for key in sorted(pieces) for group in pieces[key]]


def pending_groups(groups: list[list[Trial]], done: set[str]) -> list[list[Trial]]:
    """The groups with any trial not in ``done``.

    Such a group is attacked whole (the same arithmetic as when it first ran) and only its
    missing trials are stored.
    """
    return [group for group in groups if any(t.key not in done for t in group)]
