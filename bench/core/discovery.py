"""Built-in parts that register themselves: a package imports every module it holds.

A package of parts (the defenses, the attacks, the datasets, the priors) calls `import_parts`
from its ``__init__``: each module of the package is imported once, in sorted order, and its
decorators (``@DEFENSES.register(...)`` and the like) register what it defines. A new built-in
part is then its file alone; no list of modules is kept by hand.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Iterable
from types import ModuleType


def import_parts(package: str, path: Iterable[str]) -> list[ModuleType]:
    """Imports every module directly in ``package`` (found on its ``__path__``, ``path``),
    sorted by name; subpackages and modules whose name starts with ``_`` are left out.

    Returns:
        The imported modules, in the order they were imported.
    """
    names = sorted(
        info.name
        for info in pkgutil.iter_modules(list(path))
        if not info.ispkg and not info.name.startswith("_")
    )
    return [importlib.import_module(f"{package}.{name}") for name in names]
