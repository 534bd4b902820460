"""The checks of a run description that join several of its fields: a threat model that does not
fit the client batches, attacks of the other server, settings the attacks cannot simulate yet,
and what a run of each modality cannot hold (`check_text_run`: a text run's model must be a text
model, its defenses able to act on a text model's dense gradient, its threat model an honest
server's FedSGD, FedAvg or secure aggregation; `check_other_run`: a plugin modality's). Each
takes the parts of the run it reads and refuses in one line naming the fields."""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

from leakbench.attacks import Attack
from leakbench.attacks.base import AttackContract, build_attack
from leakbench.client.recipes import TrainingConfig
from leakbench.components.models import MODELS
from leakbench.components.saved_models import is_saved_model
from leakbench.core.canonical import canonical_json
from leakbench.core.errors import ConfigError
from leakbench.core.federated import LocalTraining
from leakbench.defenses import Defense
from leakbench.modalities.text import check_text_defense
from leakbench.run.grid import expand
from leakbench.run.kinds import is_int
from leakbench.run.precheck import fair_budget
from leakbench.run.sections import EpsilonAuditSpec, ThreatModel


def check_threat_model(threat: ThreatModel, batch_size: int, images: int) -> None:
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
    check_local_training(threat, batch_size)
    if threat.checkpoints and threat.train_steps:
        raise ConfigError(
            "threat_model: give train_steps or checkpoints, not both (checkpoints attack the "
            "model at each point of its training)"
        )
    if threat.checkpoints and isinstance(threat.checkpoints[0], str):
        if threat.checkpoint_unit != "epoch":
            raise ConfigError("threat_model.checkpoint_unit counts numbers, not saved models")
    elif threat.checkpoint_unit == "step" and not all(is_int(v) for v in threat.checkpoints):
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


def warn_coupled_pretraining(
    threat: ThreatModel, training: TrainingConfig | None, stacklevel: int
) -> None:
    """Warns when the model is trained before the attack (``train_steps`` or numeric
    ``checkpoints``) at a rate the threat model does not name: it then takes the utility
    search's first rate, and a change to that grid would change the attacked model."""
    numeric = bool(threat.checkpoints) and not isinstance(threat.checkpoints[0], str)
    if threat.train_lr or not (threat.train_steps or numeric):
        return
    rate = (training or TrainingConfig()).pretraining()["learning_rate"]
    warnings.warn(
        f"threat_model.train_lr is not set: the pre-attack training takes the first of "
        f"training.learning_rates ({rate:g}), so a change to that grid changes the attacked "
        f"model; set threat_model.train_lr = {rate:g} to keep them apart",
        UserWarning,
        stacklevel=stacklevel + 1,
    )


def check_server(attack: Any, server: str) -> None:
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


def suits(attack: Attack, clients: int) -> bool:
    """Whether a suite attack can run under this many clients (`check_learned_client_values`)."""
    try:
        check_learned_client_values(attack, clients)
    except ConfigError:
        return False
    return True


def check_learned_client_values(attack: Any, clients: int) -> None:
    """Refuses an attack that learns one client's PRECODE noise or MixUp mixing under secure
    aggregation (the attacks learn them for one client only)."""
    for field in ("noise", "mixing"):
        if clients > 1 and getattr(attack, field, None) == "learn":
            raise ConfigError(
                f'attack {attack.name} {field} = "learn" needs threat_model.clients = 1, got '
                f"{clients} (a defense brings it as its adaptive attack: set adaptive = false to "
                "leave it out)"
            )


def check_local_training(threat: ThreatModel, batch_size: int) -> None:
    """Refuses local-training settings that would be ignored, or that the attacks cannot
    simulate yet (one line each)."""
    local = threat.local_training(batch_size)
    default = ThreatModel()
    if threat.shares == "weights":
        check_weights(threat)
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


def check_weights(threat: ThreatModel) -> None:
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


def check_statistics(threat: ThreatModel, attacks: list[Any]) -> None:
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


def check_unique(
    kind: str, grid: Sequence[AttackContract[Any, Any, Any]] | Sequence[Defense]
) -> None:
    """Refuses an attack or defense configuration listed twice (one line)."""
    # A repeated configuration would run every trial twice and count its images twice.
    seen: set[tuple[str, str]] = set()
    for item in grid:
        text = canonical_json(item.params())
        if (item.name, text) in seen:
            raise ConfigError(f"{kind} {item.name} {text} is listed twice; remove the repeat")
        seen.add((item.name, text))


def check_fedavg_defenses(defenses: list[Defense], local: LocalTraining) -> None:
    """Refuses a defense that acts per example under FedAvg (one line)."""
    if local.fedsgd:
        return
    for defense in defenses:
        if defense.level == "example":
            raise ConfigError(
                f"defense {defense.name} acts per example, which FedAvg "
                "(threat_model.local_steps or local_epochs > 1) does not support yet"
            )


def check_epsilon_audit(audit: EpsilonAuditSpec | None, local: LocalTraining) -> None:
    """The audit reads one client's FedSGD update: refused with local training (FedAvg)."""
    if audit is not None and not local.fedsgd:
        raise ConfigError(
            "epsilon_audit: audits a client's FedSGD update (its defended gradient); remove "
            "threat_model.local_steps / local_epochs, or the [epsilon_audit] table"
        )


def check_fair_budget(
    training: TrainingConfig | None, defenses: Sequence[Defense], protocol: int
) -> None:
    """Under protocol 2, refuses a DP recipe that trains its defenses longer or searches more
    rates than ``[training]`` does for every other defense: each defense gets the same epoch
    budget and the same grid size, so an accuracy cost compares like with like (issue 67,
    finding 6). ``training.dp.epochs = 0`` takes ``training.epochs``."""
    if training is None or not any(training.recipe(d).name == "dp" for d in defenses):
        return
    dp = training.dp
    fair_budget(
        protocol, training.epochs, len(training.learning_rates), dp.epochs, len(dp.learning_rates)
    )


def check_other_run(spec: Any, doc: Any, runnable: bool) -> None:
    """Refuses what a run of a plugin's modality (neither image nor text) cannot hold, in one
    line naming the key: the tables of the other modalities, the standard suite (its families
    attack images and text), a threat model other than one client's gradient; with
    ``runnable`` repeated attacks or defenses. Its pipeline checks the rest
    (`leakbench.run.pipeline.Pipeline.check`)."""
    modality = spec.modality
    for table in ("text", "training", "epsilon_audit"):
        if table in doc and doc[table] != {"enabled": False}:
            raise ConfigError(f"{table}: a run of {modality} data takes no [{table}] table")
    # A resolved config (`RunSpec.to_toml`, what workers, merge and rescore parse) writes the
    # default threat model out in full: only a departure from it is refused.
    changed = sorted(spec.threat_model.changes())
    if changed:
        raise ConfigError(
            f"threat_model.{changed[0]}: a run of {modality} data attacks one client's gradient "
            "under the default threat model; remove it"
        )
    if spec.suite == "standard":
        raise ConfigError(
            f"suite: the standard suite attacks image and text runs; a run of {modality} data "
            'runs the attacks it lists: set suite = "listed"'
        )
    if runnable:
        attacks = [build_attack(modality, c.name, p) for c in spec.attacks
                   for p in expand(c.params)]  # fmt: skip
        check_unique("attack", attacks)
        check_unique("defense", spec.defense_grid())


def _check_text_model(spec: Any) -> None:
    """Refuses an image model, and the [text] settings a saved model (``keras:PATH``, its own
    weights and head) cannot take; the file itself is checked when the run loads it."""
    if is_saved_model(spec.model):
        for name in ("tie_embeddings", "freeze_embeddings"):
            if getattr(spec.text, name):
                raise ConfigError(
                    f"text.{name}: model {spec.model} is a saved model whose layers are the "
                    "file's; build them so (a frozen layer: layer.trainable = False) before "
                    "saving, and leave this false"
                )
        return
    if MODELS.modality_of(spec.model) != "text":
        raise ConfigError(
            f"model {spec.model} is an image model; dataset {spec.dataset} is a text corpus: "
            f"choose a text model ({', '.join(MODELS.names('text'))}) or keras:PATH"
        )


def check_text_run(spec: Any, doc: Mapping[str, Any], runnable: bool) -> None:
    """Refuses what a text run (``spec``, a `leakbench.run.config.RunSpec` built from ``doc``)
    cannot hold, in one line naming the key; with ``runnable`` also its grids."""
    _check_text_model(spec)
    check_text_threat_model(spec.threat_model, spec.text.batch_sizes)
    if doc.get("training", {"enabled": False}) != {"enabled": False}:
        raise ConfigError(
            "training: a text run trains its utility models by [text] train_epochs, "
            "train_batch_size and learning_rate; leave [training] out"
        )
    if not runnable:
        return
    check_unique("attack", spec.text_attack_grid())
    defenses = spec.defense_grid()
    check_unique("defense", defenses)
    for defense in defenses:
        check_text_defense(defense)
    for size in spec.text.batch_sizes:
        check_fedavg_defenses(defenses, spec.threat_model.local_training(size))
    largest = max(spec.text.batch_sizes)
    clients = spec.threat_model.clients
    if spec.images < largest * clients:
        what = "" if clients == 1 else f" x threat_model.clients ({largest * clients})"
        raise ConfigError(
            f"images must be at least the largest text.batch_sizes ({largest}){what} so that "
            f"every batch size attacks a batch, got {spec.images}"
        )


# The [threat_model] keys a text run takes: FedAvg's and secure aggregation's.
TEXT_THREAT_KEYS = ("clients", "local_steps", "local_epochs", "local_batch_size", "local_lr")


def check_text_threat_model(threat: ThreatModel, batch_sizes: tuple[int, ...]) -> None:
    """Refuses a threat model a text run cannot take (one line): a key other than
    `TEXT_THREAT_KEYS`, and for each client batch size B what the image track refuses for its
    ``batch_size`` (`leakbench.run.checks.check_local_training`: settings FedSGD ignores, local
    steps that miss a mini-batch, FedAvg with clients above 1)."""
    other = sorted(set(threat.changes()) - set(TEXT_THREAT_KEYS))
    if other:
        raise ConfigError(
            f"threat_model.{other[0]}: a text run takes an honest server and only "
            f"{', '.join(TEXT_THREAT_KEYS)} in [threat_model]; leave {other[0]} out"
        )
    if threat.local_steps > 1 and threat.local_epochs > 1:
        raise ConfigError(
            "threat_model: give local_steps or local_epochs, not both (local_epochs = E is E "
            "passes over the client's batch)"
        )
    smallest = min(batch_sizes)
    if threat.local_batch_size > smallest:
        raise ConfigError(
            f"threat_model.local_batch_size must be at most the smallest text.batch_sizes "
            f"({smallest}), got {threat.local_batch_size}"
        )
    for size in batch_sizes:
        check_local_training(threat, size)
