"""A small name -> object registry that refuses duplicates, one per kind of component."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from leakbench.errors import UnknownNameError

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names to components (classes or factories) of one kind.

    Args:
        kind: What the registry holds ("attack", "defense", ...); used in error messages.
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator that registers its target under ``name``; a second use of a name raises."""

        def decorate(item: T) -> T:
            if name in self._items:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            self._items[name] = item
            return item

        return decorate

    def get(self, name: str) -> T:
        """Returns the component registered as ``name``, or raises `UnknownNameError`."""
        try:
            return self._items[name]
        except KeyError:
            allowed = ", ".join(sorted(self._items))
            raise UnknownNameError(f"unknown {self.kind} {name!r}; allowed: {allowed}") from None

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._items)
