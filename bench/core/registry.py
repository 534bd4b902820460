"""A small name -> object registry that refuses duplicates, one per kind of component.

A registry may be tied to an entry-point group (`Registry.use_entry_points`): the installed
plugins of that group are then loaded the first time the registry is queried (see
`leakbench.core.plugins`), so that ``leakbench list`` and ``leakbench run`` see them.

Every entry has a modality, ``"image"`` or ``"text"``: the run a dataset, a model or an attack
belongs to (`Registry.modality_of`, ``names(modality)``, ``get(name, modality)``). One registry
holds every modality's entries; an entry is an image one unless it says otherwise, so a plugin
written before text existed keeps working.

`Registry.view` is a live, read-only part of a registry (the attacks of one modality, say):
it answers like a registry and names only what its test keeps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from leakbench.core.errors import LeakbenchError, UnknownNameError
from leakbench.core.plugins import Adopter, attach, load_group

T = TypeVar("T")

IMAGE = "image"  # the modality of an entry that names none


class Registry(Generic[T]):
    """Maps names to components (classes or factories) of one kind.

    Args:
        kind: What the registry holds ("attack", "defense", ...); used in error messages.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}
        self._modalities: dict[str, str] = {}
        self._group: str | None = None
        self._plugins_loaded = False
        # Names whose plugin failed to load, with the error to raise when the name is used.
        self._broken: dict[str, LeakbenchError] = {}

    def register(self, name: str, modality: str | None = None) -> Callable[[T], T]:
        """Decorator that registers its target under ``name``; a second use of a name raises.

        Args:
            name: The name it is used by.
            modality: ``"image"`` or ``"text"``; None: the target's own ``modality`` attribute
                if it has one (an attack class's), else ``"image"``.
        """

        def decorate(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = item
            self._modalities[name] = modality or getattr(item, "modality", None) or IMAGE
            return item

        return decorate

    def unregister(self, name: str) -> T:
        """Removes ``name`` and returns what it held; for tests and interactive sessions that
        define a component again (`register` refuses a name that is taken)."""
        try:
            self._modalities.pop(name, None)
            return self._items.pop(name)
        except KeyError:
            raise UnknownNameError(f"{self.kind} {name!r} is not registered") from None

    def use_entry_points(self, group: str, adopt: Adopter | None = None) -> None:
        """Ties the registry to an entry-point group, loaded lazily on the first query.

        Args:
            group: The entry-point group, e.g. ``"leakbench.defenses"``. Several registries may
                share one group (named datasets and file sources do); it is loaded once.
            adopt: Registers a loaded object that did not register itself, under the
                entry-point name, if it is of this registry's kind; returns whether it did.
        """
        self._group = group
        attach(group, self, adopt)

    def mark_broken(self, name: str, error: LeakbenchError) -> None:
        """Records that the plugin for ``name`` failed to load; using the name raises ``error``."""
        self._broken[name] = error

    def broken(self) -> dict[str, LeakbenchError]:
        """The names whose plugin failed to load, with their errors (loads plugins first)."""
        self._load_plugins()
        return dict(self._broken)

    def get(self, name: str, modality: str | None = None) -> T:
        """Returns the component registered as ``name``.

        Args:
            name: A registered name.
            modality: If given, the modality the component must be of.

        Raises:
            UnknownNameError: If nothing is registered as ``name`` (the message lists the
                names), or it is of another modality than ``modality`` (the message lists
                that modality's names).
            LeakbenchError: The plugin's load error, if ``name`` belongs to a broken plugin.
        """
        item = self._get(name)
        if modality is not None and self.modality_of(name) != modality:
            raise UnknownNameError(
                f"{self.kind} {name!r} is {_a(self.modality_of(name))} {self.kind}, not "
                f"{_a(modality)} one; {modality} {self.kind}s: {', '.join(self.names(modality))}"
            )
        return item

    def modality_of(self, name: str) -> str:
        """The modality (``"image"``, ``"text"``) of the component registered as ``name``;
        raises as `get` does for a name that is not registered."""
        self._get(name)
        return self._modalities[name]

    def _get(self, name: str) -> T:
        self._load_plugins()
        if name in self._broken:
            error = self._broken[name]
            # A fresh instance: re-raising the stored one would pile up tracebacks.
            raise type(error)(str(error)) from None
        try:
            return self._items[name]
        except KeyError:
            allowed = ", ".join(self.names())
            raise UnknownNameError(f"unknown {self.kind} {name!r}; allowed: {allowed}") from None

    def names(self, modality: str | None = None) -> list[str]:
        """The usable names, sorted (a broken plugin's name is left out); with ``modality``,
        only that modality's."""
        self._load_plugins()
        return sorted(
            n
            for n in self._items
            if n not in self._broken and modality in (None, self._modalities[n])
        )

    def peek(self, name: str) -> T | None:
        """What ``name`` holds now, or None, without loading plugins (the plugin loader's own
        view, and a way to check a name without importing every installed plugin)."""
        return self._items.get(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self.names()

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def view(self, keep: Callable[[T], bool], refuse: Callable[[str, T], str]) -> Registry[T]:
        """The part of this registry that ``keep`` accepts, as a read-only registry of the same
        kind: live (what is registered later, plugins included, shows in it), and its `get` of
        a name the parent holds but ``keep`` refuses raises `UnknownNameError` with the line
        ``refuse(name, item)``."""
        return _View(self, keep, refuse)

    def _load_plugins(self) -> None:
        if self._group is None or self._plugins_loaded:
            return
        # Set first: a plugin that queries this registry while it is imported must not
        # start the loading again.
        self._plugins_loaded = True
        load_group(self._group)


class _View(Registry[T]):
    """`Registry.view`: the parent's entries that ``keep`` accepts."""

    def __init__(
        self, parent: Registry[T], keep: Callable[[T], bool], refuse: Callable[[str, T], str]
    ) -> None:
        super().__init__(parent.kind)
        self._parent, self._keep, self._refuse = parent, keep, refuse

    def register(self, name: str, modality: str | None = None) -> Callable[[T], T]:
        raise TypeError(f"a view of the {self.kind} registry is read-only; register in it")

    def unregister(self, name: str) -> T:
        raise TypeError(f"a view of the {self.kind} registry is read-only; unregister in it")

    def _get(self, name: str) -> T:
        if name not in self._parent.names() and name not in self._parent.broken():
            allowed = ", ".join(self.names())
            raise UnknownNameError(f"unknown {self.kind} {name!r}; allowed: {allowed}")
        item = self._parent.get(name)  # a broken plugin's name raises its error here
        if not self._keep(item):
            raise UnknownNameError(self._refuse(name, item))
        return item

    def names(self, modality: str | None = None) -> list[str]:
        return [n for n in self._parent.names(modality) if self._keep(self._parent.get(n))]

    def modality_of(self, name: str) -> str:
        self._get(name)
        return self._parent.modality_of(name)

    def peek(self, name: str) -> T | None:
        item = self._parent.peek(name)
        return item if item is not None and self._keep(item) else None

    def broken(self) -> dict[str, LeakbenchError]:
        return self._parent.broken()


def _a(modality: str) -> str:
    """``modality`` with its article: "an image", "a text"."""
    return f"{'an' if modality[:1] in 'aeiou' else 'a'} {modality}"
