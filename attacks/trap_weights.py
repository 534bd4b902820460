"""A malicious server's trap weights: dense units that each fire for few inputs.

Boenisch, Dziedzic, Schuster, Shamsabadi, Shumailov and Papernot, "When the Curious Abandon
Honesty: Federated Learning Is Not Private", IEEE EuroS&P 2023.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import keras
import numpy as np
import tensorflow as tf

from leakbench.attacks.base import ATTACKS, RETRIES, Attack, AttackTarget, RunOutput
from leakbench.attacks.imprint import GAIN, padded, read_out, stem_gradients, unreadable
from leakbench.components.stem import set_stem_weights, with_dense_stem
from leakbench.core.params import Int, Number, param

# Below this share of the largest bias signal a unit counts as silent (no example fired it).
SILENT_UNIT = 1e-6
# Two candidates closer than this (mean squared difference) are one input read twice: units
# that one example fires alone all give it exactly, mixtures of different examples differ.
SAME_INPUT = 1e-9


def recovery_chance(units: int, rate: float, examples: int) -> float:
    """The chance that at least one of ``units`` independent units, each firing for an input
    with probability ``rate``, fires for one given example of ``examples`` and for no other:
    ``1 - (1 - rate * (1 - rate) ** (examples - 1)) ** units``."""
    alone = rate * (1.0 - rate) ** (examples - 1)
    return 1.0 - (1.0 - alone) ** units


def trap_kernel(public: np.ndarray, units: int, rate: float, seed: int) -> np.ndarray:
    """A kernel of ``units`` columns, each firing (``w . x > 0``) for the share ``rate`` of the
    ``public`` inputs (non-negative images, flattened): Gaussian magnitudes with random signs,
    the negative entries scaled per unit so that the ``1 - rate`` quantile of the ratio of the
    positive part to the negative part over the public inputs is the firing point."""
    rng = np.random.default_rng([seed, 0x7A9])
    size = public.shape[1]
    magnitude = np.abs(rng.standard_normal((size, units)))
    negative = rng.random((size, units)) < 0.5
    positive_part = public @ np.where(negative, 0.0, magnitude)
    negative_part = public @ np.where(negative, magnitude, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(negative_part > 0, positive_part / negative_part, np.inf)
    scale = np.quantile(ratio, 1.0 - rate, axis=0)
    scale = np.where(np.isfinite(scale), scale, np.nanmax(np.where(np.isfinite(ratio), ratio, 0)))
    return np.where(negative, -magnitude * scale, magnitude)


def distinct_inputs(candidates: np.ndarray, strength: np.ndarray) -> list[np.ndarray]:
    """The candidates grouped into inputs read more than once (within `SAME_INPUT`), strongest
    first within a group; returns the groups' member indices: groups whose image lies in the
    pixel range [0, 1] first, then larger groups, then by the strongest member's signal."""
    order = np.argsort(-strength, kind="stable")
    groups: list[list[int]] = []
    leaders: list[int] = []
    for i in order:
        if leaders:
            gap = np.mean((candidates[leaders] - candidates[i]) ** 2, axis=1)
            nearest = int(np.argmin(gap))
            if gap[nearest] <= SAME_INPUT:
                groups[nearest].append(int(i))
                continue
        leaders.append(int(i))
        groups.append([int(i)])
    # An image's pixels lie in [0, 1]; a weighted mean with weights of both signs often not.
    valid = np.all((candidates >= -1e-6) & (candidates <= 1.0 + 1e-6), axis=1)
    groups.sort(key=lambda g: (not valid[g[0]], -len(g), -strength[g[0]]))
    return [np.asarray(g) for g in groups]


@ATTACKS.register("trap_weights")
@dataclasses.dataclass(frozen=True)
class TrapWeights(Attack):
    """Reads examples off trap units (Boenisch et al., 2023, "When the Curious Abandon Honesty").

    The server ships the model behind a dense block (`leakbench.components.stem`) of ``units``
    ReLU units without bias offset, each set to fire for the share ``rate`` of the public images
    (the split the private examples are not drawn from): Gaussian weights with random signs, the
    negative ones scaled per unit (`trap_kernel`). A unit that one example of the batch fires
    alone has the kernel gradient ``g x`` and the bias gradient ``g``, so ``x = dW_j / db_j``
    exactly; a unit fired by several gives their weighted mean. With independent units an
    example is read exactly with probability `recovery_chance`.

    The attacker never sees which units fired for one example. It groups the candidates of all
    units that fired, puts together the ones that agree to rounding (the same example read by
    several units; mixtures of different sets of examples differ), and returns one image per
    group, ``batch_size`` of them (then their mean when there are fewer): images inside the
    pixel range first (a weighted mean with weights of both signs often leaves it), then the groups
    read most often, then by signal. The loss reported is the share of the batch that no group
    read twice accounts for. Labels come from the last layer's gradient unless known.

    Args:
        units: Units of the trap block.
        rate: The share of public images each unit fires for (about ``1 / batch size`` makes a
            unit fire for exactly one example most often).
        gain: The scale of the block's units, as `leakbench.attacks.imprint.Imprint`'s.
        retries: Kept for the common interface; the attack is deterministic.

    Reference:
        Boenisch, Dziedzic, Schuster, Shamsabadi, Shumailov and Papernot. "When the Curious
        Abandon Honesty: Federated Learning Is Not Private". IEEE EuroS&P 2023.
    """

    name: ClassVar[str] = "trap_weights"
    server: ClassVar[str] = "malicious"

    units: int = param(1000, Int(1, 65_536), doc="units of the trap block")
    rate: float = param(
        0.02, Number(0.0, 1.0, low_open=True, high_open=True), doc="share of inputs firing a unit"
    )
    gain: float = param(GAIN, Number(0.0, 1.0, low_open=True), doc="scale of the block's units")
    retries: int = param(0, RETRIES, doc="kept for the common interface; a retry repeats")

    def malicious_model(self, model: keras.Model, public: np.ndarray, seed: int) -> keras.Model:
        input_shape = tuple(int(d) for d in model.input_shape[1:])
        size = math.prod(input_shape)
        flat = np.asarray(public, np.float64).reshape(len(public), size)
        shipped, stem, back = with_dense_stem(model, input_shape, self.units)
        kernel = trap_kernel(flat, self.units, self.rate, seed)
        set_stem_weights(stem, back, kernel, np.zeros(self.units), self.gain)
        return shipped

    def run(self, target: AttackTarget, seed: tf.Tensor) -> RunOutput:
        del seed  # deterministic
        kernel, bias = stem_gradients(target)
        batch = target.batch_size
        strength = np.abs(bias)
        if not np.isfinite(strength).all() or strength.max(initial=0.0) == 0.0:
            return unreadable(target)
        fired = np.flatnonzero(strength > SILENT_UNIT * strength.max())
        candidates = (kernel[:, fired] / bias[fired]).T
        groups = distinct_inputs(candidates, strength[fired])[:batch]
        images = padded(candidates[[int(group[0]) for group in groups]], batch)
        repeated = sum(1 for g in groups if len(g) > 1)
        return read_out(target, images, 1.0 - repeated / batch)
