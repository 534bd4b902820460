"""Gradient-leakage attacks; importing this package registers every attack.

A researcher's own attack is an `Attack` subclass (a frozen dataclass with ``name`` set that
implements ``run`` or ``run_many``) decorated with ``@ATTACKS.register("name")``, or one that an
installed package declares as an entry point in the ``leakbench.attacks`` group (see
`leakbench.plugins`).
"""

from __future__ import annotations

import dataclasses

from leakbench.attacks import analytic, dlg, idlg, ig  # noqa: F401  (registration)
from leakbench.attacks.base import ATTACKS, Attack, AttackTarget, Reconstruction, make_attack

__all__ = ["ATTACKS", "Attack", "AttackTarget", "Reconstruction", "make_attack"]


def _adopt(name: str, obj: object) -> bool:
    """Registers a plugin's `Attack` subclass as ``name``."""
    if not isinstance(obj, type) or not issubclass(obj, Attack):
        return False
    if not dataclasses.is_dataclass(obj):
        raise ValueError(f"{obj.__qualname__} must be a frozen dataclass, like every Attack")
    if obj.name != name:
        raise ValueError(
            f"{obj.__qualname__}.name is {obj.name!r}; set it to {name!r}, the entry-point name"
        )
    ATTACKS.register(name)(obj)
    return True


ATTACKS.use_entry_points("leakbench.attacks", _adopt)
