"""Soteria: pruning the representation layer's gradient (Sun et al., CVPR 2021)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from leakbench.core.params import REQUIRED, Number, param
from leakbench.defenses.base import (
    DEFENSES,
    AdaptiveSetting,
    ClientView,
    Defense,
    Gradients,
    Sample,
)

# As in `prune`: the count is floor(share * units + slack), so that decimal shares such as 0.3
# of 10 units prune 3 despite float round-off.
_COUNT_SLACK = 1e-6


def unit_scores(view: ClientView) -> tf.Tensor:
    """Soteria's score of every representation unit ``f``: ``sum_b ||d r_f / d x_b|| /
    (|r_bf| + 1e-10)``, summed over the batch's examples ``b``, shape ``[F]``.

    ``r = view.representation(x)`` is the input of the output layer. The derivative is that of
    ``sum_b r_bf`` with respect to each example's image, as the reference implementation
    back-propagates a column of ones. A small score marks a unit whose value is large against
    how much it moves with the image: perturbing it moves the reconstruction most, so Soteria
    prunes the units with the smallest scores.
    """
    images = tf.convert_to_tensor(view.images)
    with tf.GradientTape() as tape:
        tape.watch(images)
        features = view.representation(images)
        totals = tf.reduce_sum(features, axis=0)
    # [F, B, ...]: one backward pass per unit, vectorised.
    jacobian = tape.jacobian(totals, images, experimental_use_pfor=True)
    units = tf.shape(jacobian)[0]
    batch = tf.shape(jacobian)[1]
    sensitivity = tf.norm(tf.reshape(jacobian, [units, batch, -1]), axis=-1)  # [F, B]
    ratio = sensitivity / (tf.abs(tf.transpose(features)) + 1e-10)
    return tf.reduce_sum(ratio, axis=1)


def smallest_mask(scores: tf.Tensor, count: tf.Tensor) -> tf.Tensor:
    """A float mask over ``scores`` [F] with zeros at the ``count`` smallest scores (ties:
    the lower index first) and ones elsewhere."""
    order = tf.argsort(scores, stable=True)
    ranks = tf.scatter_nd(order[:, None], tf.range(tf.size(scores)), tf.shape(scores))
    return tf.cast(ranks >= count, tf.float32)


@DEFENSES.register("soteria")
@dataclasses.dataclass(frozen=True)
class Soteria(Defense):
    """Zeroes the output layer's kernel gradient for the representation units that leak most.

    The representation ``r`` is the input of the model's output (last dense) layer. For every
    unit ``f`` the client computes `unit_scores` (the paper's ``||d r_f / d X|| / ||r_f||``,
    summed over its batch) and prunes the ``floor(share * F)`` units with the smallest scores:
    row ``f`` of the output layer's kernel gradient becomes zero. Every other gradient tensor
    (the feature extractor's, the output layer's bias) is shared unchanged, as in the paper,
    which is why an attack on those tensors alone is the adaptive answer (``match =
    "features"`` in `dlg`, `idlg` and `ig`).

    The scores are exact per unit (one vectorised Jacobian of the representation with respect
    to the images, not the paper's per-unit loop); ties are broken by unit index. The defense
    reads the client's batch and the model (`Defense.needs_view`); it draws nothing random.

    Attributes:
        share: Share of representation units pruned, in ``[0, 1]`` (the paper's pruning rate:
            it reports 40-80%). ``0`` is the identity.

    Reference:
        Sun, Li, Wang, Liu, Zhang, Chen and Li. "Soteria: Provable Defense against Privacy
        Leakage in Federated Learning from Representation Perspective". CVPR 2021.
    """

    name: ClassVar[str] = "soteria"
    level: ClassVar[str] = "batch"
    summary: ClassVar[str] = (
        "Soteria (Sun et al., CVPR 2021): the rows of the output layer's kernel gradient for "
        "the `share` of representation units with the smallest score `sum_b ||d r_f / d x_b|| "
        "/ |r_bf|` are zeroed; every other tensor is shared intact"
    )
    samples: ClassVar[tuple[Sample, ...]] = (Sample({"share": 0.5}),)
    needs_view: ClassVar[bool] = True
    # Soteria perturbs only the representation layer: the feature extractor's tensors are intact.
    adaptive: ClassVar[tuple[AdaptiveSetting, ...]] = (AdaptiveSetting({"match": "features"}),)

    share: float = param(REQUIRED, Number(0.0, 1.0), doc="share of representation units pruned")

    def __call__(self, grads: Gradients, *, seed: tf.Tensor) -> Gradients:
        del grads, seed
        raise TypeError(
            "defense soteria reads the client's batch: call apply(grads, seed=..., view=...) "
            "(leakbench.client does)"
        )

    def apply(
        self, grads: Gradients, *, seed: tf.Tensor, view: ClientView | None = None
    ) -> Gradients:
        del seed
        out = list(grads)
        if not out or self.share == 0.0:
            return out
        if view is None:
            raise TypeError("defense soteria needs the client's view of its batch (view=...)")
        kernel = tf.convert_to_tensor(out[view.head_kernel])
        units = tf.cast(tf.shape(kernel)[0], tf.float64)
        count = tf.cast(tf.floor(self.share * units + _COUNT_SLACK), tf.int32)
        mask = smallest_mask(unit_scores(view), count)
        # One mask entry per row of the kernel, broadcast over the rest of its axes.
        shape = tf.concat([[-1], tf.ones([tf.rank(kernel) - 1], tf.int32)], 0)
        out[view.head_kernel] = kernel * tf.cast(tf.reshape(mask, shape), kernel.dtype)
        return out
