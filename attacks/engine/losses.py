"""Matching losses: how far the dummy batch's gradient is from the observed one.

A matching loss is a function ``(dummy, observed) -> [N]``: two lists of gradient tensors,
ordered like the model's trainable variables and each with a leading axis of N problems, in;
one distance per problem out. It must be differentiable with TensorFlow ops (the attacks
minimise it through the dummy batch), finite at a zero gradient, and zero where the two
gradients are equal. The gradient-matching attacks (``dlg``, ``idlg``) take its name as their
``loss`` parameter.

A new loss is registered with ``@LOSSES.register("name")`` in Python, or by an installed package
as an entry point in the ``leakbench.losses`` group whose object is the function (its name is
the entry-point name; see `leakbench.core.plugins`)::

    [project.entry-points."leakbench.losses"]
    l1 = "my_package.losses:l1_distance"
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from leakbench.core.plugins import adopt_function
from leakbench.core.registry import Registry

MatchingLoss = Callable[[list[tf.Tensor], list[tf.Tensor]], tf.Tensor]

LOSSES: Registry[MatchingLoss] = Registry("matching loss")


def _per_problem(tensors: list[tf.Tensor]) -> tf.Tensor:
    """The sum over every tensor of the list, for each problem: [N, ...] tensors -> [N]."""
    return tf.add_n([tf.reduce_sum(t, axis=list(range(1, len(t.shape)))) for t in tensors])


@LOSSES.register("l2")
def squared_l2(dummy: list[tf.Tensor], observed: list[tf.Tensor]) -> tf.Tensor:
    """DLG's matching loss per problem: the squared L2 distance summed over all gradient
    tensors, for [N, ...] tensors; returns [N]."""
    return _per_problem([tf.square(d - o) for d, o in zip(dummy, observed, strict=True)])


@LOSSES.register("l1")
def absolute_l1(dummy: list[tf.Tensor], observed: list[tf.Tensor]) -> tf.Tensor:
    """The L1 distance per problem, summed over all gradient tensors, for [N, ...] tensors;
    returns [N]. Under additive Laplace noise it is the negative log-likelihood of the observed
    gradient up to constants, so it is the maximum-likelihood matching loss against the Laplace
    defense (as squared L2 is against Gaussian noise)."""
    return _per_problem([tf.abs(d - o) for d, o in zip(dummy, observed, strict=True)])


@LOSSES.register("cosine")
def cosine_distance(dummy: list[tf.Tensor], observed: list[tf.Tensor]) -> tf.Tensor:
    """Inverting Gradients' matching loss per problem: one minus the cosine of the angle between
    the two gradients with all tensors concatenated, for [N, ...] tensors; returns [N]. It does
    not change when either gradient is scaled by a positive factor (as norm clipping does).

    It is computed as half the squared distance between the two gradients scaled to unit
    length, which equals one minus the cosine in exact arithmetic. The textbook form
    ``1 - dot / (|a| |b|)`` subtracts two numbers that agree to many digits where the angle is
    small: in float32 its value is rounding noise below about 1e-7, and L-BFGS, whose line search
    and stall test compare values, stops long before the gradients match (engine 7 and older:
    `idlg` stalled at 33-35 dB on MNIST and at 8-10 dB on CIFAR-10, near a distance of 1e-4,
    where it now recovers the digits and reaches 21-43 dB; `docs/attacks.md`). The difference
    of the unit vectors keeps its relative precision down to distances of about 1e-14. A zero
    gradient counts as the zero vector: its distance is one half.
    """
    dummy_unit = _unit(dummy)
    observed_unit = _unit(observed)
    return 0.5 * _per_problem(
        [tf.square(d - o) for d, o in zip(dummy_unit, observed_unit, strict=True)]
    )


def _unit(tensors: list[tf.Tensor]) -> list[tf.Tensor]:
    """Each problem's gradient, all tensors together, scaled to unit length ([N, ...] tensors);
    the small constant keeps a zero gradient's value and derivative finite."""
    norm = tf.sqrt(_per_problem([tf.square(t) for t in tensors]) + 1e-30)
    return [t / tf.reshape(norm, [-1] + [1] * (len(t.shape) - 1)) for t in tensors]


def _adopt(name: str, obj: object) -> bool:
    """Registers a plugin's loss function as ``name``."""
    return adopt_function(LOSSES, name, obj)


LOSSES.use_entry_points("leakbench.losses", _adopt)
