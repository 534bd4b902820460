"""Priors of the optimisation attacks; importing this package registers every prior.

A built-in prior is one new module in this folder (the package imports each of its modules,
`leakbench.core.discovery`). A researcher's own prior is a `Prior` subclass (a frozen
dataclass with ``name`` set that implements ``penalty``) decorated with
``@PRIORS.register("name")``, or one that an installed package declares as an entry point in
the ``leakbench.priors`` group (see `leakbench.core.plugins`). Attacks that take ``priors``
(``dlg``, ``idlg``, ``ig``) then accept its name in their config.
"""

from __future__ import annotations

from leakbench.attacks.priors.base import (
    PRIOR_TABLES,
    PRIORS,
    Prior,
    PriorContext,
    make_prior,
    priors_from_config,
)
from leakbench.core.discovery import import_parts
from leakbench.core.plugins import adopt_component

import_parts(__name__, __path__)

__all__ = ["PRIORS", "PRIOR_TABLES", "Prior", "PriorContext", "make_prior", "priors_from_config"]


def _adopt(name: str, obj: object) -> bool:
    """Registers a plugin's `Prior` subclass as ``name``."""
    return adopt_component(PRIORS, Prior, name, obj)


PRIORS.use_entry_points("leakbench.priors", _adopt)
