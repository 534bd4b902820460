"""Gradient-leakage attacks; importing this package registers every attack.

A researcher's own attack is an `Attack` subclass (a frozen dataclass with ``name`` set that
implements ``run`` or ``run_many``) decorated with ``@ATTACKS.register("name")``, or one that an
installed package declares as an entry point in the ``leakbench.attacks`` group (see
`leakbench.core.plugins`).
"""

from __future__ import annotations

from leakbench.attacks import analytic, dlg, idlg, ig, imprint, trap_weights  # noqa: F401
from leakbench.attacks.base import ATTACKS, Attack, AttackTarget, Reconstruction, make_attack
from leakbench.core.plugins import adopt_component

__all__ = ["ATTACKS", "Attack", "AttackTarget", "Reconstruction", "make_attack"]


def _adopt(name: str, obj: object) -> bool:
    """Registers a plugin's `Attack` subclass as ``name``."""
    return adopt_component(ATTACKS, Attack, name, obj)


ATTACKS.use_entry_points("leakbench.attacks", _adopt)
