"""Run configuration: TOML text validated into a frozen `RunSpec`, and its grid of components.

A list given for an attack or defense parameter sweeps it: each combination of the listed
values becomes its own attack or defense (a list of tables, such as the chain defense's ``steps``
or an attack's ``priors``, is not a sweep).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import tomli_w

from leakbench.attacks import ATTACKS, Attack, make_attack
from leakbench.attacks.suite import PROTOCOL, SUITES, suite_for
from leakbench.client.recipes import DPRecipe, TrainingConfig
from leakbench.components.lpips import DEFAULT_VARIANT
from leakbench.components.lpips_weights import VARIANTS
from leakbench.components.models import MODELS
from leakbench.components.saved_models import is_saved_model, saved_model_path
from leakbench.core.canonical import canonical_json
from leakbench.core.errors import ConfigError
from leakbench.core.federated import LocalTraining
from leakbench.core.params import (
    PLAIN,
    SECTION,
    Choice,
    Flag,
    Int,
    Kind,
    Number,
    Style,
    aliases_of,
    keyed_when_set,
    param,
    resolve_aliases,
    validate,
)
from leakbench.core.seeds import MAX_SEED
from leakbench.defenses import DEFENSES, Defense, make_defense
from leakbench.outputs.tables import DEFAULT_MAX_ACCURACY_DROP

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEFAULT_CONFIG = """\
# The built-in benchmark: the standard attack suite (protocol 1: iDLG, DLG and Inverting
# Gradients, with each defense's adaptive attacks) against every defense family on the
# embedded scikit-learn digits, with the DLG paper's LeNet at initialisation; the same model is
# also trained under each defense to measure what it costs in accuracy. 36 images: the fewest
# for which "nothing leaked" bounds the leaked share below 10% (95% Clopper-Pearson), which a
# holds needs.
name = "default"
dataset = "digits"
model = "lenet"
images = 36
batch_size = 1
seeds = [0]

# Each attack runs until its own convergence test (see `leakbench list`); its iterations
# parameter is only a cap, and a run warns when a defense's strongest attack reached it.
[[attack]]
name = "dlg"

[[attack]]
name = "idlg"

# No adaptive attack and no ig is listed: the suite adds them, whatever a config lists (pruning
# and top-k match only the kept coordinates, clipping and DP-SGD use a scale-blind cosine loss,
# Laplace noise an L1 loss; see `leakbench list`).

[[defense]]
name = "none"

[[defense]]
name = "gaussian"
sigma = [1e-3, 1e-2, 1e-1]

[[defense]]
name = "laplace"
b = [1e-3, 1e-2, 1e-1]

# Noise in units of the update's own 95th-percentile entry magnitude (federated deployments).
[[defense]]
name = "relative_noise"
sigma = [0.1, 1.0]

[[defense]]
name = "prune"
ratio = [0.2, 0.5, 0.9]

[[defense]]
name = "topk"
fraction = 0.1

[[defense]]
name = "clip"
norm = 0.1

[[defense]]
name = "fp16"

[[defense]]
name = "int8"

[[defense]]
name = "dpsgd"
norm = 1.0
noise_multiplier = [0.5, 1.0]

[[defense]]
name = "chain"
steps = [{ name = "clip", norm = 1.0 }, { name = "gaussian", sigma = 0.01 }]

# Each defense configuration is trained with 3 seeds; for each, one model per learning rate,
# and the rate with the best accuracy on a validation split (10% of the training split) is
# kept. Fewer epochs and rates than the defaults (30 epochs, 3 rates), to keep this run within
# a few minutes on 2 cores.
[training]
epochs = 5
batch_size = 32
optimizer = "adam"
learning_rates = [1e-2, 3e-2]
validation = 0.1
seeds = 3

# DP-SGD (and any example-level defense) trains as the DP literature does: plain SGD, larger
# batches, larger learning rates.
[training.dp]
epochs = 15
batch_size = 128
optimizer = "sgd"
learning_rates = [4.0, 8.0]
"""


# Measured by benchmarks/attack_speed.py: on a 2-core CPU the time per attack is flat from 1 to
# 8 problems per program and grows beyond (the per-problem history stops fitting in cache).
DEFAULT_PARALLEL_TRIALS = 8
# The keys of [threat_model] added after run directories were committed: a resolved config
# names them only when they differ from the default, so that those directories' config.toml
# stays the text a rerun of their config writes (and a rerun resumes them).
LATER_THREAT_KEYS = ("server", "detect", "checkpoints", "checkpoint_unit", "shares")
# The largest first_batch: with at most 100,000 images, every batch index stays below the
# attack seeds' stride (`leakbench.core.seeds.ATTACK_STRIDE`).
MAX_FIRST_BATCH = 900_000
# The most points of training one leakage-over-training run attacks the model at.
MAX_CHECKPOINTS = 16

# The config format this version reads. A config may state it (``schema_version = 1``); one
# written for another format is refused instead of being half understood.
SCHEMA_VERSION = 1


@dataclasses.dataclass(frozen=True)
class _Described(Kind):
    """A value of a top-level key, accepted when ``accepts`` says so and refused in the
    config's own words: ``{key} must be {words}, got {value!r}{hint}``.

    Attributes:
        words: What the key accepts, as it follows "must be" in the message.
        accepts: Whether a value is accepted.
        convert: The value to store for an accepted one.
        hint: Text the message ends with (advice after the value).
    """

    words: str
    accepts: Callable[[Any], bool]
    convert: Callable[[Any], Any] = lambda value: value
    hint: str = ""

    def describe(self, style: Style = PLAIN) -> str:
        return self.words

    def check(self, value: Any, label: str, style: Style = PLAIN) -> Any:
        if not self.accepts(value):
            raise ConfigError(f"{label} must be {self.words}, got {value!r}{self.hint}")
        return self.convert(value)


@dataclasses.dataclass(frozen=True)
class _Checkpoints(Kind):
    """Up to `MAX_CHECKPOINTS` increasing numbers >= 0 (training progress in
    ``checkpoint_unit``s), or saved models ``keras:PATH`` in training order; a tuple."""

    def describe(self, style: Style = PLAIN) -> str:
        return (
            f"a list of up to {MAX_CHECKPOINTS} increasing numbers >= 0 (epochs or steps), or "
            'of saved models "keras:PATH"'
        )

    def check(self, value: Any, label: str, style: Style = PLAIN) -> Any:
        if not isinstance(value, (list, tuple)) or len(value) > MAX_CHECKPOINTS:
            raise ConfigError(f"{label} must be {self.describe(style)}, got {value!r}")
        if all(isinstance(v, str) for v in value):
            for entry in value:
                if not is_saved_model(entry):
                    raise ConfigError(f"{label}: {entry!r} is not a saved model keras:PATH")
                saved_model_path(entry)  # a missing or wrong file is refused now
            return tuple(value)
        numbers = all(_is_number(v) and math.isfinite(v) and v >= 0 for v in value)
        if not numbers or any(b <= a for a, b in itertools.pairwise(value)):
            raise ConfigError(f"{label} must be {self.describe(style)}, got {value!r}")
        return tuple(value)


@dataclasses.dataclass(frozen=True)
class _Seeds(Kind):
    """One seed or a list of distinct seeds in [0, `MAX_SEED`], stored as a tuple."""

    def describe(self, style: Style = PLAIN) -> str:
        return (
            "a list of integers in [0, 2**31 - 1]; each seed draws the images, the weights and "
            "the noise"
        )

    def check(self, value: Any, label: str, style: Style = PLAIN) -> Any:
        seeds = [value] if _is_int(value) else value
        if (
            not isinstance(seeds, (list, tuple))
            or not seeds
            or not all(_is_int(s) and 0 <= s <= MAX_SEED for s in seeds)
            or len(set(seeds)) != len(seeds)
        ):
            raise ConfigError(
                f"{label} must be {self.describe(style)} without repeats, got {seeds!r}"
            )
        return tuple(seeds)


def _is_int(value: Any) -> bool:
    # bool is an int subclass, but true is not a number a user means to give.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _is_text(value: Any) -> bool:
    return isinstance(value, str)


def _is_run_name(value: Any) -> bool:
    return (
        isinstance(value, str) and bool(value) and all(ch.isalnum() or ch in "-_" for ch in value)
    )


def _is_image_size(value: Any) -> bool:
    return value is None or (
        isinstance(value, list) and len(value) == 2 and all(_is_int(v) and v >= 1 for v in value)
    )


def _model_name(value: str) -> str:
    if is_saved_model(value):
        saved_model_path(value)  # a missing or wrong file is refused now; loading checks the rest
        return value
    MODELS.get(value)  # an unknown name raises the registry's own error
    return value


# Top-level values are named alone in messages: "images must be an integer in [1, 100000]".
_TOP = Style(joiner="")


def _key(default: Any, kind: Kind, doc: str = "") -> Any:
    """A top-level key declared with `param`; its doc is what ``kind`` accepts unless given."""
    return param(default, kind, doc=doc or kind.describe(_TOP))


@dataclasses.dataclass(frozen=True)
class _TopLevel:
    """The top-level keys of a config that are values, not tables, checked in field order."""

    schema_version: int = _key(
        SCHEMA_VERSION,
        _Described(
            f"{SCHEMA_VERSION} (the config format this leakbench reads)",
            lambda v: not isinstance(v, bool) and v == SCHEMA_VERSION,
            hint="; write the config for this version or install the leakbench it was written for",
        ),
        doc=f"the config format, {SCHEMA_VERSION} (optional)",
    )
    name: str = _key(
        "run", _Described("a short name for the run (letters, digits, - and _)", _is_run_name)
    )
    dataset: str = _key(
        "digits", _Described("a dataset name or PREFIX:PATH (see `leakbench list`)", _is_text)
    )
    model: str = _key(
        "lenet",
        _Described(
            "a model name (see `leakbench list`) or keras:PATH (a saved .keras model)",
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
    seeds: tuple[int, ...] = _key((0,), _Seeds())
    first_batch: int = _key(
        0,
        Int(0, MAX_FIRST_BATCH),
        doc="the batch index of each seed's first batch, which keys its defense draw and "
        "attack start (default 0; a round r of a federated deployment is batch r), an integer "
        f"in [0, {MAX_FIRST_BATCH}]",
    )
    success_mse: float = _key(
        1e-3,
        _Described("a number > 0", lambda v: _is_number(v) and v > 0, float),
        doc="MSE at or below which a reconstruction counts as a success, > 0",
    )
    max_accuracy_drop: float = _key(
        DEFAULT_MAX_ACCURACY_DROP,
        _Described(
            "test accuracy a defense may cost and still be ranked on the leaderboard, a number "
            "in [0, 1] (default 0.05)",
            lambda v: _is_number(v) and 0 <= v <= 1,
            float,
        ),
    )
    lpips: str = _key(
        DEFAULT_VARIANT,
        _Described(
            'the LPIPS backbone scoring every reconstruction: "alex" (default), "vgg" or '
            '"none" (no LPIPS column)',
            lambda v: v in (*VARIANTS, "none"),
        ),
    )
    image_size: tuple[int, int] | None = _key(
        None,
        _Described(
            "[height, width] of integers >= 1",
            _is_image_size,
            lambda v: None if v is None else (v[0], v[1]),
        ),
        doc="[height, width] to resize images to (optional)",
    )
    suite: str = _key(
        "standard",
        _Described(
            f'"standard" (default: protocol {PROTOCOL}, every attack family and each '
            'defense\'s adaptive attacks, whatever the config lists) or "listed" (only the '
            "attacks listed and their adaptive variants; verdicts other than a leak are "
            "untested)",
            lambda v: v in SUITES,
        ),
    )
    protocol: int = _key(
        PROTOCOL,
        _Described(
            f"{PROTOCOL} (the attack-suite protocol this leakbench runs; optional)",
            lambda v: not isinstance(v, bool) and v == PROTOCOL,
            hint="; a config written for another protocol needs the leakbench of that protocol",
        ),
    )
    adaptive: bool = _key(
        True,
        _Described(
            "true (default) to run each defense's adaptive attacks too, false to run only the "
            "attacks listed",
            lambda v: isinstance(v, bool),
        ),
    )

    def __post_init__(self) -> None:
        validate(self, "", _TOP)


# The top-level keys that are tables, as their messages describe them.
_TABLES = {
    "attack": "an array of tables [[attack]] with a name and parameters",
    "defense": "an array of tables [[defense]] with a name and parameters",
    "training": "a table [training] with enabled, epochs, batch_size, optimizer, learning_rates, "
    "validation, seeds, delta and a table [training.dp]",
    "threat_model": "a table [threat_model] with labels_known, train_steps, private_split, "
    "clients, local_steps, local_epochs, local_batch_size, local_lr, shares, "
    "bn_statistics_known, server, detect, checkpoints, checkpoint_unit",
    "epsilon_audit": "a table [epsilon_audit] with rounds, confidence, delta, canary_norm",
}
_TOP_KEYS = [f.name for f in dataclasses.fields(_TopLevel)] + list(_TABLES)


@dataclasses.dataclass(frozen=True)
class ThreatModel:
    """What the attacker knows and which model state and examples it attacks.

    Attributes:
        labels_known: Whether the server knows the private labels (then attacks optimise the
            images only); by default it does not.
        train_steps: Training steps the model takes before the attacked round: 0 attacks the
            seeded initialisation; k > 0 first trains it for k steps without a defense on the
            training split, with the optimizer, batch size and first learning rate of
            ``[training]`` (its defaults when training is disabled).
        private_split: The split the private examples are drawn from, ``"test"`` (default; the
            examples the trained model never saw) or ``"train"``.
        local_steps, local_epochs, local_batch_size, local_lr: The client's local training
            before it shares its update (FedAvg, `leakbench.core.federated`): ``local_steps`` SGD
            steps at rate ``local_lr`` on mini-batches of ``local_batch_size`` examples taken
            in order (0: the whole batch), or ``local_epochs`` passes over the batch instead;
            the client then shares its defended weight change. The defaults are one step:
            FedSGD, the gradient itself. The server knows these settings and the order.
        shares: What the client sends. ``"update"`` (default): its defended update, the
            gradient under FedSGD and the weight change under FedAvg. ``"weights"``: its
            weights after local training, as a Flower client replies
            (`leakbench.integrations.flower`); the server's update is the weights it sent minus
            those, in float32, and the attack simulates the local steps even when there is
            one. The defense acts on the weight change, after one step too, unless it has to
            act inside the step (per example, or on the batch or the model: dpsgd, soteria,
            mixup), which under one step defends the gradient that the step then applies.
        clients: Clients whose defended updates the server sees only as their mean (secure
            aggregation): each has its own private batch of ``batch_size`` examples and its own
            defense draw, and the attack reconstructs all ``clients * batch_size`` examples from
            the mean. 1 (default): the server sees one client's update.
        bn_statistics_known: Whether the server knows the private batch's BatchNorm statistics
            (each BatchNorm layer's per-channel input mean and variance in the client's
            training-mode forward pass), which the ``bn_statistics`` prior uses. A FedAvg server
            that averages BatchNorm buffers receives each client's updated moving statistics,
            from which one step's batch statistics follow exactly. By default it does not.
        server: ``"honest"`` (default): the server attacks the model as trained (honest but
            curious). ``"malicious"``: the server ships a model of its own making, as the
            configured attacks declare (`leakbench.attacks.Attack.malicious_model`: an imprint
            block, trap weights), and the client trains and shares on it; only malicious attacks
            run under it, and only honest ones without it.
        detect: Whether each trial also reports what a careful client could see of the model
            it received: the D-SNR of its update (`leakbench.components.dsnr`) and whether it
            exceeds the threshold calibrated on honest models. Always on for a malicious server;
            on for an honest one when set (the false alarms of honest models).
        checkpoints: Leakage over training (`leakbench.run.checkpoints`): the same private
            examples are attacked at each point of the model's training, each a run of its own
            in ``OUT/checkpoints/``. Numbers are training progress in ``checkpoint_unit``s of
            the pre-attack training (``train_steps``' recipe: the optimizer, batch size and
            first learning rate of ``[training]``); strings are saved models ``keras:PATH``
            (e.g. a federated run's global model after each round), in training order. Empty
            (default): one run of the model as configured.
        checkpoint_unit: ``"epoch"`` (default: one pass over the training split) or
            ``"step"``; what numeric ``checkpoints`` count.
    """

    labels_known: bool = param(False, Flag(), doc="whether the server knows the labels")
    train_steps: int = param(0, Int(0, 1_000_000), doc="training steps before the attack")
    private_split: str = param("test", Choice("test", "train"), doc="split of the examples")
    clients: int = param(1, Int(1, 64), doc="clients averaged before the server sees the update")
    local_steps: int = param(1, Int(1, 1000), doc="local SGD steps of a client (1: FedSGD)")
    local_epochs: int = param(1, Int(1, 100), doc="local epochs (instead of local_steps)")
    local_batch_size: int = param(0, Int(0, 64), doc="local mini-batch (0: the whole batch)")
    local_lr: float = param(0.1, Number(0.0, 10.0, low_open=True), doc="local SGD rate")
    shares: str = param(
        "update", Choice("update", "weights"), doc="what the client sends (weights: as Flower)"
    )
    bn_statistics_known: bool = param(
        False, Flag(), doc="whether the server knows the batch's BatchNorm statistics"
    )
    server: str = param(
        "honest", Choice("honest", "malicious"), doc="whether the server ships its own model"
    )
    detect: bool = param(False, Flag(), doc="whether trials report the client's D-SNR check")
    checkpoints: tuple[Any, ...] = param(
        (), _Checkpoints(), doc="training progress (or saved models) to attack the model at"
    )
    checkpoint_unit: str = param(
        "epoch", Choice("epoch", "step"), doc="what the numbers of checkpoints count"
    )

    @property
    def detects(self) -> bool:
        """Whether trials carry the client's detection report (`detect`, or a malicious
        server)."""
        return self.detect or self.server == "malicious"

    def local_training(self, batch_size: int) -> LocalTraining:
        """The client's local training for a client batch of ``batch_size`` examples: one
        step (FedSGD) by default; ``local_epochs`` E > 1 means E passes over the batch in
        mini-batches of ``local_batch_size``."""
        local = LocalTraining(self.local_steps, self.local_lr, self.local_batch_size)
        if self.local_epochs > 1:
            steps = self.local_epochs * local.batches(batch_size)
            local = dataclasses.replace(local, steps=steps)
        return local

    def __post_init__(self) -> None:
        validate(self, "threat_model", SECTION)

    def changes(self) -> dict[str, object]:
        """The fields that differ from the default threat model (part of trial keys, so that
        runs of the default threat model keep their keys)."""
        default = ThreatModel()
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        }


@dataclasses.dataclass(frozen=True)
class EpsilonAuditSpec:
    """``[epsilon_audit]``: measured privacy beside promised privacy
    (`leakbench.run.epsilon_audit`).

    Each defense configuration's update is audited with gradient canaries on the first seed's
    first client batch: ``rounds`` rounds, a seeded half with a Dirac canary in the batch's extra
    slot (`leakbench.client.canaries`), and from the server's scores an epsilon lower bound
    (`leakbench.components.epsilon_bound`).

    Attributes:
        rounds: Audit rounds per defense configuration (the bound's ceiling grows with them:
            about 4.9 at 2,000 rounds, 7.2 at 20,000, at confidence 0.95).
        confidence: The probability with which each lower bound holds.
        delta: The ``delta`` the bound and the accountant's epsilon of one update are stated at.
        canary_norm: The canary's gradient norm; 0 (default): the largest per-example gradient
            norm of the audited batch.
    """

    rounds: int = param(2000, Int(20, 1_000_000), doc="audit rounds per defense configuration")
    confidence: float = param(
        0.95, Number(0.5, 1.0, high_open=True), doc="the probability the bound holds with"
    )
    delta: float = param(
        1e-5, Number(0.0, 1.0, low_open=True, high_open=True), doc="the delta of the bound"
    )
    canary_norm: float = param(
        0.0, Number(0.0), doc="the canary's gradient norm (0: the batch's largest example norm)"
    )

    def __post_init__(self) -> None:
        validate(self, "epsilon_audit", SECTION)


@dataclasses.dataclass(frozen=True)
class ComponentSpec:
    """An attack or defense as configured: a name and parameters (lists sweep)."""

    name: str
    params: dict[str, Any]


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """A validated run configuration."""

    name: str
    dataset: str
    model: str
    images: int
    batch_size: int
    seeds: tuple[int, ...]
    success_mse: float
    attacks: tuple[ComponentSpec, ...]
    defenses: tuple[ComponentSpec, ...]
    image_size: tuple[int, int] | None = None
    training: TrainingConfig | None = TrainingConfig()
    parallel_trials: int = DEFAULT_PARALLEL_TRIALS
    threat_model: ThreatModel = ThreatModel()
    max_accuracy_drop: float = DEFAULT_MAX_ACCURACY_DROP
    lpips: str = DEFAULT_VARIANT
    # Whether each defense's adaptive attacks (`leakbench.defenses.Defense.adaptive`) run too.
    adaptive: bool = True
    # "standard": the attack suite of protocol `PROTOCOL` (`leakbench.attacks.suite`) runs
    # whatever the config lists; "listed": only the listed attacks (and their adaptive variants).
    suite: str = "standard"
    # The batch index of each seed's first batch (`leakbench.run.plan.plan` numbers on from it).
    first_batch: int = 0
    # The epsilon audit of every defense configuration (``[epsilon_audit]``), None: no audit.
    epsilon_audit: EpsilonAuditSpec | None = None

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
    def observed_batch(self) -> int:
        """Examples behind the gradient the server observes: every client's batch."""
        return self.batch_size * self.threat_model.clients

    def attack_grid(self) -> list[Attack]:
        """Every attack configuration of the run, sweeps expanded."""
        return [make_attack(c.name, **p) for c in self.attacks for p in _expand(c.params)]

    def defense_grid(self) -> list[Defense]:
        """Every defense configuration of the run, sweeps expanded."""
        return [make_defense(c.name, **p) for c in self.defenses for p in _expand(c.params)]

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
        return [a for a in chosen if a in grid or _suits(a, self.threat_model.clients)]

    def all_attacks(self) -> list[Attack]:
        """Every attack configuration the run plans, adaptive variants included, once each."""
        seen: dict[str, Attack] = {}
        for defense in self.defense_grid():
            for attack in self.attacks_for(defense):
                seen.setdefault(canonical_json([attack.name, attack.params()]), attack)
        return list(seen.values())

    def to_toml(self) -> str:
        """The resolved config (defaults filled in), as TOML that loads back to this spec."""
        doc: dict[str, Any] = {
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
        doc["attack"] = [{"name": c.name, **c.params} for c in self.attacks]
        doc["defense"] = [{"name": c.name, **c.params} for c in self.defenses]
        if self.training is None:
            doc["training"] = {"enabled": False}
        else:
            doc["training"] = {"enabled": True, **dataclasses.asdict(self.training)}
        threat = dataclasses.asdict(self.threat_model)
        default = dataclasses.asdict(ThreatModel())
        for key in LATER_THREAT_KEYS:  # written only when set, as max_accuracy_drop above
            if threat[key] == default[key]:
                del threat[key]
        doc["threat_model"] = threat
        if self.epsilon_audit is not None:  # written only when set, as max_accuracy_drop above
            doc["epsilon_audit"] = dataclasses.asdict(self.epsilon_audit)
        return tomli_w.dumps(doc)


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


def _is_sweep(value: Any) -> bool:
    """A list sweeps its parameter, except a list of tables (a chain's ``steps``, an attack's
    ``priors``), which is one value."""
    return isinstance(value, list) and not (value and all(isinstance(v, dict) for v in value))


def _expand(params: dict[str, Any]) -> list[dict[str, Any]]:
    sweeps = {k: v for k, v in params.items() if _is_sweep(v) and k != "steps"}
    fixed = {k: v for k, v in params.items() if k not in sweeps}
    keys = sorted(sweeps)
    return [
        {**fixed, **dict(zip(keys, combo, strict=True))}
        for combo in itertools.product(*(sweeps[k] for k in keys))
    ]


def load_config(path: str | Path | None) -> RunSpec:
    """Reads and validates a TOML config file; ``None`` gives the built-in default benchmark."""
    if path is None:
        return parse_config(DEFAULT_CONFIG)
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"config file {p} cannot be read: {err}") from None
    return parse_config(text, source=str(p))


def parse_config(text: str, source: str = "config") -> RunSpec:
    """Validates TOML text into a `RunSpec`; every attack and defense is built once to check it."""
    doc = _read_toml(text, source)
    top = _TopLevel(**{k: v for k, v in doc.items() if k not in _TABLES})
    threat_model = _threat_model(doc.get("threat_model", {}))
    _check_threat_model(threat_model, top.batch_size, top.images)
    attacks = _components(doc, "attack", ATTACKS.names(), default=None)
    defenses = _components(doc, "defense", DEFENSES.names(), default=[{"name": "none"}])
    # Every top-level value but schema_version (only checked) is a RunSpec field of its name.
    values = {f.name: getattr(top, f.name) for f in dataclasses.fields(top)}
    del values["schema_version"]
    del values["protocol"]
    spec = RunSpec(
        **values,
        attacks=attacks,
        defenses=defenses,
        training=_training(doc.get("training", {})),
        threat_model=threat_model,
        epsilon_audit=_epsilon_audit(doc.get("epsilon_audit")),
    )
    _check_grids(spec)
    _check_epsilon_audit(spec)
    return spec


def _read_toml(text: str, source: str) -> dict[str, Any]:
    """The TOML document, refusing text that is not TOML and keys that no config has."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{source} is not valid TOML: {err}") from None
    for key in doc:
        if key not in _TOP_KEYS:
            raise ConfigError(f"unknown key {key!r}; allowed: {', '.join(sorted(_TOP_KEYS))}")
    return doc


def _check_threat_model(threat: ThreatModel, batch_size: int, images: int) -> None:
    """Refuses a threat model that does not fit the client batches or the images (one line
    each)."""
    if threat.local_steps > 1 and threat.local_epochs > 1:
        raise ConfigError(
            "threat_model: give local_steps or local_epochs, not both (local_epochs = E is E "
            "passes over the client's batch)"
        )
    if threat.local_batch_size > batch_size:
        raise ConfigError(
            f"threat_model.local_batch_size must be at most batch_size ({batch_size}), got "
            f"{threat.local_batch_size}"
        )
    _check_local_training(threat, batch_size)
    if threat.checkpoints and threat.train_steps:
        raise ConfigError(
            "threat_model: give train_steps or checkpoints, not both (checkpoints attack the "
            "model at each point of its training)"
        )
    if threat.checkpoints and isinstance(threat.checkpoints[0], str):
        if threat.checkpoint_unit != "epoch":
            raise ConfigError("threat_model.checkpoint_unit counts numbers, not saved models")
    elif threat.checkpoint_unit == "step" and not all(_is_int(v) for v in threat.checkpoints):
        raise ConfigError(
            f"threat_model.checkpoints must be whole steps, got {list(threat.checkpoints)}"
        )
    # One trial attacks the batches of all its clients at once.
    observed = batch_size * threat.clients
    if images % observed:
        what = (
            f"batch_size ({batch_size})"
            if threat.clients == 1
            else f"batch_size x threat_model.clients ({observed})"
        )
        raise ConfigError(f"images must be a multiple of {what}, got {images}")


def _check_grids(spec: RunSpec) -> None:
    """Refuses repeated attacks or defenses, and attacks or defenses that the run's batches
    and threat model do not allow (one line each)."""
    _check_unique("attack", spec.attack_grid())
    attack_grid = spec.all_attacks()
    for attack in attack_grid:
        _check_server(attack, spec.threat_model.server)
        attack.check_batch_size(spec.observed_batch)
        _check_learned_client_values(attack, spec.threat_model.clients)
    _check_unique("defense", spec.defense_grid())
    _check_statistics(spec.threat_model, attack_grid)
    if not spec.local.fedsgd:
        for defense in spec.defense_grid():
            if defense.level == "example":
                raise ConfigError(
                    f"defense {defense.name} acts per example, which FedAvg "
                    "(threat_model.local_steps or local_epochs > 1) does not support yet"
                )


def _check_server(attack: Any, server: str) -> None:
    """Refuses an attack of the other threat model: a malicious attack needs the server to
    ship its model, an honest one attacks the model as trained (one line each)."""
    if attack.server == server:
        return
    if attack.server == "malicious":
        raise ConfigError(
            f"attack {attack.name} is a malicious-server attack (it ships its own model): set "
            '[threat_model] server = "malicious"'
        )
    raise ConfigError(
        f'attack {attack.name} assumes an honest server; under threat_model.server = "malicious" '
        "only malicious-server attacks run (see `leakbench list`)"
    )


def _suits(attack: Attack, clients: int) -> bool:
    """Whether a suite attack can run under this many clients (`_check_learned_client_values`)."""
    try:
        _check_learned_client_values(attack, clients)
    except ConfigError:
        return False
    return True


def _check_learned_client_values(attack: Any, clients: int) -> None:
    """Refuses an attack that learns one client's PRECODE noise or MixUp mixing under secure
    aggregation (the attacks learn them for one client only)."""
    for field in ("noise", "mixing"):
        if clients > 1 and getattr(attack, field, None) == "learn":
            raise ConfigError(
                f'attack {attack.name} {field} = "learn" needs threat_model.clients = 1, got '
                f"{clients} (a defense brings it as its adaptive attack: set adaptive = false to "
                "leave it out)"
            )


def _check_local_training(threat: ThreatModel, batch_size: int) -> None:
    """Refuses local-training settings that would be ignored, or that the attacks cannot
    simulate yet (one line each)."""
    local = threat.local_training(batch_size)
    default = ThreatModel()
    if threat.shares == "weights":
        _check_weights(threat)
    elif local.fedsgd:
        for name in ("local_batch_size", "local_lr"):
            if getattr(threat, name) != getattr(default, name):
                raise ConfigError(
                    f"threat_model.{name} has no effect with one local step (FedSGD: the client "
                    "shares its gradient); set local_steps or local_epochs above 1, or remove it"
                )
        return
    batches = local.batches(batch_size)
    if local.steps < batches:
        raise ConfigError(
            f"threat_model.local_steps ({local.steps}) must cover the client's {batches} "
            "mini-batches at least once, or some private examples would never enter the update"
        )
    if local.fedsgd:
        return
    if threat.clients > 1:
        raise ConfigError(
            "threat_model: FedAvg (local_steps or local_epochs above 1) with clients above 1 is "
            "not supported yet (the attacks would have to simulate each client's local steps)"
        )


def _check_weights(threat: ThreatModel) -> None:
    """Refuses what a client that sends its weights cannot be combined with yet (one line)."""
    other = {
        "clients": threat.clients > 1,
        "bn_statistics_known": threat.bn_statistics_known,
        "server": threat.server != "honest",
    }
    for name, given in other.items():
        if given:
            raise ConfigError(
                f'threat_model: shares = "weights" with a non-default {name} is not supported '
                "yet (it models one honest server receiving one client's weights)"
            )


def _check_statistics(threat: ThreatModel, attacks: list[Any]) -> None:
    """Refuses a BatchNorm-statistics prior without the statistics, and statistics the
    threat model cannot define yet (one line each)."""
    for attack in attacks:
        needs = [p.name for p in attack.objective_priors() if p.needs_statistics]
        if needs and not threat.bn_statistics_known:
            raise ConfigError(
                f"attack {attack.name}: prior {needs[0]} needs the batch's BatchNorm statistics; "
                "set threat_model.bn_statistics_known = true"
            )
    if not threat.bn_statistics_known:
        return
    if threat.clients > 1:
        raise ConfigError(
            "threat_model.bn_statistics_known with clients above 1 is not supported yet (each "
            "client's statistics would have to be matched to its own share of the dummy batch)"
        )
    if threat.local_steps > 1 or threat.local_epochs > 1:
        raise ConfigError(
            "threat_model.bn_statistics_known with FedAvg (local_steps or local_epochs above 1) "
            "is not supported yet (each local step has statistics of its own)"
        )


def _training(table: Any) -> TrainingConfig | None:
    if not isinstance(table, dict):
        raise ConfigError(f"training must be {_TABLES['training']}")
    names = {f.name for f in dataclasses.fields(TrainingConfig)}
    fields = names | {"enabled"} | {a.old for a in aliases_of(TrainingConfig)}
    for key in table:
        if key not in fields:
            raise ConfigError(f"unknown key training.{key}; allowed: {', '.join(sorted(fields))}")
    enabled = table.get("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"training.enabled must be true or false, got {enabled!r}")
    if not enabled:
        return None
    given = {k: v for k, v in table.items() if k != "enabled"}
    # An old name becomes its new one here (one notice), pointing at parse_config's caller.
    given = resolve_aliases(given, aliases_of(TrainingConfig), "training", SECTION, stacklevel=3)
    if "dp" in given:
        given["dp"] = _dp_recipe(given["dp"])
    return TrainingConfig(**given)


def _dp_recipe(table: Any) -> DPRecipe:
    if not isinstance(table, dict):
        raise ConfigError(
            "training.dp must be a table [training.dp] with enabled, epochs, batch_size, "
            f"optimizer, learning_rates, got {table!r}"
        )
    fields = {f.name for f in dataclasses.fields(DPRecipe)}
    for key in table:
        if key not in fields:
            raise ConfigError(
                f"unknown key training.dp.{key}; allowed: {', '.join(sorted(fields))}"
            )
    return DPRecipe(**table)


# A config section's dataclass (`_section`).
_Section = TypeVar("_Section", ThreatModel, EpsilonAuditSpec)


def _epsilon_audit(table: Any) -> EpsilonAuditSpec | None:
    return None if table is None else _section(table, "epsilon_audit", EpsilonAuditSpec)


def _check_epsilon_audit(spec: RunSpec) -> None:
    """The audit reads one client's FedSGD update: refused with local training (FedAvg)."""
    if spec.epsilon_audit is not None and not spec.local.fedsgd:
        raise ConfigError(
            "epsilon_audit: audits a client's FedSGD update (its defended gradient); remove "
            "threat_model.local_steps / local_epochs, or the [epsilon_audit] table"
        )


def _threat_model(table: Any) -> ThreatModel:
    return _section(table, "threat_model", ThreatModel)


def _section(table: Any, name: str, cls: type[_Section]) -> _Section:
    """The table ``[name]`` as a ``cls``, refusing a non-table or an unknown key in one line
    naming the keys allowed (``cls`` checks the values)."""
    if not isinstance(table, dict):
        raise ConfigError(f"{name} must be {_TABLES[name]}")
    fields = [f.name for f in dataclasses.fields(cls)]
    for key in table:
        if key not in fields:
            raise ConfigError(f"unknown key {name}.{key}; allowed: {', '.join(sorted(fields))}")
    return cls(**table)


def _check_unique(kind: str, grid: list[Attack] | list[Defense]) -> None:
    # A repeated configuration would run every trial twice and count its images twice.
    seen: set[tuple[str, str]] = set()
    for item in grid:
        text = canonical_json(item.params())
        if (item.name, text) in seen:
            raise ConfigError(f"{kind} {item.name} {text} is listed twice; remove the repeat")
        seen.add((item.name, text))


def _components(
    doc: dict[str, Any], key: str, allowed: list[str], default: list[dict[str, Any]] | None
) -> tuple[ComponentSpec, ...]:
    tables = doc.get(key, default)
    if tables is None:
        raise ConfigError(f"at least one [[{key}]] table is required; names: {', '.join(allowed)}")
    if not isinstance(tables, list) or not tables or not all(isinstance(t, dict) for t in tables):
        raise ConfigError(f"{key} must be {_TABLES[key]}")
    specs = []
    registry = ATTACKS if key == "attack" else DEFENSES
    for i, table in enumerate(tables):
        name = table.get("name")
        if not isinstance(name, str):
            raise ConfigError(f"{key}[{i}].name must be a string; allowed: {', '.join(allowed)}")
        cls = registry.get(name)
        params = {k: v for k, v in table.items() if k != "name"}
        for given, value in params.items():
            if isinstance(value, list) and given != "steps" and not value:
                raise ConfigError(f"{key}[{i}] ({name}): {given} sweep list is empty")
        # Old parameter names become new ones here, with one notice per table, so that the
        # resolved config and the trial keys only ever hold the new names. The notice points
        # at the caller of parse_config (_components -> parse_config -> caller).
        aliases = aliases_of(cls)
        params = resolve_aliases(params, aliases, f"{key} {name}", sweeps=True, stacklevel=3)
        # Parameters that are part of keys only when set stay out of the resolved config too.
        optional = keyed_when_set(cls)
        defaults = {
            f.name: f.default
            for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING and f.name not in {*params, *optional}
        }
        # Sorted, so that configs that differ only in the order of keys resolve to one text.
        specs.append(ComponentSpec(name, dict(sorted({**defaults, **params}.items()))))
    return tuple(specs)
