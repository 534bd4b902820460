"""The defense contract: a pure, seeded transformation of the gradients a client shares.

A defense is a frozen dataclass registered by name. Calling it maps a list of gradient tensors
(ordered like ``model.trainable_variables``) to a list of the same structure, shapes and dtypes.
It must be traceable inside a ``tf.function`` without retracing: no Python side effects, no new
variables, and randomness only from stateless random ops keyed by the ``seed`` tensor, so that
the same seed always gives the same output and nothing new is built per step.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import tensorflow as tf

from leakbench.errors import ConfigError
from leakbench.registry import Registry

Gradients = list[tf.Tensor]

DEFENSES: Registry[type[Defense]] = Registry("defense")


@dataclasses.dataclass(frozen=True)
class Defense:
    """Base class of all defenses.

    Attributes:
        name: Registry name, set by each subclass.
        level: ``"batch"`` (acts on the batch gradient) or ``"example"`` (acts on per-example
            gradients; the caller averages afterwards).
    """

    name: ClassVar[str] = ""
    level: ClassVar[str] = "batch"

    def __call__(self, grads: Gradients, *, seed: tf.Tensor) -> Gradients:
        """Returns the defended gradients.

        Args:
            grads: Gradient tensors ordered like ``model.trainable_variables``.
            seed: int32/int64 tensor of shape [2]; the only source of randomness.
        """
        raise NotImplementedError

    def params(self) -> dict[str, Any]:
        """The defense's parameters as plain JSON-able values (used for canonical keys)."""
        return dataclasses.asdict(self)


def tensor_seed(seed: tf.Tensor | tuple[int, int] | list[int], index: int) -> tf.Tensor:
    """Derives an independent stateless seed for the ``index``-th random draw of one call."""
    seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
    return tf.random.experimental.stateless_fold_in(seed, index)


def check_number(
    defense: str,
    param: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """Validates a numeric parameter; raises `ConfigError` naming it and the allowed range."""
    lo = "-inf" if low is None else f"{low:g}"
    hi = "inf" if high is None else f"{high:g}"
    opening = "(" if low_open or low is None else "["
    closing = ")" if high_open or high is None else "]"
    allowed = f"{opening}{lo}, {hi}{closing}"
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(
            f"defense {defense}: {param} must be a number in {allowed}, got {value!r}"
        )
    ok = True
    if low is not None:
        ok &= value > low if low_open else value >= low
    if high is not None:
        ok &= value < high if high_open else value <= high
    if not ok:
        raise ConfigError(f"defense {defense}: {param} must be in {allowed}, got {value!r}")
    return float(value)


def make_defense(name: str, **params: Any) -> Defense:
    """Builds a registered defense from its name and parameters, validating both."""
    cls = DEFENSES.get(name)
    if hasattr(cls, "from_params"):
        return cls.from_params(**params)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(params) - fields)
    if unknown:
        allowed = ", ".join(sorted(fields)) or "none"
        raise ConfigError(f"defense {name}: unknown parameter {unknown[0]!r}; allowed: {allowed}")
    missing = sorted(
        f.name
        for f in dataclasses.fields(cls)
        if f.name not in params
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    )
    if missing:
        raise ConfigError(f"defense {name}: parameter {missing[0]!r} is required")
    return cls(**params)
