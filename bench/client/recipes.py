"""The utility training's recipes: the ``[training]`` table (`TrainingConfig`), its DP recipe
(`DPRecipe`, ``[training.dp]``) and the recipe one defense trains with (`Recipe`).

A defense that acts per example (``dpsgd``, or a chain holding it) trains with the DP recipe,
unless it is disabled; every other defense with the table's own. Each recipe declares the
learning rates searched on the validation split (`leakbench.client.selection`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import keras

from leakbench.core.errors import ConfigError
from leakbench.core.params import (
    SECTION,
    Alias,
    Choice,
    Flag,
    Int,
    Number,
    Numbers,
    param,
    validate,
)
from leakbench.core.seeds import MAX_REPLICATES, validation_indices
from leakbench.defenses import Defense

OPTIMIZERS = ("sgd", "adam")
# Learning rates: positive, below 10. Not stored as floats (as_float=False): the stored
# trainings' keys hash the values as given, so a rate of 1 must stay 1.
RATE = Number(0.0, 10.0, low_open=True, high_open=True, as_float=False)
RATES = Numbers(RATE, 1, 8)


def make_optimizer(name: str, learning_rate: float) -> keras.optimizers.Optimizer:
    """``sgd`` or ``adam`` at ``learning_rate``.

    Raises:
        ConfigError: For another name or a learning rate that is not a positive number.
    """
    if name not in OPTIMIZERS:
        raise ConfigError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")
    if not isinstance(learning_rate, (int, float)) or not 0.0 < learning_rate < math.inf:
        raise ConfigError(f"learning_rate must be a number in (0, inf), got {learning_rate!r}")
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate)
    return keras.optimizers.Adam(learning_rate)


@dataclasses.dataclass(frozen=True)
class Recipe:
    """One way of training a utility model: every learning rate of ``learning_rates`` is tried
    with the same epochs, batch size and optimizer (`leakbench.client.selection`).

    Attributes:
        name: ``"default"`` (the ``[training]`` table) or ``"dp"`` (``[training.dp]``).
        epochs: Passes over the training split (less the validation split).
        batch_size: Examples per step; the last incomplete batch of an epoch is dropped. A
            defense with a DP accountant trains on Poisson-sampled batches of this expected
            size instead (`leakbench.client.training.run_epochs`).
        optimizer: ``"sgd"`` or ``"adam"``.
        learning_rates: The rates searched (one: no search).
    """

    name: str
    epochs: int
    batch_size: int
    optimizer: str
    learning_rates: tuple[float, ...]

    def make_optimizer(self, learning_rate: float) -> keras.optimizers.Optimizer:
        return make_optimizer(self.optimizer, learning_rate)

    def check_fits(self, train_size: int, where: str = "the training split") -> None:
        """Raises `ConfigError` unless one batch fits in a training split of ``train_size``."""
        field = "training.batch_size" if self.name == "default" else "training.dp.batch_size"
        if self.batch_size > train_size:
            raise ConfigError(
                f"{field} must be at most the size of {where} ({train_size}), got {self.batch_size}"
            )


@dataclasses.dataclass(frozen=True)
class DPRecipe:
    """How example-level defenses (``dpsgd``, or a chain holding it) train, as the DP-SGD
    literature does: plain SGD, larger batches and larger learning rates than the default
    recipe. ``enabled = false`` trains them with the default recipe instead. ``epochs = 0``
    (the default) trains as many passes as ``[training]`` does: protocol 2 gives every defense
    the same epoch budget (`leakbench.run.checks.check_fair_budget`)."""

    enabled: bool = param(True, Flag(), doc="train example-level defenses with this recipe")
    epochs: int = param(
        0, Int(0, 10_000), doc="passes over the training split (0: as many as [training])"
    )
    batch_size: int = param(128, Int(1, 65_536), doc="examples per step")
    optimizer: str = param("sgd", Choice(*OPTIMIZERS, one_of=True), doc="the optimizer")
    learning_rates: tuple[float, ...] = param(
        (2.0, 4.0, 8.0), RATES, doc="the learning rates searched"
    )

    def __post_init__(self) -> None:
        validate(self, "training.dp", SECTION)


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """How the utility models are trained (the ``[training]`` table).

    Attributes:
        epochs: Passes over the training split (less the validation split).
        batch_size: Examples per step (the global batch under a distribution strategy); the
            last incomplete batch of an epoch is dropped so every step has one shape.
            (Example-level defenses train with `DPRecipe`'s, as Poisson-sampled batches of
            that expected size when they have a DP accountant.)
        optimizer: ``"sgd"`` or ``"adam"``.
        learning_rates: The learning rates searched per defense configuration and seed; the
            one with the best validation accuracy is kept (one rate: no search). The first is
            also the rate of the threat model's ``train_steps`` when it names none
            (``threat_model.train_lr``).
        validation: Share of the training split held out to choose the learning rate
            (`leakbench.core.seeds.validation_indices`); 0 only with a single rate.
        seeds: Models trained per defense configuration and run seed, each with its own
            weights and batch order (`leakbench.core.seeds.training_seed`).
        delta: The delta at which DP defenses report epsilon.
        edge_extensions: How many rates past the grid a search may try: while the best rate so
            far is the lowest or the highest tried (and the grid has two rates or more), the
            next rate one geometric step past that edge is trained too
            (`leakbench.client.selection.beyond_edge`), so that a grid cut short does not
            decide a defense's accuracy. 0: the grid alone.
        dp: The recipe of example-level defenses (`DPRecipe`).
    """

    aliases = (
        Alias(
            "learning_rate",
            "learning_rates",
            RATE,
            convert=lambda rate: [rate],
            hint="a list of one rate: no search",
        ),
    )

    epochs: int = param(30, Int(1, 10_000), doc="passes over the training split")
    batch_size: int = param(32, Int(1, 65_536), doc="examples per step")
    optimizer: str = param("adam", Choice(*OPTIMIZERS, one_of=True), doc="the optimizer")
    learning_rates: tuple[float, ...] = param(
        (1e-3, 3e-4, 3e-3), RATES, doc="the learning rates searched"
    )
    validation: float = param(
        0.1,
        Number(0.0, 1.0, high_open=True, as_float=False),
        doc="share of the training split held out to choose the learning rate",
    )
    seeds: int = param(
        3, Int(1, MAX_REPLICATES), doc="models trained per defense configuration and run seed"
    )
    delta: float = param(
        1e-5,
        Number(0.0, 1.0, low_open=True, high_open=True, as_float=False),
        doc="the delta at which DP defenses report epsilon",
    )
    edge_extensions: int = param(
        2,
        Int(0, 8),
        doc="rates tried past a searched grid's edge while the edge rate wins",
    )
    dp: DPRecipe = DPRecipe()

    def __post_init__(self) -> None:
        validate(self, "training", SECTION)
        if not isinstance(self.dp, DPRecipe):
            raise ConfigError(f"training.dp must be a table, got {self.dp!r}")
        searched = [
            (name, rates)
            for name, rates in (
                ("training.learning_rates", self.learning_rates),
                ("training.dp.learning_rates", self.dp.learning_rates),
            )
            if len(rates) > 1
        ]
        if searched and self.validation == 0:
            raise ConfigError(
                f"training.validation must be above 0 when {searched[0][0]} lists more than one "
                "rate (the rate is chosen on the validation split), got 0"
            )

    @property
    def default(self) -> Recipe:
        """The recipe of every defense that is not example-level."""
        return Recipe("default", self.epochs, self.batch_size, self.optimizer, self.learning_rates)

    def recipe(self, defense: Defense) -> Recipe:
        """The recipe ``defense`` trains with: `DPRecipe` for an example-level defense (unless
        disabled), the default one otherwise."""
        dp = self.dp
        if defense.level == "example" and dp.enabled:
            epochs = dp.epochs or self.epochs
            return Recipe("dp", epochs, dp.batch_size, dp.optimizer, dp.learning_rates)
        return self.default

    def held_out(self, train_size: int) -> int:
        """Examples of a training split of ``train_size`` held out for validation."""
        return len(validation_indices(train_size, self.validation))

    def check_fits(
        self, train_size: int, defenses: list[Defense], where: str = "the training split"
    ) -> None:
        """Raises `ConfigError` unless the validation split leaves examples to train on and one
        batch of each recipe that ``defenses`` use fits in what is left."""
        rest = train_size - self.held_out(train_size)
        if rest < 1:
            raise ConfigError(
                f"training.validation leaves no example of {where} ({train_size}) to train on, "
                f"got {self.validation}"
            )
        left = where if rest == train_size else f"{where} less its validation split"
        for recipe in dict.fromkeys(self.recipe(d) for d in defenses):
            recipe.check_fits(rest, left)

    def make_optimizer(self, learning_rate: float = 0) -> keras.optimizers.Optimizer:
        """The default recipe's optimizer at ``learning_rate`` (0: the first of the grid), the
        optimizer of `pretraining`."""
        return self.default.make_optimizer(learning_rate or self.learning_rates[0])

    def pretraining(self, learning_rate: float = 0) -> dict[str, Any]:
        """The recipe of the threat model's ``train_steps`` (no defense, the whole training
        split) at ``learning_rate``, the threat model's ``train_lr`` (0: the grid's first)."""
        return {
            "optimizer": self.optimizer,
            "batch_size": self.batch_size,
            "learning_rate": learning_rate or self.learning_rates[0],
        }
