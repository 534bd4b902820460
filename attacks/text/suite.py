"""The standard text suite: which text attacks every defense meets in a text run.

It mirrors the image suite (`leakbench.attacks.suite`), with the text attacks of `TEXT_FAMILIES`:

1. every text family that is registered, untuned (its defaults), against every defense;
2. each defense's adaptive settings applied by name to every text attack that takes them
   (`TextAttack.with_setting`): the settings the defense declares for the image attacks
   (`leakbench.defenses.Defense.adaptive_attacks`, e.g. ``match = "kept"`` against pruning), and
   the text-only ones of `TEXT_ADAPTIVE` (which leave image runs as they are);
3. the attacks the config lists, and the settings applied to them too.

``none`` meets the adaptive settings of every defense of the run, so each adaptive attack
vouches for itself there, as in image runs. A family that is not registered in this
installation is left out (the suite is what exists); the verdicts name what ran.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from leakbench.attacks.base import attacks_of, build_attack
from leakbench.attacks.text.base import TextAttack
from leakbench.core.canonical import canonical_json
from leakbench.defenses import Defense

# The text families every text run meets, in the order they run (cheapest first).
TEXT_FAMILIES = ("bag_of_words", "span", "tag")
# Text-only adaptive settings per defense name: noise and pruning break the span attack's exact
# row-space test (a threshold calibrated on clean gradients), so it accepts the candidates of
# lowest residual instead (``test = "rank"``, where an attack has that parameter).
_RANK = ({"test": "rank"},)
TEXT_ADAPTIVE: Mapping[str, tuple[Mapping[str, Any], ...]] = {
    name: _RANK for name in ("gaussian", "laplace", "relative_noise", "dpsgd", "prune", "topk")
}


def make_text_attack(name: str, **params: Any) -> TextAttack:
    """A registered text attack from its name and parameters, both checked (an image attack's
    name is refused in one line: `leakbench.attacks.base.attacks_of`)."""
    return cast(TextAttack, build_attack("text", name, params, stacklevel=2))


def _key(attack: TextAttack) -> str:
    return canonical_json([attack.name, attack.params()])


def text_families() -> list[TextAttack]:
    """The untuned text families of `TEXT_FAMILIES` registered here."""
    registered = attacks_of("text").names()
    return [make_text_attack(name) for name in TEXT_FAMILIES if name in registered]


def text_settings(defense: Defense) -> list[Mapping[str, Any]]:
    """The adaptive settings ``defense`` meets in a text run: its declared ones, then the
    text-only ones of `TEXT_ADAPTIVE`."""
    return [*defense.adaptive_attacks(), *TEXT_ADAPTIVE.get(defense.name, ())]


def text_suite_for(
    listed: Sequence[TextAttack],
    defense: Defense,
    *,
    standard: bool = True,
    every_defense: Sequence[Defense] | None = None,
) -> list[TextAttack]:
    """The text attacks against ``defense``, each once, in order: the listed ones, the families
    (when ``standard``), then the adaptive settings of ``defense`` (of ``every_defense``, the
    run's grid, for ``none``) applied to each of them that takes them."""
    base = list(listed) + (text_families() if standard else [])
    targets = every_defense if every_defense is not None else [defense]
    chosen: dict[str, TextAttack] = {}
    for attack in base:
        chosen.setdefault(_key(attack), attack)
    for target in targets:
        for setting in text_settings(target):
            for attack in base:
                variant = attack.with_setting(setting)
                if variant is not None:
                    chosen.setdefault(_key(variant), variant)
    return list(chosen.values())
