"""leakbench: gradient-leakage attacks against gradient defenses, in TensorFlow 2 / Keras 3.

The package is built in floors, one folder each, and a module imports only from its own floor
or the floors below (`tests/test_layers.py` checks it; `docs/architecture.md` draws it):
`leakbench.core`, then `leakbench.components` (beside `leakbench.defenses`,
`leakbench.datasets` and `leakbench.attacks.priors`), `leakbench.attacks.engine`, then
`leakbench.attacks` and `leakbench.client`, `leakbench.outputs`, `leakbench.run`,
`leakbench.integrations` and, on top, `leakbench.cli`.

Until version 0.2 every module lived directly under ``leakbench`` (``leakbench.config``,
``leakbench.runner``, ...). Those paths still import the same module objects (`MOVED`), so
code written for them keeps working; new code should use the floors' paths (CHANGELOG.md).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.2.0"

# The flat module paths of leakbench 0.1 -> where the module lives now. The old client module
# is now `leakbench.client.update`; `leakbench.client` re-exports its names.
MOVED = {
    **{
        f"leakbench.{name}": f"leakbench.core.{name}"
        for name in (
            "errors",
            "registry",
            "plugins",
            "canonical",
            "seeds",
            "versions",
            "params",
            "federated",
            "environment",
        )  # fmt: skip
    },
    **{
        f"leakbench.{name}": f"leakbench.components.{name}"
        for name in (
            "models",
            "bottleneck",
            "per_example",
            "lpips_weights",
            "lpips",
            "metrics",
            "leakage",
        )  # fmt: skip
    },
    **{
        f"leakbench.{name}": f"leakbench.client.{name}"
        for name in ("recipes", "training", "selection")
    },
    **{
        f"leakbench.{name}": f"leakbench.outputs.{name}"
        for name in ("tables", "naming", "arrays", "paper_tables", "figures", "report")
    },
    **{
        f"leakbench.{name}": f"leakbench.run.{name}"
        for name in (
            "config",
            "plan",
            "execute",
            "dispatch",
            "workers",
            "rundir",
            "store",
            "lock",
            "shard",
            "merge",
            "runner",
            "identification",
        )  # fmt: skip
    },
    **{f"leakbench.{name}": f"leakbench.integrations.{name}" for name in ("ray_backend", "flower")},
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old flat path (`MOVED`) as the module at its new path: the same module
    object under both names, so an attribute patched through one is seen through the other."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: types.ModuleType) -> None:
        pass  # the module at the new path is already executed


# The names ``leakbench.NAME`` gives from the floors, imported on first use so that importing
# leakbench stays cheap (and this module below every floor): the notebook API.
LAZY = {"audit": "leakbench.run.audit", "AuditResult": "leakbench.run.audit"}


def __getattr__(name: str) -> object:
    if name in LAZY:
        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module 'leakbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *LAZY])


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())
