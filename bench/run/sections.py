"""The tables of the run description: `ThreatModel` (``[threat_model]``), `EpsilonAuditSpec`
(``[epsilon_audit]``), `TextSettings` (``[text]``, a text run's corpus, model and utility
settings) and `ComponentSpec` (one ``[[attack]]`` or ``[[defense]]`` table)."""

from __future__ import annotations

import dataclasses
from typing import Any

from leakbench.core.federated import LocalTraining
from leakbench.core.params import SECTION, Choice, Flag, Int, Number, param, validate
from leakbench.run.kinds import Checkpoints, Integers

# The keys of [threat_model] added after run directories were committed: a resolved config
# names them only when they differ from the default, so that those directories' config.toml
# stays the text a rerun of their config writes (and a rerun resumes them).
LATER_THREAT_KEYS = ("server", "detect", "checkpoints", "checkpoint_unit", "shares", "train_lr")


@dataclasses.dataclass(frozen=True)
class ThreatModel:
    """What the attacker knows and which model state and examples it attacks.

    Attributes:
        labels_known: Whether the server knows the private labels (then attacks optimise the
            images only); by default it does not.
        train_steps: Training steps the model takes before the attacked round: 0 attacks the
            seeded initialisation; k > 0 first trains it for k steps without a defense on the
            training split, with the optimizer and batch size of ``[training]`` (its defaults
            when training is disabled) at ``train_lr``.
        train_lr: The learning rate of those steps. 0 (default) takes the first rate of
            ``training.learning_rates``, which ties the attacked model to the utility search's
            grid: a run that trains its model says the rate here (a warning says so otherwise).
            Not a key field of its own: the pre-attack recipe, rate included, is in every
            trial's key (`leakbench.run.plan.image_setting`).
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
            the pre-attack training (``train_steps``' recipe: the optimizer and batch size of
            ``[training]`` at ``train_lr``); strings are saved models ``keras:PATH``
            (e.g. a federated run's global model after each round), in training order. Empty
            (default): one run of the model as configured.
        checkpoint_unit: ``"epoch"`` (default: one pass over the training split) or
            ``"step"``; what numeric ``checkpoints`` count.
    """

    labels_known: bool = param(False, Flag(), doc="whether the server knows the labels")
    train_steps: int = param(0, Int(0, 1_000_000), doc="training steps before the attack")
    train_lr: float = param(
        0,
        Number(0.0, 10.0, high_open=True, as_float=False),
        doc="learning rate of the pre-attack training (0: training.learning_rates' first)",
    )
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
        (), Checkpoints(), doc="training progress (or saved models) to attack the model at"
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
        runs of the default threat model keep their keys). ``train_lr`` is left out: the key
        holds the rate it resolves to, in the pre-attack recipe, so a config that names the
        rate its grid gave keeps its keys."""
        default = ThreatModel()
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name != "train_lr" and getattr(self, f.name) != getattr(default, f.name)
        }


@dataclasses.dataclass(frozen=True)
class EpsilonAuditSpec:
    """``[epsilon_audit]``: measured privacy beside promised privacy
    (`leakbench.run.epsilon_audit`).

    Each defense configuration's update is audited with gradient canaries on the first seed's
    first client batch (its first ``batches`` ones where the defense depends on the batch):
    ``rounds`` rounds, a seeded half with a Dirac canary in the batch's extra slot
    (`leakbench.client.canaries`), and from the server's scores an epsilon lower bound
    (`leakbench.components.epsilon_bound`).

    Attributes:
        rounds: Audit rounds per defense configuration (the bound's ceiling grows with them:
            about 4.9 at 2,000 rounds, 7.2 at 20,000, at confidence 0.95).
        confidence: The probability with which each lower bound holds.
        delta: The ``delta`` the bound and the accountant's epsilon of one update are stated at.
        canary_norm: The canary's gradient norm; 0 (default): the largest per-example gradient
            norm of the audited batch.
        canaries: Dirac canaries per round, each in its own coordinate, for the defenses
            whose score is Gaussian and whose canaries are independent trials
            (`Defense.gaussian_score`, `Defense.independent_canaries`); the others are audited
            with one.
        batches: The client batches of the first seed (its first ones, the plan's order) over
            which the rounds of a defense whose output depends on the batch are spread (round
            ``r`` on batch ``r mod batches``; `Defense.data_independent`); no defense,
            additive noise and DP-SGD are audited on the first batch alone.
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
    canaries: int = param(
        1, Int(1, 4096), doc="Dirac canaries per round (defenses with a Gaussian score)"
    )
    batches: int = param(
        8, Int(1, 1000), doc="client batches a data-dependent defense's rounds are spread over"
    )

    def __post_init__(self) -> None:
        validate(self, "epsilon_audit", SECTION)


@dataclasses.dataclass(frozen=True)
class TextSettings:
    """``[text]``: what a text run (its dataset a text corpus, `leakbench.run.config`) sets
    beside the top-level keys. The top-level ``images`` counts the private sentences attacked
    per (defense, attack) cell and batch size; the corpus rules are those of
    `leakbench.datasets.text_base`.

    Attributes:
        sequence_length: L, the ids per sentence (``<bos>``, words, ``<eos>``, cut or padded).
        max_words: The vocabulary's words beside the four reserved ids (public pool only).
        public_share: The share of the corpus's examples in the public pool (the attacker's).
        batch_sizes: The batch sizes B attacked, each its own set of trials.
        tie_embeddings: Whether the model reads its logits from the input embedding.
        freeze_embeddings: Whether the input embedding is frozen (not trained, so no gradient
            of it is shared).
        test_sentences: The private pool's last sentences, held out to measure the utility
            (perplexity) and never attacked or trained on.
        train_epochs: Passes over the rest of the private pool that train each defense's utility
            model (0: no utility column).
        train_batch_size: Sentences per training step.
        learning_rate: The training's learning rate.
    """

    sequence_length: int = param(16, Int(2, 512), doc="ids per sentence (L)")
    max_words: int = param(2000, Int(1, 1_000_000), doc="words in the vocabulary (public pool)")
    public_share: float = param(
        0.5, Number(0.0, 1.0, low_open=True, high_open=True), doc="the public pool's share"
    )
    batch_sizes: tuple[int, ...] = param((1,), Integers(1, 256), doc="the batch sizes attacked")
    tie_embeddings: bool = param(False, Flag(), doc="read the logits from the input embedding")
    freeze_embeddings: bool = param(False, Flag(), doc="freeze the input embedding")
    test_sentences: int = param(
        200, Int(1, 100_000), doc="private sentences held out for the utility"
    )
    train_epochs: int = param(1, Int(0, 1000), doc="utility training epochs (0: none)")
    train_batch_size: int = param(16, Int(1, 4096), doc="sentences per training step")
    learning_rate: float = param(
        1e-3, Number(0.0, 10.0, low_open=True), doc="the utility training's learning rate"
    )

    def __post_init__(self) -> None:
        validate(self, "text", SECTION)


@dataclasses.dataclass(frozen=True)
class ComponentSpec:
    """An attack or defense as configured: a name and parameters (lists sweep)."""

    name: str
    params: dict[str, Any]
