"""The catalogue of `leakbench.core.catalogue`, built from the live registries: what
``leakbench list`` prints when a plugin is installed (`build` with ``builtin_only=False``), and
the shipped ``catalogue.json`` (`build` of the built-in components only).

Rewrite the shipped file after adding or changing a built-in component or a config key::

    python -m leakbench.run.listing --write
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Callable, Iterable
from typing import Any

from leakbench.attacks import ATTACKS
from leakbench.attacks.engine.losses import LOSSES
from leakbench.attacks.priors import PRIORS
from leakbench.attacks.suite import FAMILIES, PROTOCOL
from leakbench.client.recipes import TrainingConfig
from leakbench.components.models import MODELS
from leakbench.core import catalogue
from leakbench.core.files import write_text
from leakbench.core.params import METADATA_KEY, PLAIN, SECTION, Style, aliases_of
from leakbench.core.registry import Registry
from leakbench.datasets import DATASETS, FILE_SOURCES
from leakbench.defenses import DEFENSES, Defense
from leakbench.defenses.base import STYLE as DEFENSE_STYLE
from leakbench.run.config import TOP_STYLE, top_level_kinds
from leakbench.run.reading import TABLES
from leakbench.run.sections import ThreatModel


def build(builtin_only: bool = True) -> dict[str, Any]:
    """The catalogue of what the registries hold now; with ``builtin_only``, only what
    leakbench itself defines (a plugin's or a test's registration is left out)."""

    def names(registry: Registry[Any]) -> list[str]:
        return [n for n in registry if not builtin_only or _builtin(registry.get(n))]

    def entries(registry: Registry[Any], extra: Callable[[str, Any], dict[str, Any]]) -> list:
        return [
            {"name": n, "modality": registry.modality_of(n), "summary": _summary(registry.get(n))}
            | extra(n, registry.get(n))
            for n in names(registry)
        ]

    def none(name: str, item: Any) -> dict[str, Any]:
        return {}

    def attack(name: str, cls: type) -> dict[str, Any]:
        return _component(cls, f"attack {name}", PLAIN)

    def prior(name: str, cls: type) -> dict[str, Any]:
        return _component(cls, f"prior {name}", PLAIN)

    def defense(name: str, cls: type[Defense]) -> dict[str, Any]:
        adaptive = getattr(cls, "adaptive", ())
        return _component(cls, f"defense {name}", DEFENSE_STYLE) | {
            "adaptive": [" ".join(f"{k}={v}" for k, v in a.items()) for a in adaptive],
            "level": cls.level,
        }

    return {
        "format": catalogue.FORMAT,
        "datasets": entries(DATASETS, none),
        "file_sources": entries(FILE_SOURCES, none),
        "models": entries(MODELS, none),
        "attacks": entries(ATTACKS, attack),
        "priors": entries(PRIORS, prior),
        "defenses": entries(DEFENSES, defense),
        "suite": {"protocol": PROTOCOL, "families": list(FAMILIES)},
        # The names a `Registered` parameter accepts, by the kind of its registry.
        "names": {r.kind: names(r) for r in (ATTACKS, DEFENSES, PRIORS, LOSSES, MODELS)},
        "config": {
            "values": [
                {"name": name, "kind": catalogue.kind_to_json(kind)}
                for name, kind in top_level_kinds()
            ],
            "style": dataclasses.asdict(TOP_STYLE),
            "tables": sorted(TABLES),
            "sections": {
                "training": _component(TrainingConfig, "training", SECTION)
                | {"extra_keys": ["enabled"], "defaults": _defaults(TrainingConfig())},
                "threat_model": _component(ThreatModel, "threat_model", SECTION)
                | {"extra_keys": []},
            },
        },
    }


def _defaults(training: TrainingConfig) -> dict[str, Any]:
    """The budget a ``[training]`` table gets where it says nothing (for `check_fair_budget`
    before TensorFlow loads)."""
    dp = training.dp
    return {
        "epochs": training.epochs,
        "learning_rates": list(training.learning_rates),
        "dp": {
            "enabled": dp.enabled,
            "epochs": dp.epochs,
            "learning_rates": list(dp.learning_rates),
        },
    }


def _builtin(item: Any) -> bool:
    return str(getattr(item, "__module__", "")).startswith("leakbench.")


def _summary(obj: object) -> str:
    return (obj.__doc__ or "").strip().splitlines()[0] if obj.__doc__ else ""


def _component(cls: type, where: str, style: Style) -> dict[str, Any]:
    """A component's parameters as the catalogue holds them: one ``leakbench list`` line each,
    and for the checks, whether it is required and its kind (None where undeclared or not a
    plain kind)."""
    params = []
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        line = f"{f.name}={'required' if f.default is dataclasses.MISSING else repr(f.default)}"
        declared = f.metadata.get(METADATA_KEY)
        if declared is not None:
            line += f"  {declared.kind.describe(style)}"
            if declared.doc:
                line += f" ({declared.doc})"
        kind = None if declared is None else catalogue.kind_to_json(declared.kind)
        params.append(
            {"name": f.name, "line": line, "init": f.init, "required": required, "kind": kind}
        )
    return {
        "where": where,
        "style": dataclasses.asdict(style),
        "params": params,
        "aliases": sorted(a.old for a in aliases_of(cls)),
    }


def text(catalogue_data: dict[str, Any]) -> str:
    """``catalogue_data`` as the shipped file's text: stable key order, one trailing newline."""
    return json.dumps(catalogue_data, indent=1, sort_keys=True) + "\n"


def broken_plugins() -> Iterable[str]:
    """One message per plugin that failed to load, each once (named datasets and file sources
    share their plugins)."""
    broken: dict[str, None] = {}
    for registry in (DATASETS, FILE_SOURCES, ATTACKS, PRIORS, DEFENSES):
        broken.update(dict.fromkeys(str(err) for err in registry.broken().values()))
    return list(broken)


def main(argv: list[str]) -> int:
    """``--write``: rewrite the shipped catalogue; ``--check``: exit 1 if it is stale."""
    if argv not in (["--write"], ["--check"]):
        print("usage: python -m leakbench.run.listing --write | --check", file=sys.stderr)
        return 2
    new = text(build())
    path = catalogue.FILE
    if argv == ["--check"]:
        return 0 if path.read_text(encoding="utf-8") == new else 1
    write_text(path, new)  # type: ignore[arg-type]
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
