"""The adaptive attacks a defense declares: attack parameter settings, typed and checked.

A defense that some attack can undo names that attack as `AdaptiveSetting` values of its
``adaptive`` class attribute, e.g. ``(AdaptiveSetting({"match": "kept"}),)`` for pruning. The
standard suite (`leakbench.attacks.suite`) applies each setting to every attack that takes all
its parameters. Each setting is checked against the attacks' declared parameters when the
defense class is defined: a parameter no attack has, or a value that attack refuses, fails
the import in one line. The attacks are a floor above the defenses, so the attacks package
installs the check (`use_check`); a class defined before that is checked then.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import Any


@dataclasses.dataclass(frozen=True)
class AdaptiveSetting(Mapping[str, Any]):
    """Attack parameter values that make an attack adaptive to a defense (``{"match":
    "kept"}``); read like the mapping it holds.

    Attributes:
        params: Attack parameter names and the values that target the defense.
    """

    params: Mapping[str, Any]

    def __post_init__(self) -> None:
        if not isinstance(self.params, Mapping) or not self.params:
            raise TypeError(f"an adaptive setting needs attack parameters, got {self.params!r}")
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))

    def __getitem__(self, key: str) -> Any:
        return self.params[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.params)

    def __len__(self) -> int:
        return len(self.params)

    def __repr__(self) -> str:
        return f"AdaptiveSetting({dict(self.params)!r})"


# Checks one setting of the named owner ("defense prune"); raises ValueError if no attack can
# take it. Installed by the attacks package.
Check = Callable[[str, AdaptiveSetting], None]

_check: list[Check] = []
_pending: list[tuple[str, AdaptiveSetting]] = []


def check_settings(owner: str, settings: Any) -> None:
    """Checks a defense's declared ``adaptive`` settings now, or once the attacks are imported.

    Raises:
        TypeError: ``settings`` is not a tuple of `AdaptiveSetting`.
        ValueError: A setting names a parameter no attack has, or a value it refuses.
    """
    if not isinstance(settings, tuple) or not all(isinstance(s, AdaptiveSetting) for s in settings):
        raise TypeError(
            f"{owner}: adaptive must be a tuple of AdaptiveSetting, e.g. "
            f"(AdaptiveSetting({{'match': 'kept'}}),); got {settings!r}"
        )
    for setting in settings:
        if _check:
            _check[0](owner, setting)
        else:
            _pending.append((owner, setting))


def use_check(check: Check) -> None:
    """Installs the attacks' check of adaptive settings and runs it on those declared so far."""
    _check[:] = [check]
    while _pending:
        check(*_pending.pop(0))
