"""The defense contract: a pure, seeded transformation of the gradients a client shares.

A defense is a frozen dataclass registered by name. Calling it maps a list of gradient tensors
(ordered like ``model.trainable_variables``) to the batch gradient the client shares: a list of
the same length and dtypes, with the shapes of the variables. It must be traceable inside a
``tf.function`` without retracing: no Python side effects, no new variables, and randomness only
from stateless random ops keyed by the ``seed`` tensor, so that the same seed always gives the
same output and nothing new is built per step.

Two levels (the class attribute ``level``):

* ``"batch"``: the input is the batch gradient (the gradient of the mean task loss, shaped like
  the variables) and the output has the same shapes.
* ``"example"``: the input is the per-example gradients, each tensor with a leading batch axis
  (shape ``[B, *variable.shape]``), and the output is the batch gradient (shaped like the
  variables). The defense does the reduction over examples itself, because e.g. DP-SGD adds its
  noise once, to the sum of the clipped per-example gradients, before dividing by ``B``.

`defended_gradients` is the one code path that computes a client's shared gradient for either
level; the attack side and the trainer both use it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import keras
import tensorflow as tf

from leakbench.errors import ConfigError
from leakbench.models import loss_and_gradients
from leakbench.per_example import per_example_losses_and_gradients
from leakbench.registry import Registry

Gradients = list[tf.Tensor]

DEFENSES: Registry[type[Defense]] = Registry("defense")


@dataclasses.dataclass(frozen=True)
class Defense:
    """Base class of all defenses.

    Attributes:
        name: Registry name, set by each subclass.
        level: ``"batch"`` (maps the batch gradient to a defended batch gradient) or
            ``"example"`` (maps per-example gradients, shape ``[B, *variable.shape]``, to the
            defended batch gradient, doing the reduction over examples itself). Use
            `defended_gradients` to feed a defense the right input for its level.
    """

    name: ClassVar[str] = ""
    level: ClassVar[str] = "batch"

    def __call__(self, grads: Gradients, *, seed: tf.Tensor) -> Gradients:
        """Returns the defended gradients.

        Args:
            grads: Gradient tensors ordered like ``model.trainable_variables``: the batch
                gradient for a batch-level defense, the per-example gradients (leading batch
                axis) for an example-level one.
            seed: int32/int64 tensor of shape [2]; the only source of randomness.

        Returns:
            The defended batch gradient, one tensor per variable, shaped like the variable.
        """
        raise NotImplementedError

    def epsilon(self, sampling_rate: float, steps: int, delta: float) -> float | None:
        """The ``(epsilon, delta)``-DP guarantee of training with this defense, if it has one.

        Args:
            sampling_rate: Probability that one example is in a batch (Poisson sampling), i.e.
                batch size / training set size.
            steps: Number of training steps (shared gradients).
            delta: The ``delta`` of ``(epsilon, delta)``-DP.

        Returns:
            ``None`` here: a defense gives no differential-privacy guarantee unless it says so
            (e.g. ``dpsgd``, or a chain that contains it).
        """
        del sampling_rate, steps, delta
        return None

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


def defended_gradients(
    defense: Defense,
    model: keras.Model,
    images: tf.Tensor,
    targets: tf.Tensor,
    seed: tf.Tensor,
) -> Gradients:
    """The gradient a client shares for one batch under ``defense``.

    This is the one code path that both the attack side (the observed gradient) and the trainer
    (the update) use, so that both see the same defended gradient. A batch-level defense gets
    the batch gradient (`leakbench.models.loss_and_gradients`); an example-level one gets
    the per-example gradients (`leakbench.per_example.per_example_losses_and_gradients`) and
    reduces them itself. Works eagerly and
    inside a ``tf.function``, where it traces once per input shape: new seed or image values
    reuse the trace.

    Args:
        defense: The defense (its ``level`` is read on the instance, as chains set it there).
        model: The Keras model whose ``trainable_variables`` the gradient is taken for.
        images: The client's batch of inputs, shape ``[B, ...]``.
        targets: Label distributions, shape ``[B, num_classes]``.
        seed: int32/int64 tensor of shape [2], the defense's only source of randomness.

    Returns:
        The defended batch gradient, ordered like ``model.trainable_variables``.
    """
    return defended_loss_and_gradients(defense, model, images, targets, seed)[1]


def defended_loss_and_gradients(
    defense: Defense,
    model: keras.Model,
    images: tf.Tensor,
    targets: tf.Tensor,
    seed: tf.Tensor,
) -> tuple[tf.Tensor, Gradients]:
    """`defended_gradients` together with the batch's (undefended) mean task loss, from the
    same forward pass (the trainer reports the loss and must not pay a second forward pass)."""
    if defense.level == "example":
        losses, grads = per_example_losses_and_gradients(model, images, targets)
        loss = tf.reduce_mean(losses)
    else:
        loss, grads = loss_and_gradients(model, images, targets)
    return loss, list(defense(list(grads), seed=seed))
