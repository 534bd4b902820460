"""Gradient defenses; importing this package registers every defense.

Adding a defense is one new module with one ``@DEFENSES.register(...)`` class, imported below so
that the registry (and the contract tests that iterate over it) see it.
"""

from __future__ import annotations

from leakbench.defenses import chain, clip, gaussian, laplace, none, prune
from leakbench.defenses.base import DEFENSES, Defense, Gradients, make_defense, tensor_seed
from leakbench.defenses.chain import Chain
from leakbench.defenses.clip import ClipGlobalNorm
from leakbench.defenses.gaussian import GaussianNoise
from leakbench.defenses.laplace import LaplaceNoise
from leakbench.defenses.none import NoDefense
from leakbench.defenses.prune import Prune

__all__ = [
    "DEFENSES",
    "Chain",
    "ClipGlobalNorm",
    "Defense",
    "GaussianNoise",
    "Gradients",
    "LaplaceNoise",
    "NoDefense",
    "Prune",
    "chain",
    "clip",
    "gaussian",
    "laplace",
    "make_defense",
    "none",
    "prune",
    "tensor_seed",
]
