"""The standard attack suite: which attacks every defense meets, whatever a config lists.

A defense's verdict is only as good as the attacks it was judged against. A config that lists
one weak attack must not earn its defenses a ``holds``, so a run follows a versioned protocol
(`PROTOCOL`) unless its config opts out with ``suite = "listed"``:

1. every attack **family** of `FAMILIES` that can attack the setting, untuned (its defaults:
   the published configurations), against every defense;
2. each defense's declared **adaptive settings** (`leakbench.defenses.Defense.adaptive_attacks`:
   ``match = "kept"`` against pruning and top-k, ``loss = "cosine"`` against clipping and
   DP-SGD, ``loss = "l1"`` against Laplace noise, ``match = "features"`` against Soteria and
   PRECODE, ``mixing = "learn"`` against MixUp) applied by name to every family that takes
   them, again untuned;
3. the attacks the config lists, and each declared setting applied to every listed attack
   that takes it (the user's own budget and priors, made adaptive).

Noise defenses (Gaussian, Laplace, relative noise, DP-SGD) meet an image prior through the
``ig`` family, whose total-variation term is part of its published configuration. Every attack
of the suite also runs against ``none``: that is where it vouches for itself
(`leakbench.outputs.tables`: an attack counts toward a ``holds`` only if it breaks ``none``).

`EXPENSIVE` names the families whose trials a whole run spends only where they can still
change a verdict (`leakbench.run.runner`): against a defense, after the other attacks, only on
images not yet leaked, and only when the attack broke ``none``.

A change to any of this is a new protocol version: runs of another protocol are never ranked
against each other.
"""

from __future__ import annotations

import dataclasses

from leakbench.attacks.base import Attack, attacks_of, make_attack
from leakbench.core.canonical import canonical_json
from leakbench.core.errors import ConfigError
from leakbench.core.params import Registered, check, declared
from leakbench.defenses import AdaptiveSetting, Defense

# The version of the standard suite and of the verdict rules built on it: recorded in resolved
# configs, leaderboards and reports. Protocol 2 runs protocol 1's attacks and judges them by
# stricter rules (`leakbench.outputs.verdicts`, "Protocol 2"); a record of protocol 1 is still
# judged by protocol 1's rules (`PROTOCOLS`), so that its committed tables are reproduced.
PROTOCOL = 2
# The protocols this version can judge a run by: a config may state any of them.
PROTOCOLS = (1, 2)
# The families every setting meets, in the order they run (cheapest first).
FAMILIES = ("idlg", "dlg", "ig")
# Families run against a defense only after the others, where they can still change its verdict.
EXPENSIVE = ("ig",)
# What ``suite`` accepts.
SUITES = ("standard", "listed")


def _key(attack: Attack) -> str:
    return canonical_json([attack.name, attack.params()])


def _fits(attack: Attack, batch_size: int, server: str) -> bool:
    """Whether ``attack`` can attack batches of ``batch_size`` under this server."""
    if attack.server != server:
        return False
    try:
        attack.check_batch_size(batch_size)
    except ConfigError:
        return False
    return True


def families(batch_size: int, server: str = "honest") -> list[Attack]:
    """The untuned attack families of `FAMILIES` that can attack this setting."""
    built = [make_attack(name) for name in FAMILIES if name in attacks_of("image").names()]
    return [a for a in built if _fits(a, batch_size, server)]


def adaptive_variants(attacks: list[Attack], defense: Defense) -> list[Attack]:
    """Each of ``defense``'s adaptive settings applied to every attack of ``attacks`` that takes
    it, keeping that attack's other parameters (its budget, its priors)."""
    variants = []
    for setting in defense.adaptive_attacks():
        for attack in attacks:
            variant = attack.with_setting(setting)
            if variant is not None:
                variants.append(variant)
    return variants


def suite_for(
    listed: list[Attack],
    defense: Defense,
    *,
    batch_size: int,
    server: str = "honest",
    every_defense: list[Defense] | None = None,
) -> list[Attack]:
    """The attacks of protocol `PROTOCOL` against ``defense``, each once, in order: the listed
    attacks, the families, then the adaptive settings of ``defense`` applied to both. With
    ``every_defense`` (a run's whole grid) the settings of all of them are applied: that is the
    suite ``none`` meets, so that every adaptive attack vouches for itself there."""
    base = list(listed) + families(batch_size, server)
    targets = every_defense if every_defense is not None else [defense]
    extra = [v for target in targets for v in adaptive_variants(base, target)]
    chosen: dict[str, Attack] = {}
    for attack in [*base, *extra]:
        if _fits(attack, batch_size, server) or attack in listed:
            chosen.setdefault(_key(attack), attack)
    return list(chosen.values())


def expected(defense: Defense, batch_size: int, server: str = "honest") -> list[Attack]:
    """The protocol's attacks a leaderboard expects to have met ``defense`` (the families and
    their adaptive variants; the listed attacks are the config's own)."""
    return suite_for([], defense, batch_size=batch_size, server=server)


def _attack_classes() -> list[type[Attack]]:
    """Every attack class defined so far that has a name (built-in, or a plugin imported)."""
    found: list[type[Attack]] = []
    todo = [Attack]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.name and dataclasses.is_dataclass(cls) and cls not in found:
            found.append(cls)
    return sorted(found, key=lambda c: (c.name, c.__qualname__))


def _later(kind: object, value: object) -> bool:
    """Whether ``value`` is a name its registry does not hold yet (checked when used)."""
    return isinstance(kind, Registered) and isinstance(value, str) and not kind.registry.peek(value)


def check_adaptive(owner: str, setting: AdaptiveSetting) -> None:
    """Refuses a defense's adaptive ``setting`` that no attack can take: a parameter no attack
    declares as adaptive (`Attack.adaptive_parameters`), or a value every attack that has the
    parameters refuses. A registered name (a ``loss``) not registered yet passes: plugins load
    with their registry, and the variant is checked when it is built.

    Raises:
        ValueError: One line naming ``owner``, the setting and what is wrong.
    """
    classes = _attack_classes()
    takers = [c for c in classes if set(setting) <= c.adaptive_parameters()]
    if not takers:
        known = sorted(set().union(*(c.adaptive_parameters() for c in classes)))
        unknown = sorted(set(setting) - set(known))
        what = (
            f"no attack has {', '.join(map(repr, unknown))}"
            if unknown
            else ("no attack has all of its parameters")
        )
        raise ValueError(
            f"{owner}: adaptive setting {dict(setting)!r}: {what}; attack parameters: "
            + ", ".join(known)
        )
    errors = []
    for cls in takers:
        kinds = {field.name: spec.kind for field, spec in declared(cls)}
        try:
            for key, value in setting.items():
                kind = kinds.get(key)
                if kind is not None and not _later(kind, value):
                    check(value, kind, f"attack {cls.name}", key)
        except ConfigError as err:
            errors.append(str(err))
            continue
        return
    raise ValueError(f"{owner}: adaptive setting {dict(setting)!r}: {errors[0]}")
