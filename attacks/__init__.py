"""Gradient-leakage attacks; importing this package registers every attack.

Adding a built-in attack is one new module in this folder with one ``@ATTACKS.register(...)``
class: the package imports each of its modules (`leakbench.core.discovery`). A researcher's own
attack is an `Attack` subclass (a frozen dataclass with ``name`` set that implements ``run`` or
``run_many``) decorated with ``@ATTACKS.register("name")``, or one that an installed package
declares as an entry point in the ``leakbench.attacks`` group (see `leakbench.core.plugins`).

Once the attacks are imported, the defenses' adaptive settings are checked against their
parameters (`leakbench.attacks.suite.check_adaptive`), and so is every defense defined later.
"""

from __future__ import annotations

from leakbench.attacks.base import ATTACKS, Attack, AttackTarget, Reconstruction, make_attack
from leakbench.core.discovery import import_parts
from leakbench.core.plugins import adopt_component
from leakbench.defenses.adaptive import use_check

import_parts(__name__, __path__)

from leakbench.attacks.suite import check_adaptive  # noqa: E402  (after every attack is defined)

__all__ = ["ATTACKS", "Attack", "AttackTarget", "Reconstruction", "make_attack"]


def _adopt(name: str, obj: object) -> bool:
    """Registers a plugin's `Attack` subclass as ``name``."""
    return adopt_component(ATTACKS, Attack, name, obj)


ATTACKS.use_entry_points("leakbench.attacks", _adopt)
use_check(check_adaptive)
