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
from typing import Any

from leakbench.attacks import Attack
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
    """What every trial and training of a run shares: the run's name, data and model, and the
    threat model's departures from the default (`leakbench.run.config.ThreatModel.changes`)."""

    run: str
    dataset: str
    image_size: tuple[int, int] | None
    model: str
    threat: tuple[tuple[str, Any], ...] = ()
    # The recipe of the threat model's training steps before the attack (None without them).
    pretraining: str | None = None
    # The SHA-256 of a saved model's file (``model = "keras:PATH"``), None for the zoo.
    model_sha256: str | None = None
    # The batch index of each seed's first batch (the config's ``first_batch``).
    first_batch: int = 0

    @classmethod
    def of(cls, spec: RunSpec) -> Setting:
        pretraining = None
        if spec.threat_model.train_steps:
            pretraining = canonical_json((spec.training or TrainingConfig()).pretraining())
        return cls(
            spec.name,
            spec.dataset,
            spec.image_size,
            spec.model,
            tuple(sorted(spec.threat_model.changes().items())),
            pretraining,
            model_sha256(spec.model),
            spec.first_batch,
        )

    def model_digest(self) -> dict[str, str]:
        """What a key adds for a saved model: its file's SHA-256 (nothing for the zoo, so the
        zoo's keys are those of runs made before saved models existed)."""
        return {"model_sha256": self.model_sha256} if self.model_sha256 else {}

    def columns(self, defense: Defense, seed: int) -> dict[str, Any]:
        """The columns that identify a row of either table (trials or utility)."""
        return row_columns(self.run, self.dataset, self.model, defense, seed)


@dataclasses.dataclass(frozen=True)
class Trial:
    """One planned attack trial."""

    setting: Setting
    seed: int
    batch_index: int
    indices: tuple[int, ...]
    defense: Defense
    attack: Attack

    @functools.cached_property
    def key(self) -> str:
        """The store key: a hash of everything that determines the trial's numbers. The
        default threat model adds nothing, so runs made before it existed keep their keys."""
        threat = dict(self.setting.threat)
        return trial_key(
            {
                **({"threat_model": threat} if threat else {}),
                # The model trained before the attack depends on the training recipe too.
                **({"pretraining": self.setting.pretraining} if self.setting.pretraining else {}),
                # Batches numbered from another start draw other noise and attack starts.
                **({"first_batch": self.setting.first_batch} if self.setting.first_batch else {}),
                "dataset": self.setting.dataset,
                "image_size": self.setting.image_size,
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

    def columns(self, batch_size: int) -> dict[str, Any]:
        """The identity columns of the trial's rows in trials.csv."""
        return {
            **self.setting.columns(self.defense, self.seed),
            "attack": self.attack.name,
            "attack_params": canonical_json(self.attack.params()),
            "batch_index": self.batch_index,
            "batch_size": batch_size,
        }


@dataclasses.dataclass(frozen=True)
class Training:
    """One planned utility training: a (seed, replicate, defense configuration), shared by its
    attacks. Replicate r trains from `leakbench.core.seeds.training_seed` (seed, r); replicate 0
    starts from the weights the attacks see."""

    setting: Setting
    seed: int
    defense: Defense
    config: TrainingConfig
    replicate: int = 0

    @functools.cached_property
    def key(self) -> str:
        """The store key: everything that determines the training's numbers, and nothing
        else (the recipe this defense trains with, not the other one; not how many replicates
        the run has, so that more replicates extend fewer)."""
        config = self.config
        return trial_key(
            {
                "kind": "utility",
                "dataset": self.setting.dataset,
                "image_size": self.setting.image_size,
                "model": self.setting.model,
                **self.setting.model_digest(),
                "defense": self.defense.name,
                "defense_params": self.defense.params(),
                "seed": self.seed,
                "replicate": self.replicate,
                "recipe": dataclasses.asdict(config.recipe(self.defense)),
                "validation": config.validation,
                "delta": config.delta,
            }
        )

    def columns(self) -> dict[str, Any]:
        """The identity columns of the training's row in utility.csv."""
        return {**self.setting.columns(self.defense, self.seed), "replicate": self.replicate}


def private_split(spec: RunSpec, dataset: Dataset) -> Split:
    """The split the private examples come from (the threat model's ``private_split``)."""
    return dataset.train if spec.threat_model.private_split == "train" else dataset.test


def public_split(spec: RunSpec, dataset: Dataset) -> Split:
    """The split the private examples do not come from: what a malicious server may build its
    model from (`leakbench.attacks.Attack.malicious_model`)."""
    return dataset.test if spec.threat_model.private_split == "train" else dataset.train


def plan(spec: RunSpec, dataset: Dataset) -> list[Trial]:
    """Every trial of the run in execution order (seed, batch, defense, attack): each defense
    meets the configured attacks, then its adaptive ones
    (`leakbench.run.config.RunSpec.attacks_for`). Each seed's batches are numbered from the
    config's ``first_batch`` (0 by default)."""
    split = private_split(spec, dataset)
    if spec.images > len(split):
        raise ConfigError(
            f"images must be at most the size of {spec.dataset}'s "
            f"{spec.threat_model.private_split} split ({len(split)}), got {spec.images}"
        )
    defenses = spec.defense_grid()
    attacks = [spec.attacks_for(defense) for defense in defenses]
    setting = Setting.of(spec)
    trials = []
    for seed in spec.seeds:
        order = private_indices(len(split), spec.images, seed)
        size = spec.observed_batch  # every client's batch: one trial attacks their mean
        for b in range(spec.images // size):
            indices = tuple(int(i) for i in order[b * size : (b + 1) * size])
            for defense, against in zip(defenses, attacks, strict=True):
                for attack in against:
                    trials.append(
                        Trial(setting, seed, spec.first_batch + b, indices, defense, attack)
                    )
    return trials


def plan_training(spec: RunSpec) -> list[Training]:
    """The utility trainings: per seed and defense configuration, ``training.seeds``
    replicates, each shared by all the configuration's attacks."""
    if spec.training is None:
        return []
    setting = Setting.of(spec)
    return [
        Training(setting, seed, defense, spec.training, replicate)
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
    """
    runs: dict[tuple[int, str, Any], list[Trial]] = {}
    for trial in trials:
        attack_text = canonical_json([trial.attack.name, trial.attack.params()])
        # A defense that changes the model (PRECODE) is attacked on its own model.
        variant = trial.defense.architecture
        runs.setdefault((trial.seed, attack_text, variant), []).append(trial)
    pieces: dict[tuple[int, int], list[list[Trial]]] = {}
    for (seed, _, _), members in runs.items():
        for k in range(0, len(members), width):
            pieces.setdefault((seed, k), []).append(members[k : k + width])
    return [group for key in sorted(pieces) for group in pieces[key]]


def pending_groups(groups: list[list[Trial]], done: set[str]) -> list[list[Trial]]:
    """The groups with any trial not in ``done``.

    Such a group is attacked whole (the same arithmetic as when it first ran) and only its
    missing trials are stored.
    """
    return [group for group in groups if any(t.key not in done for t in group)]
