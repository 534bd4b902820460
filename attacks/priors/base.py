"""The prior contract: a term added to an optimisation attack's gradient-matching loss.

An optimisation attack minimises ``matching loss + sum of weight * penalty`` over its dummy
images. The matching loss compares gradients; a prior says what natural images look like (total
variation), or what else the attacker knows (a BatchNorm layer's batch statistics, agreement
between the starts of one trial). Priors are chosen in the attack's config::

    [[attack]]
    name = "dlg"
    priors = [{ name = "tv", weight = 1e-4 }]

A prior is a frozen dataclass registered by name in `PRIORS` (or declared by an installed
package in the ``leakbench.priors`` entry-point group), with ``weight`` and any parameters of
its own as fields. Its `Prior.penalty` is traced into the attack's compiled loop: it must be
pure TensorFlow, without Python side effects or variables, and return one value per problem.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import keras
import tensorflow as tf

from leakbench.core.errors import ConfigError, LeakbenchError
from leakbench.core.params import PLAIN, Kind, Number, Style, build, param, validate
from leakbench.core.registry import Registry

PRIORS: Registry[type[Prior]] = Registry("prior")


@dataclasses.dataclass(frozen=True)
class PriorContext:
    """What a prior may read besides the dummy images, for N problems at once.

    Attributes:
        model: The attacked model (its variables are not the weights of the problems).
        weights: Each trainable variable's value per problem, with a leading problem axis.
        observed: The observed gradient per problem, ordered like ``weights``.
        targets: The label distributions the dummy batch is scored against, [N, batch, classes].
        forward: ``forward(weights, images) -> logits`` for [N, batch, ...] images, in the
            model's forward mode (`leakbench.components.forward.forward_training`): a prior that
            needs the network's view of the dummy images (e.g. a BatchNorm-statistics prior, through
            a sub-model) calls it instead of the model's variables.
        starts: Consecutive problems that are starts of one trial (problem ``n * starts + k``
            is start ``k`` of trial ``n``), for a prior that relates starts to each other.
        known: What else the threat model lets the server know of each problem's batch, with
            a leading problem axis: the batch's BatchNorm statistics (`AttackTarget.statistics`,
            [N, channels] each: mean and variance of each BatchNorm layer's input, in
            order), or empty.
    """

    model: keras.Model
    weights: tuple[tf.Tensor, ...]
    observed: tuple[tf.Tensor, ...]
    targets: tf.Tensor
    forward: Callable[[list[tf.Tensor], tf.Tensor], tf.Tensor]
    starts: int = 1
    known: tuple[tf.Tensor, ...] = ()


@dataclasses.dataclass(frozen=True)
class Prior:
    """Base class of all priors; subclasses are frozen dataclasses of their parameters.

    Attributes:
        weight: The prior's multiplier in the attack's loss, >= 0.
    """

    name: ClassVar[str] = ""
    # True for a prior that reads the batch's BatchNorm statistics (`PriorContext.known`): it
    # needs the threat model's ``bn_statistics_known``.
    needs_statistics: ClassVar[bool] = False

    weight: float = param(1.0, Number(0.0, None), doc="multiplier of the penalty in the loss")

    def __post_init__(self) -> None:
        validate(self, f"prior {self.name}")

    def penalty(self, images: tf.Tensor, context: PriorContext) -> tf.Tensor:
        """The penalty of each problem's dummy images [N, batch, H, W, C]; returns [N]."""
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def make_prior(name: str, **params: Any) -> Prior:
    """Builds a registered prior from its name and parameters, validating both."""
    return build(PRIORS.get(name), f"prior {name}", params)


class PriorTables(Kind):
    """The kind of an attack's ``priors`` parameter: a list of tables, each naming a
    registered prior and its parameters; stored as a tuple of plain dicts (JSON-able, so that
    `Attack.params` and trial keys hold them as given)."""

    def describe(self, style: Style = PLAIN) -> str:
        return 'a list of tables such as [{ name = "tv", weight = 1e-4 }]'

    def check(self, value: Any, label: str, style: Style = PLAIN) -> Any:
        priors_from_config(label, value)
        return tuple(dict(table) for table in value)


PRIOR_TABLES = PriorTables()


def priors_from_config(label: str, tables: Any) -> tuple[Prior, ...]:
    """The priors an attack's ``priors`` value names: a list of tables, each with a ``name``
    and the prior's parameters. ``label`` ("attack dlg: priors") starts every error message."""
    if not isinstance(tables, (list, tuple)) or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{label} must be {PRIOR_TABLES.describe()}, got {tables!r}")
    built = []
    for i, table in enumerate(tables):
        name = table.get("name")
        if not isinstance(name, str):
            raise ConfigError(
                f"{label}[{i}].name must be a string; allowed: {', '.join(PRIORS.names())}"
            )
        try:
            built.append(make_prior(name, **{k: v for k, v in table.items() if k != "name"}))
        except LeakbenchError as err:  # an unknown name, a bad parameter, a broken plugin
            raise type(err)(f"{label}[{i}]: {err}") from None
    names = [p.name for p in built]
    if len(set(names)) != len(names):
        raise ConfigError(f"{label} names a prior twice; give each prior once")
    return tuple(built)
