"""Gradient defenses; importing this package registers every defense.

Adding a built-in defense is one new module in this folder with one
``@DEFENSES.register(...)`` class: the package imports each of its modules
(`leakbench.core.discovery`), and the class is importable by its name from here
(``from leakbench.defenses import GaussianNoise``).

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

from typing import Any

from leakbench.core.discovery import import_parts
from leakbench.core.plugins import adopt_component
from leakbench.defenses.base import (
    DEFENSES,
    AdaptiveSetting,
    ClientView,
    Defense,
    Gradients,
    Sample,
    defense_from_function,
    function_defense,
    make_defense,
    prepare_seed,
    tensor_seed,
)

_MODULES = import_parts(__name__, __path__)

# The built-in defense classes by class name (GaussianNoise, DPSGD, ...), each the class its
# module registered.
_CLASSES: dict[str, type[Defense]] = {
    value.__name__: value
    for module in _MODULES
    for value in vars(module).values()
    if isinstance(value, type)
    and issubclass(value, Defense)
    and value.__module__ == module.__name__
    and DEFENSES.peek(value.name) is value
}

__all__ = [
    "DEFENSES",
    "AdaptiveSetting",
    "ClientView",
    "Defense",
    "Gradients",
    "Sample",
    "defense_from_function",
    "function_defense",
    "make_defense",
    "prepare_seed",
    "tensor_seed",
]
# The defense classes and their modules (``gaussian``), as the discovery found them.
__all__ += sorted([*_CLASSES, *(module.__name__.rpartition(".")[2] for module in _MODULES)])


def __getattr__(name: str) -> Any:
    """A built-in defense class by its class name (``GaussianNoise``)."""
    try:
        return _CLASSES[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def _adopt(name: str, obj: object) -> bool:
    """Registers a plugin's `Defense` subclass or ``grads -> grads`` function as ``name``."""
    if isinstance(obj, type):
        return adopt_component(DEFENSES, Defense, name, obj)
    if callable(obj):
        defense_from_function(name, obj)
        return True
    return False


DEFENSES.use_entry_points("leakbench.defenses", _adopt)
