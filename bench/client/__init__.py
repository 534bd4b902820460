"""The client floor, beside the attacks: what a federated client computes and shares
(`update`: the defended gradient or local-training change, one code path for the attacker's
view and the trainer), and the training that measures a defense's cost in accuracy
(`recipes`, `training`, `selection`).

The names of `update` are importable from here as well (``from leakbench.client import
observer``), as they were when the client was one module.
"""

from __future__ import annotations

from leakbench.client.update import (
    ClientStep,
    batch_statistics,
    check_model,
    client_view,
    defended_gradients,
    defended_step,
    defended_update,
    local_change,
    local_weights,
    observer,
)
from leakbench.modalities.image import NOISE_STREAM

__all__ = [
    "NOISE_STREAM",
    "ClientStep",
    "batch_statistics",
    "check_model",
    "client_view",
    "defended_gradients",
    "defended_step",
    "defended_update",
    "local_change",
    "local_weights",
    "observer",
]
