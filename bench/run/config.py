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

import dataclasses
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from leakbench.attacks import Attack, attacks_of, make_attack
from leakbench.attacks.suite import PROTOCOL, PROTOCOLS, SUITES, suite_for
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
from leakbench.defenses import DEFENSES, Defense, make_defense
from leakbench.outputs.tables import DEFAULT_MAX_ACCURACY_DROP
from leakbench.run.checks import (
    check_epsilon_audit,
    check_fair_budget,
    check_fedavg_defenses,
    check_learned_client_values,
    check_other_run,
    check_server,
    check_statistics,
    check_text_run,
    check_threat_model,
    check_unique,
    suits,
    warn_coupled_pretraining,
)
from leakbench.run.document import (
    DEFAULT_CONFIG_FILE,
    check_depth,
    read_config,
    read_document,
    record_text,
    resolve_paths,
    toml_document,
    with_settings,
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
TOP_STYLE = Style(joiner="")


def _key(default: Any, kind: Kind, doc: str = "") -> Any:
    """A top-level key declared with `param`; its doc is what ``kind`` accepts unless given."""
    return param(default, kind, doc=doc or kind.describe(TOP_STYLE))


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
            f"one of {', '.join(map(str, PROTOCOLS))} (the protocol whose verdict rules judge "
            f"the run; optional, {PROTOCOL} by default)",
            lambda v: not isinstance(v, bool) and v in PROTOCOLS,
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
    # The protocol the config states (``protocol``, `PROTOCOL` when it states none): whose
    # verdict rules judge the run when it follows the standard suite (`protocol`).
    stated_protocol: int = PROTOCOL

    def __post_init__(self) -> None:
        validate(self, "", TOP_STYLE)

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
        """The suite protocol the run's verdicts follow: the one its config states (`PROTOCOL`
        by default; a record of protocol 1 keeps protocol 1's rules), or 0 for a run of listed
        attacks only (its verdicts other than a leak are ``untested``)."""
        return self.stated_protocol if self.standard else 0

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


def top_level_kinds() -> list[tuple[str, Kind]]:
    """The top-level keys that hold values (not tables), in the order `build_run` checks them,
    each with its kind; a message names the key alone (`TOP_STYLE`)."""
    return [(name, kind) for name, _, kind, _ in _VALUES]


# The protocol of a recorded config that states none: it was written before protocols were
# recorded, and judged by protocol 1's rules.
RECORD_PROTOCOL = 1


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
    return build_run(read_document(path, settings, plugins), stacklevel=2)


def load_record(path: str | Path, settings: Sequence[str] = ()) -> RunSpec:
    """Reads the resolved config a run recorded (a run directory's ``config.toml``, written by
    `RunSpec.to_toml`) as it is written, loading the plugins it names: a relative path in it is
    the working directory's (`resolve_paths`), not its folder's, so its keys are those of its
    trials. A record that states no ``protocol`` is of protocol 1 (`RECORD_PROTOCOL`). Use
    `load_config` for a config a user wrote. ``settings`` as there.

    Raises:
        ConfigError: One line naming the first key refused.
    """
    source, text = read_config(Path(path))
    document = toml_document(text, source)
    if "protocol" not in document:
        # Every record since protocols existed states its own; one without predates them and
        # was judged by protocol 1's rules, as it still is.
        document = {**document, "protocol": RECORD_PROTOCOL}
    return build_run(with_settings(document, settings), stacklevel=2)


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
    return build_run(toml_document(text, source), stacklevel=stacklevel + 1)


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
    check_depth(doc, "config")
    doc = _plain(doc)
    for key in doc:
        if key not in _TOP_KEYS:
            raise ConfigError(f"unknown key {key!r}; allowed: {', '.join(sorted(_TOP_KEYS))}")
    values = {}
    for name, default, kind, kept in _VALUES:
        value = check(doc.get(name, default), kind, "", name, TOP_STYLE)
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
        stated_protocol=check(
            doc.get("protocol", PROTOCOL), _HEADER["protocol"][2], "", "protocol", TOP_STYLE
        ),  # fmt: skip
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
        check_fair_budget(spec.training, spec.defense_grid(), spec.stated_protocol)
        check_epsilon_audit(spec.epsilon_audit, spec.local)
        warn_coupled_pretraining(spec.threat_model, spec.training, stacklevel + 1)
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
        name: check(values[name], kind, "", name, TOP_STYLE)
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
    "top_level_kinds",
    "without_adaptive",
]
