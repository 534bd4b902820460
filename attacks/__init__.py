"""Gradient-leakage attacks; importing this package registers every attack.

Every attack, of every modality, is registered in the one registry `ATTACKS` and follows one
contract (`leakbench.attacks.base.AttackContract`: a frozen dataclass of its parameters with
the final ``attack_many`` / ``__call__``); its ``modality`` (``"image"`` for `Attack`,
``"text"`` for `leakbench.attacks.text.TextAttack`) says which runs it belongs to, and
`attacks_of` lists one modality's.

Adding a built-in attack is one new module in this folder (a text attack: in ``text/``) with one
``@ATTACKS.register(...)`` class: the package imports each of its modules
(`leakbench.core.discovery`). A researcher's own attack is an `Attack` (or `TextAttack`) subclass
(a frozen dataclass with ``name`` set that implements ``run`` or ``run_many``) decorated with
``@ATTACKS.register("name")``, or one that an installed package declares as an entry point in the
``leakbench.attacks`` group (see `leakbench.core.plugins`).

Once the attacks are imported, the defenses' adaptive settings are checked against their
parameters (`leakbench.attacks.suite.check_adaptive`), and so is every defense defined later.
"""

from __future__ import annotations

from leakbench.attacks.base import (
    ATTACKS,
    Attack,
    AttackContract,
    AttackTarget,
    Reconstruction,
    RunOutput,
    Simulator,
    attacks_of,
    make_attack,
)
from leakbench.attacks.engine.losses import LOSSES
from leakbench.attacks.priors.base import PRIORS, Prior, make_prior
from leakbench.core.discovery import import_parts
from leakbench.core.plugins import adopt_component
from leakbench.defenses.adaptive import use_check

import_parts(__name__, __path__)

from leakbench.attacks.suite import check_adaptive  # noqa: E402  (after every attack is defined)
from leakbench.attacks.text import (  # noqa: E402  (registers the text attacks)
    TextAttack,
    TextReconstruction,
    TextTarget,
)

# The public names: an attack's contract, target and result, the registries an attack author
# extends (attacks, matching losses, priors) and their factories.
__all__ = [
    "ATTACKS",
    "LOSSES",
    "PRIORS",
    "Attack",
    "AttackContract",
    "AttackTarget",
    "Prior",
    "Reconstruction",
    "RunOutput",
    "Simulator",
    "TextAttack",
    "TextReconstruction",
    "TextTarget",
    "attacks_of",
    "make_attack",
    "make_prior",
]


def _adopt(name: str, obj: object) -> bool:
    """Registers a plugin's attack class (an `Attack` or `TextAttack` subclass: any
    `AttackContract` of a modality) as ``name``."""
    if isinstance(obj, type) and issubclass(obj, AttackContract) and not obj.modality:
        raise ValueError(f"{obj.__qualname__} must subclass Attack or TextAttack, not the root")
    return adopt_component(ATTACKS, AttackContract, name, obj)


ATTACKS.use_entry_points("leakbench.attacks", _adopt)
use_check(check_adaptive)
