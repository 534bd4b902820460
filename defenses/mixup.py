"""MixUp as a gradient-leakage defense: the client shares the gradient of mixed examples."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import tensorflow as tf

from leakbench.core.errors import ConfigError
from leakbench.core.params import Int, Number, param
from leakbench.defenses.base import (
    DEFENSES,
    AdaptiveSetting,
    Defense,
    Gradients,
    Sample,
    prepare_seed,
    tensor_seed,
)


def mixing_weights(batch: tf.Tensor, mixed: int, alpha: float, seed: tf.Tensor) -> tf.Tensor:
    """``[B, mixed]`` weights of each mixed example, each row a draw from the symmetric
    Dirichlet distribution with concentration ``alpha`` (normalised Gamma draws)."""
    draws = tf.random.stateless_gamma(
        tf.stack([batch, mixed]), seed=tensor_seed(seed, 0), alpha=alpha, dtype=tf.float32
    )
    return draws / tf.reduce_sum(draws, axis=1, keepdims=True)


def partners(batch: tf.Tensor, mixed: int, seed: tf.Tensor) -> tf.Tensor:
    """``[mixed, B]`` example indices: row 0 is the batch itself, row ``j`` the batch shifted
    cyclically by ``s_j``, where ``s_1 .. s_{k-1}`` are distinct offsets drawn from ``1 .. B -
    1``. So mixed example ``b`` combines ``mixed`` distinct examples (never itself twice), and
    every example enters exactly ``mixed`` of the mixed ones."""
    noise = tf.random.stateless_uniform(tf.reshape(batch - 1, [1]), seed=tensor_seed(seed, 1))
    offsets = 1 + tf.argsort(noise, stable=True)[: mixed - 1]
    rows = tf.range(batch)[None, :] + tf.concat([[0], offsets], 0)[:, None]
    return tf.math.floormod(rows, batch)


@DEFENSES.register("mixup")
@dataclasses.dataclass(frozen=True)
class MixUp(Defense):
    """The client computes its gradient on mixed examples instead of its own.

    Mixed example ``b`` is ``sum_j w_bj x_{p_j(b)}`` with label distribution ``sum_j w_bj
    y_{p_j(b)}``, where ``p_0`` is the identity, ``p_1 .. p_{k-1}`` are cyclic shifts of the
    batch by distinct random offsets (`partners`) and ``w_b`` is drawn from a symmetric
    Dirichlet(``alpha``) distribution: each shared example is a convex combination of ``k =
    mixed`` distinct examples of the client's. The batch must hold at least ``mixed`` examples
    (a check before the run). The gradient itself passes unchanged.

    Draws come from `prepare_seed` of the defense seed: weights from ``tensor_seed(., 0)``,
    offsets from ``tensor_seed(., 1)``.

    Unlike Huang et al., who mix with examples drawn from the client's whole dataset, the
    partners here come from the client's batch, as MixUp trains (Zhang et al.).

    Attributes:
        mixed: Examples combined into each shared one (``k``, 2-8; Huang et al. use 4).
        alpha: Dirichlet concentration (> 0); 1 draws the weights uniformly from the simplex.

    Reference:
        Zhang, Cisse, Dauphin and Lopez-Paz. "mixup: Beyond Empirical Risk Minimization".
        ICLR 2018. Huang, Gupta, Song, Li and Arora. "Evaluating Gradient Inversion Attacks
        and Defenses in Federated Learning". NeurIPS 2021 (MixUp as a defense).
    """

    name: ClassVar[str] = "mixup"
    level: ClassVar[str] = "batch"
    summary: ClassVar[str] = (
        "MixUp as a defense (Huang et al., NeurIPS 2021): each shared example is a "
        "Dirichlet(`alpha`)-weighted mix of `mixed` examples of the client's batch, labels "
        "mixed alike; needs `batch_size >= mixed`"
    )
    # Random in the batch it prepares, not in the gradient.
    samples: ClassVar[tuple[Sample, ...]] = (Sample({"mixed": 2}),)
    # The attacker who knows the client mixes its batch learns the mixing with the images.
    adaptive: ClassVar[tuple[AdaptiveSetting, ...]] = (AdaptiveSetting({"mixing": "learn"}),)

    mixed: int = param(4, Int(2, 8), doc="examples combined into each shared one")
    alpha: float = param(1.0, Number(0.0, 100.0, low_open=True), doc="Dirichlet concentration")

    def check_client(self, batch_size: int) -> None:
        if batch_size < self.mixed:
            raise ConfigError(
                f"defense mixup mixes {self.mixed} examples of the client's batch, so "
                f"batch_size must be at least {self.mixed}, got {batch_size}"
            )

    def __call__(self, grads: Gradients, *, seed: tf.Tensor) -> Gradients:
        del seed
        return list(grads)

    def prepare(
        self, images: tf.Tensor, targets: tf.Tensor, *, seed: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor]:
        seed = prepare_seed(seed)
        images = tf.convert_to_tensor(images)
        targets = tf.convert_to_tensor(targets)
        batch = tf.shape(images)[0]
        weights = mixing_weights(batch, self.mixed, self.alpha, seed)  # [B, k]
        picks = partners(batch, self.mixed, seed)  # [k, B]

        def mix(values: tf.Tensor) -> tf.Tensor:
            gathered = tf.gather(values, picks)  # [k, B, ...]
            w = tf.transpose(tf.cast(weights, values.dtype))  # [k, B]
            w = tf.reshape(w, tf.concat([tf.shape(w), tf.ones([tf.rank(values) - 1], tf.int32)], 0))
            return tf.reduce_sum(w * gathered, axis=0)

        return mix(images), mix(targets)
