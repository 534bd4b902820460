"""The backends a run can choose by name (``leakbench run --backend``), and their making.

``local`` (`leakbench.run.local.LocalBackend`) is this floor's own. Any other backend is declared
as an entry point of the group `GROUP` by the package that implements it, and imported only
when chosen. leakbench declares its Ray backend, which lives a floor above this one
(`leakbench.integrations.ray_backend`), in its own ``pyproject.toml``::

    [project.entry-points."leakbench.backends"]
    ray = "leakbench.integrations.ray_backend:RayCluster"

so the run floor names no module of a higher floor. A declared backend is a class
``(address) -> Backend`` (`leakbench.run.execute.Backend`). The command line reads
`backend_names` for the choices of ``--backend``, so a declared backend is one to it too.
"""

from __future__ import annotations

import importlib.metadata
from typing import TYPE_CHECKING

from leakbench.core.errors import ConfigError

if TYPE_CHECKING:
    from leakbench.run.execute import Backend

GROUP = "leakbench.backends"


def _declared() -> dict[str, importlib.metadata.EntryPoint]:
    # ``local`` is this module's own and cannot be replaced by a declaration.
    return {e.name: e for e in importlib.metadata.entry_points(group=GROUP) if e.name != "local"}


def backend_names() -> list[str]:
    """The names ``--backend`` accepts: ``local`` first, then the declared ones, sorted."""
    return ["local", *sorted(_declared())]


def make_backend(name: str, address: str | None, workers: int | str = 1) -> Backend:
    """The backend ``name``, refusing what a user can get wrong (an unknown name, ``address``
    without Ray, ``workers`` with Ray, Ray not installed, nothing answering at ``address``)
    before anything is loaded or written."""
    declared = _declared()
    if name != "local" and name not in declared:
        raise ConfigError(f"--backend must be one of {', '.join(backend_names())}, got {name!r}")
    counted = isinstance(workers, int) and not isinstance(workers, bool) and workers >= 1
    if workers != "auto" and not counted:
        raise ConfigError(
            f"--workers must be a whole number of at least 1 or auto, got {workers!r}"
        )
    if name == "local":
        # Imported here so that the command line can list the names without TensorFlow.
        from leakbench.run.local import LocalBackend

        return LocalBackend(address, workers)
    backend = declared[name].load()
    if workers not in (1, "auto"):
        raise ConfigError(
            "--workers is for the local backend; --backend ray runs one actor per CPU of the "
            "cluster"
        )
    return backend(address)
