"""Plugins: components that installed packages declare as entry points, and one-file plugins
that a config (``plugins = [...]``) or the command line (``leakbench run --plugin``) names.

A package adds defenses, attacks or datasets to leakbench without a fork by declaring entry
points in one of the groups of `ENTRY_POINT_GROUPS`, e.g. in its ``pyproject.toml``::

    [project.entry-points."leakbench.defenses"]
    halve = "my_package.defenses:Halve"

The rule: **the entry-point name is the component's name.** Loading an entry point imports its
module. If that import registers the name (``@DEFENSES.register("halve")``,
``@function_defense("halve")``, ``@ATTACKS.register(...)``, ``@PRIORS.register(...)``,
``@DATASETS.register(...)``, ``@FILE_SOURCES.register(...)`` or ``@MODELS.register(...)``),
nothing more is done. Otherwise the loaded object is registered under the name if it is one of:

* ``leakbench.defenses``: a `~leakbench.defenses.Defense` subclass whose ``name`` equals the
  entry-point name, or a plain function ``grads -> grads`` (wrapped by
  `~leakbench.defenses.defense_from_function`);
* ``leakbench.attacks``: an attack class of any modality (a subclass of
  `~leakbench.attacks.Attack` for images or of `~leakbench.attacks.text.base.TextAttack` for text)
  whose ``name`` equals the entry-point name;
* ``leakbench.priors``: a `~leakbench.attacks.priors.Prior` subclass whose ``name`` equals the
  entry-point name (a term of the optimisation attacks' loss);
* ``leakbench.losses``: a function ``(dummy, observed) -> [N]`` (a matching loss of the
  gradient-matching attacks, `leakbench.attacks.engine.losses`);
* ``leakbench.datasets``: a function ``() -> Dataset`` (a named dataset; a file source
  ``PREFIX:PATH`` must register itself with ``@FILE_SOURCES.register("PREFIX")``);
* ``leakbench.models``: a function ``(input_shape, num_classes, seed) -> keras.Model`` (a model
  of logits whose weights ``seed`` draws, like the zoo's ``@MODELS.register`` functions).

Anything else, or a name that is already taken by another component, is an error.

When: each group is loaded once per process, the first time one of its registries is queried
(a name looked up, the names listed), so importing leakbench stays cheap and every process
(a CLI run, a worker) finds the installed plugins by itself. A function defense registered in
Python, not through an entry point, exists only in the process that registered it.

A broken plugin (its import raises, or it breaks the rule above) blocks only its own name (a
built-in's too, if it claims one: which of the two was meant is ambiguous); the other
components stay usable, ``leakbench list`` prints one warning line per broken plugin on
stderr, and using the name raises `PluginError`, one line that names the entry point and the
error (the CLI exits with status 2).

A plugin named by a config or ``--plugin`` (`load_plugin`) is a ``.py`` file or an importable
module: importing it registers its components with their decorators, as an entry point's module
does, before the config's names are resolved. A file is imported under a module name derived
from its path, once per process. Its failure is a `PluginError` at once (the run asked for it),
not a blocked name. The run records each plugin in its resolved config (a file relative to the
working directory, as the config's other paths), so that every process that reads the config (a
worker, ``rescore``, ``merge``, ``board --verify``) loads it again.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from leakbench.core.errors import LeakbenchError

ENTRY_POINT_GROUPS = (
    "leakbench.defenses",
    "leakbench.attacks",
    "leakbench.priors",
    "leakbench.losses",
    "leakbench.datasets",
    "leakbench.models",
)


class PluginError(LeakbenchError):
    """An installed plugin failed to load or does not follow the entry-point rule."""


# Registers a plugin's loaded object under a name if it is of the registry's kind; returns
# False if it is not.
Adopter = Callable[[str, object], bool]


class Registry(Protocol):
    """What the loader needs of a registry (`leakbench.core.registry.Registry` is one)."""

    kind: str

    def register(self, name: str) -> Callable[[Any], Any]: ...

    def peek(self, name: str) -> object | None: ...

    def mark_broken(self, name: str, error: LeakbenchError) -> None: ...


_attached: dict[str, list[tuple[Registry, Adopter | None]]] = {}
_loaded: set[str] = set()


def adopt_component(registry: Registry, base: type, name: str, obj: object) -> bool:
    """Registers ``obj`` as ``name`` if it is a subclass of ``base`` (an `Attack` or `Defense`
    class, a frozen dataclass whose ``name`` equals the entry-point name); returns False if it is
    not such a class, and raises ValueError if it is one that breaks those rules."""
    import dataclasses

    if not isinstance(obj, type) or not issubclass(obj, base):
        return False
    if not dataclasses.is_dataclass(obj):
        raise ValueError(
            f"{obj.__qualname__} must be a frozen dataclass, like every {base.__name__}"
        )
    held = getattr(obj, "name", None)
    if held != name:
        raise ValueError(
            f"{obj.__qualname__}.name is {held!r}; set it to {name!r}, the entry-point name"
        )
    registry.register(name)(obj)
    return True


def adopt_function(registry: Registry, name: str, obj: object) -> bool:
    """Registers ``obj`` as ``name`` if it is a function (any callable that is not a class): a
    named dataset's loader, a matching loss; returns False for anything else."""
    if isinstance(obj, type) or not callable(obj):
        return False
    registry.register(name)(obj)
    return True


def attach(group: str, registry: Registry, adopt: Adopter | None) -> None:
    """Makes ``registry`` one of the registries that ``group``'s entry points fill."""
    if group not in ENTRY_POINT_GROUPS:
        raise ValueError(f"unknown entry-point group {group!r}; allowed: {ENTRY_POINT_GROUPS}")
    _attached.setdefault(group, []).append((registry, adopt))


def load_group(group: str) -> None:
    """Loads every entry point of ``group`` once; failures mark their name broken."""
    if group in _loaded:
        return
    _loaded.add(group)
    targets = _attached.get(group, [])
    for entry in importlib.metadata.entry_points(group=group):
        try:
            _load_entry(entry, targets)
        except PluginError as err:
            for registry, _ in targets:
                registry.mark_broken(entry.name, err)


def describe(entry: importlib.metadata.EntryPoint) -> str:
    """``'NAME = MODULE:ATTR' (group G, package P VERSION)``, to name an entry point in errors."""
    text = f"'{entry.name} = {entry.value}' (group {entry.group}"
    dist = getattr(entry, "dist", None)
    if dist is not None:
        text += f", package {dist.metadata['Name']} {dist.version}"
    return text + ")"


def _load_entry(
    entry: importlib.metadata.EntryPoint, targets: list[tuple[Registry, Adopter | None]]
) -> None:
    where = f"plugin entry point {describe(entry)}"
    # The name is taken if a registry already holds it before this plugin is imported.
    before = {id(registry): registry.peek(entry.name) for registry, _ in targets}
    try:
        obj = entry.load()
    # A plugin is third-party code whose import may raise anything; each failure is turned
    # into one line that names the entry point instead of a traceback.
    except Exception as err:
        raise PluginError(
            f"{where} failed to load: {_one_line(err)}; fix or uninstall it"
        ) from None
    for registry, _ in targets:
        held = before[id(registry)]
        if held is None and registry.peek(entry.name) is not None:
            return  # its import registered the name (a decorator)
        if held is not None:
            if _same(held, obj):
                return  # imported before this load and already registered; nothing to do
            raise PluginError(
                f"{where}: {registry.kind} {entry.name!r} is already registered by another "
                "component; rename the entry point"
            )
    for _, adopt in targets:
        if adopt is None:
            continue
        try:
            if adopt(entry.name, obj):
                return
        except LeakbenchError as err:
            raise PluginError(f"{where}: {err}") from None
        except (TypeError, ValueError) as err:
            raise PluginError(f"{where}: {_one_line(err)}") from None
    kinds = " or ".join(registry.kind for registry, _ in targets) or "component"
    raise PluginError(
        f"{where}: its import registered no {kinds} named {entry.name!r}, and the loaded "
        f"{_what(obj)} cannot be registered under that name (see the entry-point rule in "
        "leakbench.core.plugins)"
    )


def _same(held: object, obj: object) -> bool:
    # A function defense's registered class keeps the function it wraps.
    return held is obj or (obj is not None and getattr(held, "function", None) is obj)


def _what(obj: object) -> str:
    kind = "class" if isinstance(obj, type) else type(obj).__name__
    return f"{kind} {getattr(obj, '__qualname__', getattr(obj, '__name__', repr(obj)))}"


def _one_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {' '.join(str(err).split())}"


# --- plugins named by a config or the command line -------------------------------------------

# Files loaded so far by `load_plugin`: each resolved path and the module it was imported as.
_files: dict[Path, str] = {}
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def load_plugins(names: Sequence[str], base: Path | None = None) -> tuple[str, ...]:
    """Loads each plugin of ``names`` (`load_plugin`) in order; their recorded forms, each once."""
    return tuple(dict.fromkeys(load_plugin(name, base) for name in names))


def load_plugin(name: str, base: Path | None = None) -> str:
    """Loads one plugin a config's ``plugins`` or ``leakbench run --plugin`` names, and returns
    how a run records it: the file as named (its absolute path if ``base`` is given), or the
    module's name.

    A name ending in ``.py`` is a file, relative to ``base`` (default: the working directory),
    imported under a module name of its own derived from its path, so that two files of one
    name do not collide and the same file loaded again is not imported twice. Any other name is
    a module, imported as ``import NAME`` would. Importing it registers its components (their
    decorators); nothing else is read from it.

    Raises:
        PluginError: One line naming the plugin and the cause: a missing file, a name that is
            neither, a module that is not found or whose import raises.
    """
    if not isinstance(name, str) or not name.strip():
        raise PluginError(f"plugin {name!r}: give a .py file or a module name")
    if name.endswith(".py"):
        path = _load_file(name, base)
        return name if base is None else str(path)
    if not _MODULE_NAME.fullmatch(name):
        raise PluginError(
            f"plugin {name!r}: neither a .py file nor a module name (like my_package.defenses)"
        )
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name is not None and (name == err.name or name.startswith(err.name + ".")):
            raise PluginError(
                f"plugin {name}: no module named {err.name!r} (a plugin is a .py file or an "
                "importable module)"
            ) from None
        raise PluginError(f"plugin {name} failed to import: {_one_line(err)}") from None
    # A plugin is user code whose import may raise anything; each failure is one line.
    except Exception as err:
        raise PluginError(f"plugin {name} failed to import: {_one_line(err)}") from None
    return name


def plugin_path(name: str, base: Path | None = None) -> Path:
    """The absolute path of the plugin file ``name`` (``~`` expanded; a relative one joined to
    ``base``, default the working directory); not checked."""
    path = Path(name).expanduser()
    if not path.is_absolute():
        path = (base if base is not None else Path.cwd()) / path
    return Path(os.path.abspath(path))


def _load_file(name: str, base: Path | None) -> Path:
    path = plugin_path(name, base)
    if not path.is_file():
        what = "is not a file" if path.exists() else "does not exist"
        raise PluginError(f"plugin {name}: {path} {what}")
    real = path.resolve()
    if real in _files:
        return path
    stem = re.sub(r"\W", "_", real.stem)
    module_name = f"_leakbench_plugin_{stem}_{hashlib.sha256(str(real).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(module_name, real)
    if spec is None or spec.loader is None:
        raise PluginError(f"plugin {name}: {path} cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    # In sys.modules while it runs: dataclasses and pickling look the module up by its name.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    # A plugin is user code whose import may raise anything; each failure is one line.
    except Exception as err:
        del sys.modules[module_name]
        raise PluginError(f"plugin {name} ({path}) failed to load: {_one_line(err)}") from None
    _files[real] = module_name
    return path
