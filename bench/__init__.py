"""leakbench: gradient-leakage attacks against gradient defenses, in TensorFlow 2 / Keras 3.

The package is built in floors, one folder each, and a module imports only from its own floor
or the floors below (`tests/test_layers.py` checks it; `docs/architecture.md` draws it):
`leakbench.core`, then `leakbench.components` (beside `leakbench.defenses`,
`leakbench.datasets` and `leakbench.attacks.priors`), `leakbench.attacks.engine`, then
`leakbench.attacks` and `leakbench.client`, `leakbench.outputs`, `leakbench.run`,
`leakbench.integrations` and, on top, `leakbench.cli`.
"""

from __future__ import annotations

import importlib

__version__ = "0.3.0"

# The names ``leakbench.NAME`` gives from the floors, imported on first use so that importing
# leakbench stays cheap (and this module's body below every floor): the notebook API. The layer
# test counts ``leakbench.NAME`` as an import of the module named here.
LAZY = {"audit": "leakbench.run.audit", "AuditResult": "leakbench.run.audit"}


def __getattr__(name: str) -> object:
    if name in LAZY:
        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module 'leakbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *LAZY])
