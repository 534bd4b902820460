"""Gradient defenses; importing this package registers every defense.

Adding a built-in defense is one new module with one ``@DEFENSES.register(...)`` class,
imported below so that the registry (and the contract tests that iterate over it) see it.

Researchers add their own without a fork, from this stable place:

* a `Defense` subclass (a frozen dataclass with ``name`` set and ``__call__(grads, *, seed)``)
  decorated with ``@DEFENSES.register("name")``;
* a plain function ``grads -> grads`` registered with ``defense_from_function("name", fn)`` or
  decorated with ``@function_defense("name")``;
* an installed package declaring entry points in the ``leakbench.defenses`` group (see
  `leakbench.core.plugins`).

Once registered, the name works in configs (``leakbench.run.config.parse_config``), in
``make_defense`` and in ``leakbench list``.
"""

from __future__ import annotations

from leakbench.core.plugins import adopt_component
from leakbench.defenses import (
    chain,
    clip,
    dpsgd,
    fp16,
    gaussian,
    int8,
    laplace,
    mixup,
    none,
    precode,
    prune,
    relative_noise,
    soteria,
    topk,
)
from leakbench.defenses.base import (
    DEFENSES,
    ClientView,
    Defense,
    Gradients,
    defense_from_function,
    function_defense,
    make_defense,
    prepare_seed,
    tensor_seed,
)
from leakbench.defenses.chain import Chain
from leakbench.defenses.clip import ClipGlobalNorm
from leakbench.defenses.dpsgd import DPSGD
from leakbench.defenses.fp16 import Float16
from leakbench.defenses.gaussian import GaussianNoise
from leakbench.defenses.int8 import Int8
from leakbench.defenses.laplace import LaplaceNoise
from leakbench.defenses.mixup import MixUp
from leakbench.defenses.none import NoDefense
from leakbench.defenses.precode import Precode
from leakbench.defenses.prune import Prune
from leakbench.defenses.relative_noise import RelativeNoise
from leakbench.defenses.soteria import Soteria
from leakbench.defenses.topk import TopK

__all__ = [
    "DEFENSES",
    "DPSGD",
    "Chain",
    "ClientView",
    "ClipGlobalNorm",
    "Defense",
    "Float16",
    "GaussianNoise",
    "Gradients",
    "Int8",
    "LaplaceNoise",
    "MixUp",
    "NoDefense",
    "Precode",
    "Prune",
    "RelativeNoise",
    "Soteria",
    "TopK",
    "chain",
    "clip",
    "defense_from_function",
    "dpsgd",
    "fp16",
    "function_defense",
    "gaussian",
    "int8",
    "laplace",
    "make_defense",
    "mixup",
    "none",
    "precode",
    "prepare_seed",
    "prune",
    "relative_noise",
    "soteria",
    "tensor_seed",
    "topk",
]


def _adopt(name: str, obj: object) -> bool:
    """Registers a plugin's `Defense` subclass or ``grads -> grads`` function as ``name``."""
    if isinstance(obj, type):
        return adopt_component(DEFENSES, Defense, name, obj)
    if callable(obj):
        defense_from_function(name, obj)
        return True
    return False


DEFENSES.use_entry_points("leakbench.defenses", _adopt)
