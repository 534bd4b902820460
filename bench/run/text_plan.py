"""The plan of a text run: its trials, trainings, their keys and the groups attacked together.

A text trial is one (seed, batch size B, batch index, defense configuration, attack
configuration): the private sentences of the batch are a seeded draw from the private pool
less its held-out test sentences (`leakbench.core.seeds.private_indices`, the same draw as
image runs), the same sentences for every batch size of a seed (the first ``images`` of the
draw, cut into batches of B), so that batch sizes, defenses and attacks are compared on the
same text. The plan is a pure function of the config and the corpus's size, as image runs'.
Keys hash everything that sets a trial's numbers (a saved model's file too, by its SHA-256)
with the engine version
(`leakbench.run.store.trial_key`), under ``kind = "text"`` so that no text key can equal an
image one; a threat model other than the default adds its changes (FedAvg, clients), as image
keys do, so that the default's keys are those of runs made before it. Under secure aggregation
(``clients`` K) a trial's batch holds B x K sentences (the image track's meaning: B per client)
and its ``batch_size`` column is B.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from leakbench.attacks.text.base import TextAttack
from leakbench.components.saved_models import model_sha256
from leakbench.core.canonical import canonical_json
from leakbench.core.errors import ConfigError
from leakbench.core.seeds import private_indices
from leakbench.defenses import Defense
from leakbench.run.config import RunSpec
from leakbench.run.plan import row_columns
from leakbench.run.store import trial_key

# The [text] settings that change an attack's numbers (the model, its vocabulary, its ids).
ATTACK_SETTINGS = (
    "sequence_length",
    "max_words",
    "public_share",
    "tie_embeddings",
    "freeze_embeddings",
)
# Those that change a utility training's numbers too.
TRAINING_SETTINGS = (
    *ATTACK_SETTINGS,
    "test_sentences",
    "train_epochs",
    "train_batch_size",
    "learning_rate",
)


@dataclasses.dataclass(frozen=True)
class TextSetting:
    """What every trial and training of a text run shares."""

    run: str
    dataset: str
    model: str
    text: tuple[tuple[str, Any], ...]
    # The threat model's departures from the default (`ThreatModel.changes`), sorted.
    threat: tuple[tuple[str, Any], ...] = ()
    model_sha256: str | None = None  # the file's hash, for a saved model (keras:PATH)

    @classmethod
    def of(cls, spec: RunSpec) -> TextSetting:
        assert spec.text is not None
        return cls(
            spec.name,
            spec.dataset,
            spec.model,
            tuple(dataclasses.asdict(spec.text).items()),
            tuple(sorted(spec.threat_model.changes().items())),
            model_sha256(spec.model),
        )

    def model_key(self) -> dict[str, Any]:
        """What keys add for a saved model (its file's hash); nothing for a built-in one, whose
        keys stay as they were."""
        return {"model_sha256": self.model_sha256} if self.model_sha256 else {}

    def settings(self, names: tuple[str, ...]) -> dict[str, Any]:
        values = dict(self.text)
        return {name: values[name] for name in names}

    def columns(self, defense: Defense, seed: int) -> dict[str, Any]:
        """The columns that identify a row of either table (trials or utility)."""
        return row_columns(self.run, self.dataset, self.model, defense, seed)


@dataclasses.dataclass(frozen=True)
class TextTrial:
    """One planned text attack trial (``indices`` index the private pool)."""

    setting: TextSetting
    seed: int
    batch_size: int
    batch_index: int
    indices: tuple[int, ...]
    defense: Defense
    attack: TextAttack

    @functools.cached_property
    def key(self) -> str:
        threat = dict(self.setting.threat)
        return trial_key(
            {
                **({"threat_model": threat} if threat else {}),
                "kind": "text",
                "dataset": self.setting.dataset,
                "model": self.setting.model,
                **self.setting.model_key(),
                "text": self.setting.settings(ATTACK_SETTINGS),
                "attack": self.attack.name,
                "attack_params": self.attack.params(),
                "defense": self.defense.name,
                "defense_params": self.defense.params(),
                "seed": self.seed,
                "indices": self.indices,
            }
        )

    def columns(self) -> dict[str, Any]:
        """The identity columns of the trial's rows in trials.csv."""
        return {
            **self.setting.columns(self.defense, self.seed),
            "attack": self.attack.name,
            "attack_params": canonical_json(self.attack.params()),
            "batch_size": self.batch_size,
            "batch_index": self.batch_index,
        }


@dataclasses.dataclass(frozen=True)
class TextTraining:
    """One utility training of a text run: a (seed, defense configuration)."""

    setting: TextSetting
    seed: int
    defense: Defense

    @functools.cached_property
    def key(self) -> str:
        return trial_key(
            {
                "kind": "text_utility",
                "dataset": self.setting.dataset,
                "model": self.setting.model,
                **self.setting.model_key(),
                "text": self.setting.settings(TRAINING_SETTINGS),
                "defense": self.defense.name,
                "defense_params": self.defense.params(),
                "seed": self.seed,
            }
        )


def attackable(spec: RunSpec, private_count: int) -> int:
    """How many private sentences trials may draw from: the pool less the held-out test ones.

    Raises:
        ConfigError: If that leaves fewer than ``images``.
    """
    assert spec.text is not None
    count = private_count - spec.text.test_sentences
    if count < spec.images:
        raise ConfigError(
            f"images must be at most the private pool of {spec.dataset} less text.test_sentences "
            f"({private_count} - {spec.text.test_sentences} = {max(count, 0)}), got {spec.images}"
        )
    return count


def plan_text(spec: RunSpec, private_count: int) -> list[TextTrial]:
    """Every trial in execution order: seed, batch size, batch, defense, attack."""
    assert spec.text is not None
    pool = attackable(spec, private_count)
    setting = TextSetting.of(spec)
    defenses = spec.defense_grid()
    attacks = [spec.text_attacks_for(defense) for defense in defenses]
    trials: list[TextTrial] = []
    clients = spec.threat_model.clients
    for seed in spec.seeds:
        order = private_indices(pool, spec.images, seed)
        for size in spec.text.batch_sizes:
            observed = size * clients  # every client's sentences behind one update
            for b in range(spec.images // observed):
                indices = tuple(int(i) for i in order[b * observed : (b + 1) * observed])
                for defense, against in zip(defenses, attacks, strict=True):
                    trials.extend(
                        TextTrial(setting, seed, size, b, indices, defense, attack)
                        for attack in against
                    )
    return trials


def plan_text_training(spec: RunSpec) -> list[TextTraining]:
    """The utility trainings: one per seed and defense configuration (none without epochs)."""
    assert spec.text is not None
    if not spec.text.train_epochs:
        return []
    setting = TextSetting.of(spec)
    return [TextTraining(setting, seed, d) for seed in spec.seeds for d in spec.defense_grid()]


def text_groups(trials: list[TextTrial]) -> list[list[TextTrial]]:
    """The trials cut into the groups attacked and stored together: one batch (seed, batch
    size, batch index) with every defense and attack, from the whole plan (a resumed run forms
    the same groups)."""
    groups: dict[tuple[int, int, int], list[TextTrial]] = {}
    for trial in trials:
        groups.setdefault((trial.seed, trial.batch_size, trial.batch_index), []).append(trial)
    return list(groups.values())
