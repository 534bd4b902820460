"""A malicious server's imprint block: whole examples read off the shared update.

Fowl, Geiping, Czaja, Goldblum and Goldstein, "Robbing the Fed: Directly Obtaining Private Data
in Federated Learning with Modified Models", ICLR 2022.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import keras
import numpy as np
import tensorflow as tf

from leakbench.attacks.base import ATTACKS, RETRIES, Attack, AttackTarget, RunOutput
from leakbench.attacks.labels import recover_labels
from leakbench.components.stem import STEM, set_stem_weights, with_dense_stem
from leakbench.core.errors import ConfigError
from leakbench.core.params import Choice, Int, Number, param

# The default scale of a shipped block's units: the units compute ``gain`` times their
# measurement and the map back divides by it, so the model computes the same function for any
# gain, while the block's gradient grows as 1 / gain and outweighs the rest of the update (and
# noise of a fixed scale). Breaching's imprint block uses the same default.
GAIN = 1e-3

# Below this share of the largest bin signal a bin counts as empty: an empty bin's two bias
# gradients are sums of the same terms, so their difference is zero up to rounding.
EMPTY_BIN = 1e-6


def singleton_share(bins: int, examples: int) -> float:
    """The expected share of ``examples`` alone in their bin when each falls, independently, in
    one of ``bins`` equally likely bins: ``(1 - 1 / bins) ** (examples - 1)``."""
    return (1.0 - 1.0 / bins) ** (examples - 1)


def padded(found: np.ndarray, batch: int) -> np.ndarray:
    """``batch`` flattened images: those ``found``, then, for the examples the update did not
    resolve, the attacker's best guess for an unknown image of the batch, the mean of those
    found (in the pixel range)."""
    images = np.repeat(np.clip(found, 0.0, 1.0).mean(axis=0, keepdims=True), batch, axis=0)
    images[: len(found)] = found
    return images


def stem_gradients(target: AttackTarget) -> tuple[np.ndarray, np.ndarray]:
    """The update's part for the shipped block's units: kernel ``[inputs, units]`` and bias
    ``[units]``, in float64."""
    stem = target.model.get_layer(STEM)
    variables = target.model.trainable_variables
    grads = {id(v): g for v, g in zip(variables, target.gradients, strict=True)}
    return np.asarray(grads[id(stem.kernel)], np.float64), np.asarray(
        grads[id(stem.bias)], np.float64
    )


def unreadable(target: AttackTarget) -> RunOutput:
    """The result of an update whose block carries nothing (all zero, or not finite)."""
    batch = target.batch_size
    nan = np.full((batch, *target.input_shape), np.nan, np.float32)
    return RunOutput(nan, np.zeros(batch, np.int64), float("nan"), np.array([np.nan]), 0)


def read_out(target: AttackTarget, images: np.ndarray, loss: float) -> RunOutput:
    """A malicious attack's result: ``images`` (flattened), the labels (the target's, or
    recovered from the last layer's gradient) and ``loss``, the attacker's own view of what
    the update left unexplained."""
    shape = (target.batch_size, *target.input_shape)
    if target.labels is not None:
        labels = np.asarray(target.labels, np.int64)
    else:
        labels = recover_labels(
            target.model, target.gradients, shape[0], target.num_classes, input_shape=shape[1:]
        )
    return RunOutput(
        images=images.reshape(shape).astype(np.float32),
        labels=labels,
        loss=loss,
        loss_history=np.array([loss], np.float32),
        evaluations=0,
    )


def measurement(kind: str, size: int, seed: int) -> np.ndarray:
    """The direction every unit of the block measures the flattened input along: the mean of
    its values, or a seeded Gaussian direction (unit length)."""
    if kind == "mean":
        return np.full(size, 1.0 / size)
    direction = np.random.default_rng([seed, 0x1A9B]).standard_normal(size)
    return direction / np.linalg.norm(direction)


def measured(images: np.ndarray, direction: np.ndarray, block: int = 512 * 2**20) -> np.ndarray:
    """Every image's measurement ``direction . x`` (flattened, in float64), with at most
    ``block`` bytes of float64 images at a time: 800 public images of 224 x 224 x 3 would be
    960 MB. Images that fit are measured in one product (as before blocks existed: a product
    over fewer rows may round differently)."""
    flat = np.asarray(images).reshape(len(images), -1)
    rows = max(1, block // (8 * max(flat.shape[1], 1)))
    return np.concatenate(
        [flat[k : k + rows].astype(np.float64) @ direction for k in range(0, len(flat), rows)]
    )


def thresholds(values: np.ndarray, bins: int) -> np.ndarray:
    """``bins`` increasing thresholds that cut ``values`` (the public measurements) into
    ``bins`` equally likely intervals: the first lies below every value (by their range), the
    others at the ``i / bins`` quantiles."""
    low = float(values.min()) - float(np.ptp(values)) - 1.0
    return np.concatenate([[low], np.quantile(values, np.arange(1, bins) / bins)])


@ATTACKS.register("imprint")
@dataclasses.dataclass(frozen=True)
class Imprint(Attack):
    """Reads examples off a malicious imprint block (Fowl et al., 2022, "Robbing the Fed").

    The server ships the model behind a block (`leakbench.components.stem`) of ``bins`` ReLU
    units that all measure the flattened input ``x`` along one direction ``m`` (``measurement``:
    the mean value, or a seeded random direction), unit ``i`` with the bias ``-t_i``: ``t`` are
    the quantiles of ``m . x`` over public images (the dataset's split that the private examples
    are not drawn from), so each interval ``[t_i, t_{i+1})`` holds an equal share of them. A map
    back with equal weights makes the gradient reaching every active unit the same number
    ``g_n`` for example ``n``, so unit ``i``'s kernel gradient is ``sum g_n x_n`` and its bias
    gradient ``sum g_n`` over the examples with ``m . x_n >= t_i``. The difference of two
    adjacent units isolates the examples of one interval: an example alone in its interval is
    ``x = (dW_i - dW_{i+1}) / (db_i - db_{i+1})`` exactly, whatever the batch size and under
    secure aggregation (a sum over clients is a sum over more examples). Several examples in
    one interval give their weighted mean.

    The attack returns the ``batch_size`` intervals with the largest bias signal (every
    non-empty interval when there are fewer, then the mean of those as its guess for the rest); it
    never sees which intervals hold one example. With equally likely intervals an example is
    alone in its own with probability `singleton_share`. The loss reported is the share of the
    batch that the non-empty intervals cannot account for (0 when there are as many as
    examples). Labels come from the last layer's gradient
    (`leakbench.attacks.labels.recover_labels`) unless known.

    Args:
        bins: Units of the imprint block, and so intervals (the paper's 128 for ImageNet).
        measurement: ``"random"`` (a seeded Gaussian direction, the default) or ``"mean"``
            (the average pixel value, i.e. brightness).
        gain: The scale of the block's units (`GAIN`): the map back divides by it, so the
            shipped model computes the same function, and the block's share of the update grows
            as ``1 / gain`` (against noise of a fixed scale and against the rest of the update
            under per-example clipping).
        retries: Kept for the common interface; the attack is deterministic.

    Reference:
        Fowl, Geiping, Czaja, Goldblum and Goldstein. "Robbing the Fed: Directly Obtaining
        Private Data in Federated Learning with Modified Models". ICLR 2022.
    """

    name: ClassVar[str] = "imprint"
    server: ClassVar[str] = "malicious"

    bins: int = param(128, Int(2, 65_536), doc="units of the imprint block (intervals)")
    measurement: str = param("random", Choice("random", "mean"), doc="what the units measure")
    gain: float = param(GAIN, Number(0.0, 1.0, low_open=True), doc="scale of the block's units")
    retries: int = param(0, RETRIES, doc="kept for the common interface; a retry repeats")

    def malicious_model(self, model: keras.Model, public: np.ndarray, seed: int) -> keras.Model:
        input_shape = tuple(int(d) for d in model.input_shape[1:])
        size = math.prod(input_shape)
        if len(public) < self.bins:
            raise ConfigError(
                f"attack {self.name}: {self.bins} bins need at least as many public images, the "
                f"split the private examples are not drawn from holds {len(public)}"
            )
        direction = measurement(self.measurement, size, seed)
        cuts = self.cuts(measured(public, direction))
        shipped, stem, back = with_dense_stem(model, input_shape, self.bins)
        kernel = np.repeat(direction[:, None], self.bins, axis=1)
        set_stem_weights(stem, back, kernel, -cuts, self.gain)
        return shipped

    def cuts(self, values: np.ndarray) -> np.ndarray:
        """The units' thresholds from the public measurements ``values``: equally likely
        intervals (`thresholds`)."""
        return thresholds(values, self.bins)

    def run(self, target: AttackTarget, seed: tf.Tensor) -> RunOutput:
        del seed  # deterministic
        kernel, bias = stem_gradients(target)
        # Interval i holds the examples active at unit i but not at unit i + 1.
        kernel_bins = kernel - np.concatenate([kernel[:, 1:], np.zeros_like(kernel[:, :1])], axis=1)
        bias_bins = bias - np.concatenate([bias[1:], [0.0]])
        strength = np.abs(bias_bins)
        batch = target.batch_size
        if not np.isfinite(strength).all() or strength.max(initial=0.0) == 0.0:
            return unreadable(target)
        occupied = np.flatnonzero(strength > EMPTY_BIN * strength.max())
        chosen = occupied[np.argsort(-strength[occupied], kind="stable")][:batch]
        found = (kernel_bins[:, chosen] / bias_bins[chosen]).T
        unexplained = max(0.0, 1.0 - len(occupied) / batch)
        return read_out(target, padded(found, batch), unexplained)
