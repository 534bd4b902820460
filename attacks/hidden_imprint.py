"""A malicious server's imprint block that hides from the client's D-SNR check.

The plain imprint block (`leakbench.attacks.imprint`) is caught by the client's check
(`leakbench.components.dsnr`): its highest units fire for one or two examples of the batch, so
one example owns their gradient. Garov et al. ("Hiding in Plain Sight: Disguising Data Stealing
Attacks in Federated Learning", ICLR 2024) argue that a server who knows the check keeps every
part of the update shared by many examples while still isolating some. This attack does that
for the imprint block: every unit fires for a crowd of the batch.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from leakbench.attacks.base import ATTACKS
from leakbench.attacks.imprint import Imprint
from leakbench.core.params import Number, param


def crowded_thresholds(values: np.ndarray, bins: int, crowd: float) -> np.ndarray:
    """``bins`` increasing thresholds over the public measurements ``values``: the first below
    every value, the last at their ``1 - crowd`` quantile, the ones between cutting the lower
    ``1 - crowd`` of them into ``bins - 1`` equally likely intervals. Every unit then fires for
    at least the share ``crowd`` of the public inputs (those above the last threshold)."""
    low = float(values.min()) - float(np.ptp(values)) - 1.0
    levels = (1.0 - crowd) * np.arange(1, bins) / (bins - 1)
    return np.concatenate([[low], np.quantile(values, levels)])


def hidden_singleton_share(bins: int, crowd: float, examples: int) -> float:
    """The expected share of ``examples`` alone in their interval when each falls,
    independently, in one of the ``bins - 1`` narrow intervals (each with probability
    ``(1 - crowd) / (bins - 1)``) or in the top one (probability ``crowd``)."""
    narrow = (1.0 - crowd) / (bins - 1)
    alone_low = (1.0 - crowd) * (1.0 - narrow) ** (examples - 1)
    alone_top = crowd * (1.0 - crowd) ** (examples - 1)
    return alone_low + alone_top


@ATTACKS.register("hidden_imprint")
@dataclasses.dataclass(frozen=True)
class HiddenImprint(Imprint):
    """An imprint block whose every unit fires for a crowd of the batch (after Garov et al.,
    ICLR 2024, "Hiding in Plain Sight").

    The block is `Imprint`'s: ``bins`` ReLU units measuring the input along one direction,
    unit ``i`` firing above the threshold ``t_i``, the map back with equal weights. Only the
    thresholds differ (`crowded_thresholds`): the highest sits at the ``1 - crowd`` quantile of
    the public measurements, so every unit fires for about ``crowd`` of the batch, and a unit's
    gradient is a sum over that many examples, as an honest model's is. The client's D-SNR of
    the block (the largest example's share of a unit's gradient over the others') then falls
    to about ``1 / (crowd * B)`` times the spread of the examples' shares, instead of infinity.
    The ``bins - 1`` narrow intervals below still isolate the examples of the lower ``1 -
    crowd`` of the measurement, which come back exactly when alone (differences of adjacent
    units, as `Imprint` reads them); the crowd above the highest threshold comes back as one
    weighted mean. The expected share read exactly is `hidden_singleton_share`.

    Args:
        bins: Units of the block (and so intervals).
        crowd: The share of public inputs above the highest threshold: every unit fires for at
            least these. Larger hides better (a lower D-SNR) and reads fewer examples.
        measurement: As `Imprint`'s.
        gain: As `Imprint`'s.
        retries: Kept for the common interface; the attack is deterministic.

    Reference:
        Garov, Dimitrov, Jovanovic and Vechev. "Hiding in Plain Sight: Disguising Data
        Stealing Attacks in Federated Learning". ICLR 2024.
    """

    name: ClassVar[str] = "hidden_imprint"
    server: ClassVar[str] = "malicious"

    crowd: float = param(
        0.5,
        Number(0.0, 1.0, low_open=True, high_open=True),
        doc="share of inputs every unit fires for",
    )

    def cuts(self, values: np.ndarray) -> np.ndarray:
        return crowded_thresholds(values, self.bins, self.crowd)
