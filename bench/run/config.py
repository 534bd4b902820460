"""The run description: `RunSpec`, each of its fields declared once, and `build_run`, the one
constructor that every entry point goes through.

A TOML config (`parse_config`, `load_config` and the built-in default, ``default.toml``),
`leakbench.audit`, the Flower auditor and the checkpoints of a leakage-over-training run each
give `build_run` a plain nested mapping (what a TOML file parses to). Its value keys are
`RunSpec`'s declared fields (`leakbench.core.params.param`: default, kind, doc, message); its
tables are read by `leakbench.run.reading`; the checks that join several fields are in
`leakbench.run.checks`, and the grid expansion in `leakbench.run.grid`. A config file's relative
paths are its folder's (`load_config`, `resolve_paths`), and its plugins are loaded before its
names are resolved; a run's record, ``config.toml``, is read as written (`load_record`).
"""

from __future__ import annotations

import copy
import dataclasses
import os
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

import tomli_w

from leakbench.attacks import Attack, attacks_of, make_attack
from leakbench.attacks.suite import PROTOCOL, SUITES, suite_for
from leakbench.attacks.text.base import TextAttack
from leakbench.attacks.text.suite import make_text_attack, text_suite_for
from leakbench.client.recipes import TrainingConfig
from leakbench.components.lpips import DEFAULT_VARIANT
from leakbench.components.lpips_weights import VARIANTS
from leakbench.components.models import MODELS
from leakbench.components.saved_models import is_saved_model, saved_model_path
from leakbench.core.canonical import canonical_json
from leakbench.core.errors import ConfigError
from leakbench.core.federated import LocalTraining
from leakbench.core.params import Int, Kind, Style, check, declared, param, validate
from leakbench.core.plugins import load_plugins
from leakbench.datasets import modality_of
from leakbench.datasets._util import MAX_IMAGE_SIDE
from leakbench.datasets.loading import source_path
from leakbench.defenses import DEFENSES, Defense, make_defense
from leakbench.outputs.tables import DEFAULT_MAX_ACCURACY_DROP
from leakbench.run.checks import (
    check_epsilon_audit,
    check_fedavg_defenses,
    check_learned_client_values,
    check_other_run,
    check_server,
    check_statistics,
    check_text_run,
    check_threat_model,
    check_unique,
    suits,
)
from leakbench.run.grid import count, expand
from leakbench.run.kinds import MAX_CHECKPOINTS, Described, Seeds, is_number
from leakbench.run.reading import (
    TABLES,
    read_components,
    read_epsilon_audit,
    read_text,
    read_threat_model,
    read_training,
)
from leakbench.run.sections import (
    LATER_THREAT_KEYS,
    ComponentSpec,
    EpsilonAuditSpec,
    TextSettings,
    ThreatModel,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

# The built-in benchmark, shipped as package data: what `load_config(None)` reads.
DEFAULT_CONFIG_FILE = files("leakbench.run") / "default.toml"
# Measured by benchmarks/attack_speed.py: on a 2-core CPU the time per attack is flat from 1 to
# 8 problems per program and grows beyond (the per-problem history stops fitting in cache).
DEFAULT_PARALLEL_TRIALS = 8
# The largest first_batch: with at most 100,000 images, every batch index stays below the
# attack seeds' stride (`leakbench.core.seeds.ATTACK_STRIDE`).
MAX_FIRST_BATCH = 900_000

# The most trials an image run may plan (seeds x batches x defense and attack configurations,
# before the suite adds its attacks). Committed configs plan at most about 6,000; at a second
# a trial, a million is eleven days of one core, so more is a slip, refused before planning.
MAX_PLANNED_TRIALS = 1_000_000

# The config format this version reads. A config may state it (``schema_version = 1``); one
# written for another format is refused instead of being half understood.
SCHEMA_VERSION = 1


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


# The most plugins a config may name (a run needs a few).
MAX_PLUGINS = 100


def _is_plugin_list(value: Any) -> bool:
    return (
        isinstance(value, (list, tuple))
        and len(value) <= MAX_PLUGINS
        and all(isinstance(v, str) and v.strip() for v in value)
    )


def _is_run_name(value: Any) -> bool:
    return (
        isinstance(value, str) and bool(value) and all(ch.isalnum() or ch in "-_" for ch in value)
    )


def _is_image_size(value: Any) -> bool:
    # At most MAX_IMAGE_SIDE (1024) a side: the attacks keep several float32 copies of every
    # attacked image, and the whole dataset is resized, so larger sizes ask for gigabytes.
    return value is None or (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(
            isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_IMAGE_SIDE
            for v in value
        )
    )


def _model_name(value: str) -> str:
    if is_saved_model(value):
        saved_model_path(value)  # a missing or wrong file is refused now; loading checks the rest
        return value
    # An unknown name raises the registry's own error; a model of either modality is checked
    # against the dataset's by build_run.
    MODELS.get(value)
    return value


# Top-level values are named alone in messages: "images must be an integer in [1, 100000]".
_TOP = Style(joiner="")


def _key(default: Any, kind: Kind, doc: str = "") -> Any:
    """A top-level key declared with `param`; its doc is what ``kind`` accepts unless given."""
    return param(default, kind, doc=doc or kind.describe(_TOP))


@dataclasses.dataclass(frozen=True)
class _Header:
    """The top-level keys that state what a config was written for: checked, not kept (the
    run's `RunSpec.protocol` follows from its suite)."""

    schema_version: int = _key(
        SCHEMA_VERSION,
        Described(
            f"{SCHEMA_VERSION} (the config format this leakbench reads)",
            lambda v: not isinstance(v, bool) and v == SCHEMA_VERSION,
            hint="; write the config for this version or install the leakbench it was written for",
        ),
        doc=f"the config format, {SCHEMA_VERSION} (optional)",
    )
    protocol: int = _key(
        PROTOCOL,
        Described(
            f"{PROTOCOL} (the attack-suite protocol this leakbench runs; optional)",
            lambda v: not isinstance(v, bool) and v == PROTOCOL,
            hint="; a config written for another protocol needs the leakbench of that protocol",
        ),
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSpec:
    """A validated run description.

    The fields declared with `param` are the config's top-level values, checked in field order
    when a spec is made (``images must be an integer in [1, 100000], got 0``); the others are
    its tables: ``attacks`` and ``defenses`` (``[[attack]]``, ``[[defense]]``; lists sweep; no
    attack listed: the standard suite's own),
    ``training`` (None: disabled), ``threat_model`` and ``epsilon_audit`` (None: no audit).
    Build one from a config document with `build_run`, which also checks the fields together.
    """

    # Loaded first (`leakbench.core.plugins.load_plugin`), so that the names below may be theirs;
    # the resolved config records each file relative to the working directory (`resolve_paths`).
    plugins: tuple[str, ...] = _key(
        (),
        Described(
            f"a list of at most {MAX_PLUGINS} plugins, each a .py file (relative to the config's "
            "folder) or a module name",
            _is_plugin_list,
            tuple,
        ),
    )
    name: str = _key(
        "run", Described("a short name for the run (letters, digits, - and _)", _is_run_name)
    )
    dataset: str = _key(
        "digits", Described("a dataset name or PREFIX:PATH (see `leakbench list`)", _is_text)
    )
    model: str = _key(
        "lenet",
        Described(
            "a model name (see `leakbench list`; a text model for a text corpus) or keras:PATH "
            "(a saved .keras model)",
            _is_text,
            _model_name,
        ),
    )
    images: int = _key(
        8,
        Int(1, 100_000),
        doc="private examples attacked in each (defense, attack) cell, an integer >= 1",
    )
    batch_size: int = _key(
        1, Int(1, 256), doc="examples behind one shared gradient, an integer in [1, 256]"
    )
    parallel_trials: int = _key(
        DEFAULT_PARALLEL_TRIALS,
        Int(1, 1024),
        doc="trials of one attack in flight at once (attacked together in compiled programs), "
        "an integer in [1, 1024]",
    )
    seeds: tuple[int, ...] = _key((0,), Seeds())
    # The batch index of each seed's first batch (`leakbench.run.plan.plan` numbers on from it).
    first_batch: int = _key(
        0,
        Int(0, MAX_FIRST_BATCH),
        doc="the batch index of each seed's first batch, which keys its defense draw and "
        "attack start (default 0; a round r of a federated deployment is batch r), an integer "
        f"in [0, {MAX_FIRST_BATCH}]",
    )
    success_mse: float = _key(
        1e-3,
        Described("a number > 0", lambda v: is_number(v) and v > 0, float),
        doc="MSE at or below which a reconstruction counts as a success, > 0",
    )
    max_accuracy_drop: float = _key(
        DEFAULT_MAX_ACCURACY_DROP,
        Described(
            "test accuracy a defense may cost and still be ranked on the leaderboard, a number "
            "in [0, 1] (default 0.05)",
            lambda v: is_number(v) and 0 <= v <= 1,
            float,
        ),
    )
    lpips: str = _key(
        DEFAULT_VARIANT,
        Described(
            'the LPIPS backbone scoring every reconstruction: "alex" (default), "vgg" or '
            '"none" (no LPIPS column)',
            lambda v: v in (*VARIANTS, "none"),
        ),
    )
    image_size: tuple[int, int] | None = _key(
        None,
        Described(
            f"[height, width] of integers in [1, {MAX_IMAGE_SIDE}]",
            _is_image_size,
            lambda v: None if v is None else (v[0], v[1]),
        ),
        doc="[height, width] to resize images to (optional)",
    )
    # "standard": the attack suite of protocol `PROTOCOL` (`leakbench.attacks.suite`) runs
    # whatever the config lists; "listed": only the listed attacks (and their adaptive variants).
    suite: str = _key(
        "standard",
        Described(
            f'"standard" (default: protocol {PROTOCOL}, every attack family and each '
            'defense\'s adaptive attacks, whatever the config lists) or "listed" (only the '
            "attacks listed and their adaptive variants; verdicts other than a leak are "
            "untested)",
            lambda v: v in SUITES,
        ),
    )
    # Whether each defense's adaptive attacks (`leakbench.defenses.Defense.adaptive`) run too.
    adaptive: bool = _key(
        True,
        Described(
            "true (default) to run each defense's adaptive attacks too, false to run only the "
            "attacks listed",
            lambda v: isinstance(v, bool),
        ),
    )
    attacks: tuple[ComponentSpec, ...]
    defenses: tuple[ComponentSpec, ...] = (ComponentSpec("none", {}),)
    training: TrainingConfig | None = TrainingConfig()
    threat_model: ThreatModel = ThreatModel()
    # The epsilon audit of every defense configuration (``[epsilon_audit]``), None: no audit.
    epsilon_audit: EpsilonAuditSpec | None = None
    # A text run's settings (``[text]``; its dataset is a text corpus), None: an image run.
    text: TextSettings | None = None

    def __post_init__(self) -> None:
        validate(self, "", _TOP)

    @property
    def local(self) -> LocalTraining:
        """Each client's local training (`ThreatModel.local_training`)."""
        return self.threat_model.local_training(self.batch_size)

    @property
    def simulated_local(self) -> LocalTraining | None:
        """The local training the attacks unroll: the clients' own, or None when the server
        sees a gradient (FedSGD with ``shares = "update"``)."""
        if self.local.fedsgd and self.threat_model.shares == "update":
            return None
        return self.local

    @property
    def modality(self) -> str:
        """The run's modality: its dataset's (`leakbench.datasets.modality_of`)."""
        return modality_of(self.dataset)

    @property
    def observed_batch(self) -> int:
        """Examples behind the gradient the server observes: every client's batch."""
        return self.batch_size * self.threat_model.clients

    def attack_grid(self) -> list[Attack]:
        """Every attack configuration of the run, sweeps expanded (an image run's)."""
        return [make_attack(c.name, **p) for c in self.attacks for p in expand(c.params)]

    def text_attack_grid(self) -> list[TextAttack]:
        """Every text attack configuration of a text run, sweeps expanded."""
        return [make_text_attack(c.name, **p) for c in self.attacks for p in expand(c.params)]

    def text_attacks_for(self, defense: Defense) -> list[TextAttack]:
        """The text attacks run against ``defense`` (`leakbench.attacks.text.suite`): under the
        standard suite the text families too, and (unless ``adaptive = false``) the adaptive
        settings, those of every defense of the run against ``none``."""
        grid = self.text_attack_grid()
        if not self.adaptive:
            return grid
        everyone = self.defense_grid() if defense.name == "none" else None
        return text_suite_for(
            grid, defense, standard=self.suite == "standard", every_defense=everyone
        )

    def defense_grid(self) -> list[Defense]:
        """Every defense configuration of the run, sweeps expanded."""
        return [make_defense(c.name, **p) for c in self.defenses for p in expand(c.params)]

    @property
    def standard(self) -> bool:
        """Whether the run follows the standard suite (``suite = "standard"`` and not ``adaptive
        = false``, which lists its attacks alone)."""
        return self.suite == "standard" and self.adaptive

    @property
    def protocol(self) -> int:
        """The suite protocol the run's verdicts follow: `PROTOCOL`, or 0 for a run of listed
        attacks only (its verdicts other than a leak are ``untested``)."""
        return PROTOCOL if self.standard else 0

    def attacks_for(self, defense: Defense) -> list[Attack]:
        """The attacks run against ``defense``: under the standard suite those of
        `leakbench.attacks.suite.suite_for` (``none`` meets every defense's adaptive attacks,
        so each vouches for itself there); otherwise the configured ones, then (unless
        ``adaptive = false``) its adaptive variants (`adaptive_variants`)."""
        grid = self.attack_grid()
        if not self.adaptive:
            return grid
        if self.suite == "listed":
            return grid + adaptive_variants(grid, defense, self.threat_model.server == "honest")
        everyone = self.defense_grid() if defense.name == "none" else None
        chosen = suite_for(
            grid,
            defense,
            batch_size=self.observed_batch,
            server=self.threat_model.server,
            every_defense=everyone,
        )
        # What the suite adds must suit the threat model (a listed attack that does not is
        # refused by the config checks instead).
        return [a for a in chosen if a in grid or suits(a, self.threat_model.clients)]

    def all_attacks(self) -> list[Attack]:
        """Every attack configuration the run plans, adaptive variants included, once each."""
        seen: dict[str, Attack] = {}
        for defense in self.defense_grid():
            for attack in self.attacks_for(defense):
                seen.setdefault(canonical_json([attack.name, attack.params()]), attack)
        return list(seen.values())

    def to_toml(self) -> str:
        """The resolved config (defaults filled in), as TOML that loads back to this spec: the
        text of a run's ``config.toml`` record, which the run directory's check compares."""
        return record_text(self.to_mapping())

    def to_mapping(self) -> dict[str, Any]:
        """The resolved config as a mapping (`to_toml`'s document), which `build_run` builds
        back into this spec."""
        doc: dict[str, Any] = {
            # Written only when set, so a config without plugins resolves to the text it did.
            **({"plugins": list(self.plugins)} if self.plugins else {}),
            "name": self.name,
            "dataset": self.dataset,
            "model": self.model,
            "images": self.images,
            "batch_size": self.batch_size,
            "seeds": list(self.seeds),
            "success_mse": self.success_mse,
            "parallel_trials": self.parallel_trials,
        }
        if self.image_size is not None:
            doc["image_size"] = list(self.image_size)
        if self.max_accuracy_drop != DEFAULT_MAX_ACCURACY_DROP:
            # Written only when set, so the resolved configs of earlier runs stay the same text.
            doc["max_accuracy_drop"] = self.max_accuracy_drop
        if self.lpips != DEFAULT_VARIANT:
            doc["lpips"] = self.lpips
        if not self.adaptive:
            doc["adaptive"] = False  # the opt-out is recorded; the default adds nothing
        doc["suite"] = self.suite
        if self.standard:
            doc["protocol"] = self.protocol  # a listed run follows no protocol (its suite says so)
        if self.first_batch:
            doc["first_batch"] = self.first_batch  # written only when set, as above
        if self.attacks:  # none listed: the standard suite's own attacks (nothing to write)
            doc["attack"] = [{"name": c.name, **c.params} for c in self.attacks]
        doc["defense"] = [{"name": c.name, **c.params} for c in self.defenses]
        if self.text is not None:  # a text run only: an image run's record is as it was
            text = dataclasses.asdict(self.text)
            doc["text"] = {**text, "batch_sizes": list(text["batch_sizes"])}
        if self.training is None:
            doc["training"] = {"enabled": False}
        else:
            doc["training"] = {"enabled": True, **dataclasses.asdict(self.training)}
        doc["threat_model"] = threat_table(self.threat_model)
        if self.epsilon_audit is not None:  # written only when set, as max_accuracy_drop above
            doc["epsilon_audit"] = dataclasses.asdict(self.epsilon_audit)
        return doc


# The attack that carries a defense's adaptive setting when no configured attack can.
FALLBACK_ADAPTIVE_ATTACK = "dlg"


def adaptive_variants(
    attacks: list[Attack], defense: Defense, fallback: bool = True
) -> list[Attack]:
    """The adaptive attacks against ``defense`` that ``attacks`` lack, in order.

    Each setting the defense declares (`leakbench.defenses.Defense.adaptive_attacks`, e.g.
    ``AdaptiveSetting({"match": "kept"})``) is applied to every attack of ``attacks`` that takes
    all its parameters (`leakbench.attacks.Attack.with_setting`), keeping that attack's other
    parameters (its budget, its priors): the adaptive attacker is as strong as the one
    configured. Where no attack takes a setting, the
    `FALLBACK_ADAPTIVE_ATTACK` with its defaults carries it, unless ``fallback`` is false (a
    malicious server's run, where the honest fallback may not run; the settings tune
    optimisation attacks, and the malicious attacks optimise nothing).
    """
    known = {canonical_json([a.name, a.params()]) for a in attacks}
    added: list[Attack] = []

    def add(attack: Attack) -> None:
        text = canonical_json([attack.name, attack.params()])
        if text not in known:
            known.add(text)
            added.append(attack)

    for setting in defense.adaptive_attacks():
        variants = [v for v in (a.with_setting(setting) for a in attacks) if v is not None]
        for variant in variants:
            add(variant)
        if not variants and fallback:
            add(make_attack(FALLBACK_ADAPTIVE_ATTACK, **setting))
    return added


def without_adaptive(defenses: Sequence[Defense]) -> list[str]:
    """One warning line for each defense of ``defenses`` (a run's `RunSpec.defense_grid`; a
    chain's steps count one by one) that declares no adaptive attack and is not one of
    leakbench's own: a plugin's or one registered in Python. The run goes on (the standard
    suite's untuned families still meet it), but its ``holds`` says only that attacks built
    for no defense in particular failed. The built-in defenses without a declaration
    (``none``, ``gaussian``, ``fp16``, ...) are reviewed with the suite and say nothing."""
    named: dict[str, None] = {}
    for defense in defenses:
        for part in getattr(defense, "steps", None) or (defense,):
            module = type(part).__module__
            own = module == "leakbench" or module.startswith("leakbench.")
            if not own and not part.adaptive_attacks():
                named.setdefault(part.name)
    return [
        f"defense {name} declares no adaptive attack (its class's `adaptive` is empty): the "
        "standard suite meets it with untuned attacks only, so a 'holds' may be a weak "
        "attack's; declare the attack settings that answer it (docs/CONTRIBUTING.md, 'A "
        "defense'), or list the learned attack, which learns through any defense "
        '([[attack]] name = "learned")'
        for name in named
    ]


# The value keys of a config in the order they are checked: (name, default, kind, whether
# `RunSpec` keeps it). The header's schema_version comes first, its protocol after ``suite``.
_VALUES = [(f.name, f.default, d.kind, True) for f, d in declared(RunSpec)]
_HEADER = {f.name: (f.name, f.default, d.kind, False) for f, d in declared(_Header)}
_VALUES.insert(0, _HEADER["schema_version"])
_VALUES.insert([v[0] for v in _VALUES].index("suite") + 1, _HEADER["protocol"])
_TOP_KEYS = [v[0] for v in _VALUES] + list(TABLES)


def load_config(
    path: str | Path | None, settings: Sequence[str] = (), *, plugins: Sequence[str] = ()
) -> RunSpec:
    """Reads and validates a TOML config file; ``None`` gives the built-in default benchmark
    (`DEFAULT_CONFIG_FILE`). ``settings`` (the CLI's ``--set``) change its values first
    (`with_settings`); ``plugins`` (the CLI's ``--plugin``) are loaded after the config's own.

    A relative path in the file (a dataset's ``npz:``, ``idx:``, ``folder:`` or ``text:`` PATH,
    a saved model's ``keras:PATH``, also among ``threat_model.checkpoints``, and a plugin file)
    is resolved against the file's folder; one given by ``settings`` or ``plugins`` against the
    working directory. The resolved config writes it relative to the working directory, as a
    run's ``config.toml`` always has (`resolve_paths`); an absolute path stays as written.

    Raises:
        ConfigError: One line naming the first key refused, or a relative path that names
            nothing (with the path it was resolved to).
        PluginError: One line naming the plugin that cannot be loaded.
    """
    written: dict[str, str] = {}  # a relative path of the file as resolved -> as written
    if path is None:
        source, text = str(DEFAULT_CONFIG_FILE), DEFAULT_CONFIG_FILE.read_text(encoding="utf-8")
        doc = _toml_document(text, source)
    else:
        source, text = _read_config(Path(path))
        doc, written = _from_folder(_toml_document(text, source), Path(path).parent)
    doc = with_settings(doc, settings)
    # Checked once the settings are in: a file's path that a setting replaced is not needed.
    _map_paths(doc, lambda label, kind, value: _exists(label, kind, value, written))
    doc = resolve_paths(doc, Path.cwd(), _GIVEN)  # the settings' (the file's are found)
    if plugins:
        given = resolve_paths({"plugins": list(plugins)}, Path.cwd(), _GIVEN)["plugins"]
        held = doc.get("plugins", [])
        doc["plugins"] = [*held, *given] if isinstance(held, list) else held
    return build_run(doc, stacklevel=2)


def load_record(path: str | Path, settings: Sequence[str] = ()) -> RunSpec:
    """Reads the resolved config a run recorded (a run directory's ``config.toml``, written by
    `RunSpec.to_toml`) as it is written, loading the plugins it names: a relative path in it is
    the working directory's (`resolve_paths`), not its folder's, so its keys are those of its
    trials. Use `load_config` for a config a user wrote. ``settings`` as there.

    Raises:
        ConfigError: One line naming the first key refused.
    """
    source, text = _read_config(Path(path))
    return build_run(with_settings(_toml_document(text, source), settings), stacklevel=2)


def _read_config(path: Path) -> tuple[str, str]:
    try:
        return str(path), path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"config file {path} cannot be read: {err}") from None


# What a relative path of a config was resolved against, as `resolve_paths`'s errors say it.
_IN_FILE = "a relative path in a config file is resolved against the config's folder"
_GIVEN = "a relative path given on the command line is resolved against the working directory"


def resolve_paths(
    doc: Mapping[str, Any], base: Path, rule: str = _IN_FILE, *, check: bool = True
) -> dict[str, Any]:
    """``doc`` (a config document) with each relative path it names resolved against ``base``:
    a dataset's PATH (`leakbench.datasets.loading.PATH_SOURCES`), a saved model's
    (``keras:PATH``, as ``model`` and among ``threat_model.checkpoints``) and a plugin file
    (``*.py``). Each is written as a run records it, relative to the working directory (the
    meaning of a relative path in a run's ``config.toml``, which the workers, ``rescore``,
    ``merge`` and the board read), so that a config run from its own folder resolves to the
    text it always did. An absolute path, or one starting with ``~``, is kept as written, and a
    value of the wrong type is left to `build_run`'s checks.

    Raises:
        ConfigError: With ``check``, a relative path that names nothing: one line with the path
            it was resolved to and ``rule`` (what it was resolved against).
    """

    def resolve(label: str, kind: str, value: Any) -> Any:
        return _resolved(label, kind, value, base, rule, check)

    return _map_paths(doc, resolve)


def _from_folder(doc: Mapping[str, Any], folder: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """`resolve_paths` of a config file's document against its ``folder``, unchecked, and what
    each resolved value was written as (checked by `_exists` once the settings are in)."""
    written: dict[str, str] = {}

    def resolve(label: str, kind: str, value: Any) -> Any:
        new = _resolved(label, kind, value, folder, _IN_FILE, False)
        if new is not value:
            written[new] = value
        return new

    return _map_paths(doc, resolve), written


def _map_paths(doc: Mapping[str, Any], change: Callable[[str, str, Any], Any]) -> dict[str, Any]:
    """``doc`` with ``change(label, kind, value)`` applied to each value that may name a path:
    ``dataset`` and ``model``, each of ``plugins`` and of ``threat_model.checkpoints`` (kinds
    ``"dataset"``, ``"model"``, ``"plugin"``)."""
    out = dict(doc)
    for key in ("dataset", "model"):
        if key in out:
            out[key] = change(key, key, out[key])
    if isinstance(out.get("plugins"), list):
        out["plugins"] = [change(f"plugins[{i}]", "plugin", v)
                          for i, v in enumerate(out["plugins"])]  # fmt: skip
    threat = out.get("threat_model")
    if isinstance(threat, dict) and isinstance(threat.get("checkpoints"), list):
        points = [change(f"threat_model.checkpoints[{i}]", "model", v)
                  for i, v in enumerate(threat["checkpoints"])]  # fmt: skip
        out["threat_model"] = {**threat, "checkpoints": points}
    return out


def _resolved(label: str, kind: str, value: Any, base: Path, rule: str, check: bool) -> Any:
    """``value`` with its relative path resolved against ``base``, written as a run records it:
    relative to the working directory (`resolve_paths`)."""
    split = _path_of(kind, value)
    if split is None:
        return value
    prefix, path = split
    if not path or path.startswith("~") or Path(path).is_absolute():
        return value
    absolute = os.path.abspath(base / path)
    if check and not os.path.exists(absolute):
        raise ConfigError(f"{label} {value}: {absolute} does not exist ({rule})")
    here = os.getcwd()
    if os.path.realpath(base) == os.path.realpath(here):
        return value  # the working directory's already: kept as written
    try:
        return prefix + os.path.relpath(absolute, here)
    except ValueError:  # on another drive than the working directory (Windows)
        return prefix + absolute


def _exists(label: str, kind: str, value: Any, written: Mapping[str, str]) -> Any:
    """Refuses ``value`` if a config file wrote it as a relative path that names nothing."""
    split = _path_of(kind, value)
    if split is not None and value in written and not os.path.exists(split[1]):
        absolute = os.path.abspath(split[1])
        raise ConfigError(f"{label} {written[value]}: {absolute} does not exist ({_IN_FILE})")
    return value


def _path_of(kind: str, value: Any) -> tuple[str, str] | None:
    """``(PREFIX:, PATH)`` of a value of ``kind`` (``"dataset"``, ``"model"``, ``"plugin"``)
    that names a file or folder, else None."""
    if not isinstance(value, str):
        return None
    if kind == "plugin":
        return ("", value) if value.endswith(".py") else None
    if kind == "dataset":
        path = source_path(value)
        return None if path is None else (value[: len(value) - len(path)], path)
    if not is_saved_model(value):
        return None
    prefix, _, path = value.partition(":")
    return prefix + ":", path


def parse_config(text: str, source: str = "config", stacklevel: int = 1) -> RunSpec:
    """Validates TOML text into a `RunSpec` (`build_run` of the document it parses to).

    Args:
        text: A config's TOML text (docs/configs.md).
        source: The name that errors give the text.
        stacklevel: Where a warning of the config points, counted from the caller.

    Returns:
        The validated `RunSpec`, to give to `leakbench.run.runner.run_benchmark`.

    Example:
        >>> spec = parse_config('dataset = "digits"')  # doctest: +SKIP
    """
    return build_run(_toml_document(text, source), stacklevel=stacklevel + 1)


# The deepest nesting of arrays and tables a config may have (the document itself is level 1).
# Committed configs nest at most 5 levels (a chain defense's steps with their parameters); the
# readers of a config (tomllib, copies, checks) recurse, and Python's recursion limit stops
# them near 500 levels with a traceback, so the depth is checked first.
MAX_DEPTH = 32
_TOO_DEEP = f"arrays or tables nested more than {MAX_DEPTH} levels deep (a config needs a few)"


def _toml_document(text: str, source: str) -> dict[str, Any]:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{source} is not valid TOML: {err}") from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise ConfigError(f"{source}: {_TOO_DEEP}") from None
    _check_depth(doc, source)
    return doc


def _check_depth(value: Any, source: str) -> None:
    """Refuses ``value`` if its arrays and tables nest deeper than `MAX_DEPTH` (walked without
    recursion, so that any depth gets the one-line refusal)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ConfigError(f"{source}: {_TOO_DEEP}")
        if isinstance(item, Mapping):
            stack.extend((child, depth + 1) for child in item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend((child, depth + 1) for child in item)


def record_text(doc: Mapping[str, Any]) -> str:
    """A resolved config document as the TOML text of a ``config.toml`` record: the one place
    that writes config TOML (`RunSpec.to_toml`, and the Flower auditor's record of what it
    ran)."""
    return tomli_w.dumps(doc)


def with_settings(doc: Mapping[str, Any], settings: Sequence[str]) -> dict[str, Any]:
    """A copy of the config document ``doc`` with each ``KEY=VALUE`` of ``settings`` set, in
    order. KEY is a dotted path of tables (``images``, ``training.dp.noise_multiplier``); VALUE
    is a TOML value (``8``, ``1e-3``, ``true``, ``"text"``, ``[0, 1]``,
    ``[{name = "idlg"}]``), and a bare word that is not one (``cifar10``, ``folder:/data``) is
    the string it spells. A list of tables (``attack``, ``defense``) is set whole.

    Raises:
        ConfigError: One line naming the setting refused.
    """
    out = copy.deepcopy(dict(doc))
    for setting in settings:
        key, sep, text = setting.partition("=")
        path = key.strip().split(".")
        if not sep or not all(part.strip() for part in path):
            raise ConfigError(f"--set {setting!r}: expected KEY=VALUE, e.g. images=8")
        table = out
        for depth, part in enumerate(path[:-1]):
            table = table.setdefault(part.strip(), {})
            if not isinstance(table, dict):
                where = ".".join(path[: depth + 1])
                what = "a list of tables; set it whole" if isinstance(table, list) else "a value"
                raise ConfigError(f"--set {setting!r}: {where} is {what}, not a table")
        table[path[-1].strip()] = _setting_value(setting, text.strip())
    return out


def _setting_value(setting: str, text: str) -> Any:
    where = f"--set {setting.partition('=')[0].strip()}=..."
    try:
        value = tomllib.loads(f"value = {text}")["value"]
    except RecursionError:
        raise ConfigError(f"{where}: {_TOO_DEEP}") from None
    except tomllib.TOMLDecodeError:
        if re.fullmatch(r"[\w.:/+-]+", text):
            return text
        raise ConfigError(
            f"--set {setting!r}: the value is neither TOML nor a bare word "
            "(quote a string with spaces: KEY='\"a b\"')"
        ) from None
    _check_depth(value, where)
    return value


def build_run(doc: Mapping[str, Any], *, runnable: bool = True, stacklevel: int = 1) -> RunSpec:
    """The run described by ``doc``, a config document: a plain nested mapping of what a TOML
    config holds (tuples are read as the lists TOML has).

    Every value and table is checked, in the order of the keys of a config; every attack and
    defense is built once to check it. With ``runnable`` (the default) the fields are also
    checked together, as a run needs them (`leakbench.run.checks`); without it, for the record
    of what ran elsewhere (the Flower auditor's ``config.toml``), they are not. A notice about
    an old parameter name points ``stacklevel`` frames up (1: the caller).

    Raises:
        ConfigError: One line naming the first key refused.
    """
    _check_depth(doc, "config")
    doc = _plain(doc)
    for key in doc:
        if key not in _TOP_KEYS:
            raise ConfigError(f"unknown key {key!r}; allowed: {', '.join(sorted(_TOP_KEYS))}")
    values = {}
    for name, default, kind, kept in _VALUES:
        value = check(doc.get(name, default), kind, "", name, _TOP)
        if name == "plugins":  # first, so that the names checked after may be theirs
            value = load_plugins(value)
        if kept:
            values[name] = value
    modality = modality_of(values["dataset"])
    text = modality == "text"
    _check_model_modality(values["model"], values["dataset"], modality)
    threat_model = read_threat_model(doc.get("threat_model", {}))
    if runnable and modality == "image":
        check_threat_model(threat_model, values["batch_size"], values["images"])
    tables: dict[str, Any] = {
        "attacks": _read_attacks(doc.get("attack"), values, threat_model, modality, stacklevel + 1)
    }
    if "defense" in doc:
        tables["defenses"] = read_components(doc["defense"], "defense", DEFENSES, stacklevel + 1)
    spec = RunSpec(
        **values,
        **tables,
        # Only an image run trains by [training] (a text run by [text]; checks refuse it).
        training=read_training(doc.get("training", {}), stacklevel + 1)
        if modality == "image"
        else None,
        threat_model=threat_model,
        epsilon_audit=read_epsilon_audit(doc.get("epsilon_audit")),
        text=read_text(doc.get("text"), values["dataset"], text),
    )
    if text:
        check_text_run(spec, doc, runnable)
    elif modality != "image":
        check_other_run(spec, doc, runnable)
    elif runnable:
        _check_plan_size(spec)
        _check_grids(spec)
        check_epsilon_audit(spec.epsilon_audit, spec.local)
    return spec


def _check_model_modality(model: str, dataset: str, modality: str) -> None:
    """Refuses a registered model of another modality than the dataset's (one line)."""
    if is_saved_model(model):
        return
    kind = MODELS.modality_of(model)
    if kind == modality:
        return
    if kind == "text" and modality == "image":
        raise ConfigError(
            f"model {model} is a text model; dataset {dataset} is an image "
            "dataset (a text run's dataset is a text corpus: tinyshakespeare or text:PATH)"
        )
    if modality == "text":
        return  # the text checks name the text models (`check_text_run`)
    raise ConfigError(
        f"model {model} is {_a(kind)} model; dataset {dataset} is {_a(modality)} dataset: "
        f"choose {_a(modality)} model ({', '.join(MODELS.names(modality))}) or keras:PATH"
    )


def _a(word: str) -> str:
    return f"an {word}" if word[:1] in "aeiou" else f"a {word}"


def _read_attacks(
    tables: Any, values: Mapping[str, Any], threat: ThreatModel, modality: str, stacklevel: int
) -> tuple[ComponentSpec, ...]:
    """The ``[[attack]]`` tables of the run's ``modality``; none under the standard suite,
    which brings its own attacks (`leakbench.attacks.suite`), and otherwise refused in one
    line."""
    registry = attacks_of(modality)
    if tables is not None:
        return read_components(tables, "attack", registry, stacklevel + 1)
    why = None
    if values["suite"] == "listed":
        why = 'suite = "listed" runs only the attacks a config lists'
    elif not values["adaptive"]:
        why = "adaptive = false runs only the attacks a config lists"
    elif threat.server == "malicious" and modality == "image":
        why = "the standard suite's families attack an honest server's gradient"
    if why is None:
        return ()
    raise ConfigError(
        f"{why}: add at least one [[attack]] table (names: {', '.join(registry.names())})"
    )


def _plain(value: Any) -> Any:
    """``value`` as a TOML document holds it: mappings as dicts, tuples as lists."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def check_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """Top-level ``values`` of a config (``name``, ``images``, ...; not ``plugins``), each
    checked by its declared kind in the order `build_run` checks them, and returned as a run
    holds them: for a record of what ran elsewhere, which checks its parts and builds no
    `RunSpec` (the Flower auditor's ``config.toml``).

    Raises:
        ConfigError: One line naming the first value refused, or a key that is none.
    """
    allowed = [name for name, *_ in _VALUES if name != "plugins"]
    for key in values:
        if key not in allowed:
            raise ConfigError(f"unknown key {key!r}; allowed: {', '.join(sorted(allowed))}")
    return {
        name: check(values[name], kind, "", name, _TOP)
        for name, _, kind, _ in _VALUES
        if name in values
    }


def threat_table(threat: ThreatModel) -> dict[str, Any]:
    """``threat`` as a resolved config's ``[threat_model]`` table (`RunSpec.to_mapping`): every
    key, those of `LATER_THREAT_KEYS` only when set, so that the resolved configs of earlier
    runs stay the same text."""
    table = dataclasses.asdict(threat)
    default = dataclasses.asdict(ThreatModel())
    for key in LATER_THREAT_KEYS:
        if table[key] == default[key]:
            del table[key]
    return table


def _check_plan_size(spec: RunSpec) -> None:
    """Refuses a run that plans more than `MAX_PLANNED_TRIALS` trials, counted from the config
    without planning them (one line naming the factors)."""
    defenses = sum(count(c.params) for c in spec.defenses)
    # At least one: a config that lists none runs the standard suite's.
    attacks = max(1, sum(count(c.params) for c in spec.attacks))
    batches = spec.images // spec.observed_batch
    trials = len(spec.seeds) * batches * defenses * attacks
    if trials > MAX_PLANNED_TRIALS:
        raise ConfigError(
            f"the run plans {trials:,} trials ({len(spec.seeds)} seeds x {batches} batches x "
            f"{defenses} defense x {attacks} attack configurations), at most "
            f"{MAX_PLANNED_TRIALS:,}; use fewer seeds, images or swept values"
        )


def _check_grids(spec: RunSpec) -> None:
    """Refuses repeated attacks or defenses, and attacks or defenses that the run's batches
    and threat model do not allow (one line each)."""
    check_unique("attack", spec.attack_grid())
    attack_grid = spec.all_attacks()
    for attack in attack_grid:
        check_server(attack, spec.threat_model.server)
        attack.check_batch_size(spec.observed_batch)
        check_learned_client_values(attack, spec.threat_model.clients)
    check_unique("defense", spec.defense_grid())
    check_statistics(spec.threat_model, attack_grid)
    check_fedavg_defenses(spec.defense_grid(), spec.local)


__all__ = [
    "DEFAULT_CONFIG_FILE",
    "FALLBACK_ADAPTIVE_ATTACK",
    "LATER_THREAT_KEYS",
    "MAX_CHECKPOINTS",
    "ComponentSpec",
    "EpsilonAuditSpec",
    "RunSpec",
    "TextSettings",
    "ThreatModel",
    "adaptive_variants",
    "build_run",
    "check_values",
    "load_config",
    "load_record",
    "parse_config",
    "resolve_paths",
    "threat_table",
    "without_adaptive",
]
