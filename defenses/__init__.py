"""Gradient defenses; importing this package registers every defense.

Adding a defense is one new module with one ``@DEFENSES.register(...)`` class, imported below so
that the registry (and the contract tests that iterate over it) see it.
"""

from __future__ import annotations

from leakbench.defenses import (
    chain,
    clip,
    dpsgd,
    fp16,
    gaussian,
    int8,
    laplace,
    none,
    prune,
    topk,
)
from leakbench.defenses.base import (
    DEFENSES,
    Defense,
    Gradients,
    defended_gradients,
    make_defense,
    tensor_seed,
)
from leakbench.defenses.chain import Chain
from leakbench.defenses.clip import ClipGlobalNorm
from leakbench.defenses.dpsgd import DPSGD
from leakbench.defenses.fp16 import Float16
from leakbench.defenses.gaussian import GaussianNoise
from leakbench.defenses.int8 import Int8
from leakbench.defenses.laplace import LaplaceNoise
from leakbench.defenses.none import NoDefense
from leakbench.defenses.prune import Prune
from leakbench.defenses.topk import TopK

__all__ = [
    "DEFENSES",
    "DPSGD",
    "Chain",
    "ClipGlobalNorm",
    "Defense",
    "Float16",
    "GaussianNoise",
    "Gradients",
    "Int8",
    "LaplaceNoise",
    "NoDefense",
    "Prune",
    "TopK",
    "chain",
    "clip",
    "defended_gradients",
    "dpsgd",
    "fp16",
    "gaussian",
    "int8",
    "laplace",
    "make_defense",
    "none",
    "prune",
    "tensor_seed",
    "topk",
]
