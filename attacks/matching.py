"""The gradient-matching attacks' common part: what is compared and what is added.

`MatchingAttack` is the base of the attacks that optimise dummy inputs until their gradient
matches the observed one (``dlg``, ``idlg``, ``ig``). It declares the two parameters every such
attack shares, so that the attack contract (`leakbench.attacks.base.Attack`) knows none of
them: ``match`` (which gradient coordinates are compared) and ``priors`` (terms added to the
matching loss, `leakbench.attacks.priors`). How far two gradients are is the subclass's own
parameter or choice (`leakbench.attacks.engine.losses`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from leakbench.attacks.base import Attack, AttackTarget
from leakbench.attacks.engine.inverter import MAX_BATCH
from leakbench.attacks.learned import LearnedInversion
from leakbench.attacks.priors import PRIOR_TABLES, Prior, priors_from_config
from leakbench.components.forward import head_start
from leakbench.core.errors import ConfigError
from leakbench.core.params import Choice, param


@dataclasses.dataclass(frozen=True)
class MatchingAttack(Attack):
    """An attack that matches gradients (see the module docstring).

    Attributes:
        match: ``"all"`` (every gradient coordinate), ``"kept"`` (only the coordinates that
            are non-zero in the observed gradient: the adaptive attacker's answer to pruning
            and top-k, which send zeros for what they drop) or ``"features"`` (only the
            tensors before the model's output layer: the answer to defenses that perturb the
            head, Soteria and PRECODE; needs a model ending with a dense layer).
        priors: Terms added to the matching loss, as tables (``[{ name = "tv", weight = 1e-4
            }]``; `leakbench.attacks.priors`).
        start: ``"random"`` (the attack's own draw) or ``"learned"``: the first start is the
            learned attack's reconstruction, which the optimisation refines (batches of at
            most 4; `ig`'s other ``starts`` stay random).
    """

    match: str = param(
        "all", Choice("all", "kept", "features"), doc="gradient coordinates compared"
    )
    priors: tuple[dict[str, Any], ...] = param(
        (), PRIOR_TABLES, doc="terms added to the matching loss", keyed_when_set=True
    )
    start: str = param(
        "random",
        Choice("random", "learned"),
        doc="first start: the attack's random draw, or the learned attack's reconstruction",
        keyed_when_set=True,
    )

    def uses_simulator(self) -> bool:
        """With ``start = "learned"`` the targets carry the simulator the learned attack
        trains from."""
        return self.start == "learned"

    def check_batch_size(self, batch_size: int) -> None:
        super().check_batch_size(batch_size)
        if self.start == "learned" and batch_size > MAX_BATCH:
            raise ConfigError(
                f'attack {self.name}: start = "learned" takes batches of at most {MAX_BATCH} '
                f"(the learned attack's), got {batch_size}"
            )

    def learned_starts(self, targets: list[AttackTarget]) -> list[np.ndarray] | None:
        """With ``start = "learned"``, each target's reconstruction by the learned attack at
        its default settings (`leakbench.attacks.learned`; one inverter per defense
        configuration, shared with a ``learned`` attack of the run), flattened; else None."""
        if self.start != "learned":
            return None
        learned = LearnedInversion()
        return [learned.run(t, tf.zeros(2, tf.int64)).images.reshape(-1) for t in targets]

    def objective_priors(self) -> tuple[Prior, ...]:
        """The priors built from ``priors``."""
        return priors_from_config(f"attack {self.name}: priors", self.priors)

    def check_model(self, model: keras.Model, input_shape: tuple[int, ...]) -> None:
        """With ``match = "features"`` the model must end with a dense layer on a feature
        vector (`leakbench.components.forward.head_start` raises otherwise)."""
        super().check_model(model, input_shape)
        if self.match == "features":
            head_start(model)
