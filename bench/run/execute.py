"""Execution: the units of work of a run, and the backends that run them.

A run has two kinds of unit, both pure functions of the config and their identity: a utility
training (`train_one`) and an attack group (`attack_group`, a group cut by
`leakbench.run.plan.attack_groups`). A backend runs the units still to do and hands each result to
the run directory's store as it arrives. Every backend implements the small `Backend` protocol
and is chosen by name (`leakbench.run.backends`); the runner knows nothing else of it:

* ``local`` (`leakbench.run.local.LocalBackend`): this process, one unit after the other, or
  local worker processes (`leakbench.run.workers`, ``--workers``);
* ``ray`` (`leakbench.integrations.ray_backend.RayCluster`, the ``ray`` extra): Ray actors,
  locally or on a cluster, running the very same units.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np
import tensorflow as tf

from leakbench.attacks import Attack, AttackTarget, Reconstruction, Simulator
from leakbench.attacks.engine import resume
from leakbench.client.recipes import TrainingConfig
from leakbench.client.selection import Trainers, select
from leakbench.client.training import evaluate, train_steps
from leakbench.client.update import batch_statistics, observer
from leakbench.client.weights import weights_observer
from leakbench.components.bottleneck import with_architecture
from leakbench.components.dsnr import detect, standing
from leakbench.components.metrics import score_batch
from leakbench.components.models import build_model
from leakbench.core.canonical import canonical_json
from leakbench.core.federated import LocalTraining
from leakbench.core.seeds import (
    attack_seed,
    client_draw,
    observed_draw,
    simulation_seed,
    training_seed,
)
from leakbench.core.versions import ENGINE_VERSION
from leakbench.datasets import Dataset
from leakbench.outputs.arrays import encode_trial
from leakbench.run.config import RunSpec
from leakbench.run.judge import NO_ESCALATION, PROTOCOL_1, UNJUDGED, Evidence, leaked, settle
from leakbench.run.pipeline import GroupResult, Work
from leakbench.run.plan import Training, Trial, private_split, public_split
from leakbench.run.sections import ThreatModel
from leakbench.run.store import Store


class Backend(Protocol):
    """Where a run's units execute. A backend is a context manager: entering it may connect to
    a cluster (so that a refusal comes before anything is written), leaving it releases what
    it holds."""

    def __enter__(self) -> Backend: ...

    def __exit__(self, *exc_info: object) -> None: ...

    def run(self, work: Work, store: Store, progress: bool) -> None:
        """Runs ``work``, handing each result to ``store`` as it arrives."""


# This process's trainer, kept from one training to the next of the same defense.
_TRAINERS = Trainers()


def train_one(model_name: str, dataset: Dataset, job: Training) -> list[dict[str, Any]]:
    """The utility row (a one-row list, as stored) of one planned training of the model
    ``model_name`` (the run's ``model``): the learning-rate
    search on the validation split (`leakbench.client.selection.select`, which is given the training
    split only), then the test accuracy of the chosen model, the first read of the test split.
    The trainer of the previous training is restarted when it trained the same model under the
    same defense and recipe (`leakbench.client.selection.Trainers`).
    """
    config = job.config
    seed = training_seed(job.seed, job.replicate)
    shape, classes = dataset.input_shape, dataset.num_classes

    def fresh_model() -> Any:
        # Replicate 0: the same initial weights the attacks see under this seed (extended as
        # the defense says, for PRECODE).
        model = build_model(model_name, shape, classes, seed)
        if job.defense.architecture is not None:
            model = with_architecture(model, job.defense.architecture, seed)
        return model

    chosen = select(
        fresh_model,
        job.defense,
        config,
        (dataset.train.x, dataset.train.y),
        num_classes=classes,
        seed=seed,
        reuse=(_TRAINERS, _trainer_key(model_name, dataset, job)),
    )
    recipe = chosen.recipe
    return [
        {
            **job.columns(),
            "recipe": recipe.name,
            "epochs": recipe.epochs,
            "batch_size": recipe.batch_size,
            "optimizer": recipe.optimizer,
            "learning_rates": canonical_json(list(recipe.learning_rates)),
            "learning_rate": chosen.learning_rate,
            "validation_examples": config.held_out(len(dataset.train)),
            # JSON has no NaN: a rate without a validation split is null.
            "validation_accuracies": canonical_json(
                [None if np.isnan(a) else a for a in chosen.validation_accuracies]
            ),
            "validation_accuracy": chosen.validation_accuracy,
            "test_accuracy": evaluate(chosen.model, dataset.test.x, dataset.test.y),
            **dataclasses.asdict(chosen.report),
            "epsilon_search": chosen.epsilon_search,
            "rates_tried": canonical_json(list(chosen.rates)),
            "rate_at_edge": chosen.at_edge,
        }
    ]


def _trainer_key(model_name: str, dataset: Dataset, job: Training) -> str:
    """What a reused trainer must share with this training: the model, its input, the defense
    (with its parameters) and the recipe; the seed and replicate only change the weights."""
    columns = {k: v for k, v in job.columns().items() if k not in ("seed", "replicate")}
    recipe = job.config.recipe(job.defense)
    return canonical_json([columns, model_name, list(dataset.input_shape),
                           dataset.num_classes, repr(recipe)])  # fmt: skip


# The folder of a run directory that keeps the learned attack's inverters.
INVERTERS = "inverters"


@dataclasses.dataclass
class GroupCache:
    """What one process keeps between calls of `attack_group`, so that consecutive groups load
    nothing twice: the attacked model of the latest seed, its observed-gradient functions (one
    per defense configuration) and the observed gradients of the latest group's cells.

    Only values that do not depend on the order of calls are kept (every entry is a pure
    function of the seed, the cell and the config), so a process that attacks any subset of the
    groups, in any order, computes the numbers a local run computes.
    """

    seed: int | None = None
    model: Any = None
    # The seed's model as defenses that change the architecture extend it (PRECODE).
    variants: dict[Any, Any] = dataclasses.field(default_factory=dict)
    observers: dict[tuple[str, str], Any] = dataclasses.field(default_factory=dict)
    observed: dict[tuple[int, int, str, str], tuple[tf.Tensor, ...]] = dataclasses.field(
        default_factory=dict
    )
    # The clients' D-SNR check of a batch on a model variant: it reads the undefended update,
    # so every defense and attack configuration of that batch and model shares it.
    detections: dict[tuple[int, str], dict[str, Any]] = dataclasses.field(default_factory=dict)
    # What a learning attack computes of public examples, per (defense, model variant) of the
    # seed (`simulator`), with what it trained from them.
    simulators: dict[tuple[str, str], Simulator] = dataclasses.field(default_factory=dict)
    # Where the simulators keep what is trained (the run directory's ``inverters/``), or None.
    folder: Path | None = None
    progress: bool = False

    def model_for(
        self,
        model_name: str,
        threat: ThreatModel,
        training: TrainingConfig | None,
        dataset: Dataset,
        seed: int,
        architecture: Any = None,
        attack: Any = None,
    ) -> Any:
        """The attacked model of ``seed`` (`attacked_model` of the run's ``model_name``,
        ``threat`` model and ``training``), extended as ``architecture`` says (a defense's
        `Defense.architecture`, None for the model itself) and, for a malicious ``attack``, as
        the server ships it (`leakbench.attacks.Attack.malicious_model`, from the public split);
        a new seed drops everything kept for the last one (the local order runs groups seed by
        seed, so one model is enough)."""
        if seed != self.seed:
            self.seed, self.model = None, None
            self.variants.clear()
            self.observers.clear()
            self.simulators.clear()
            self.observed.clear()
            self.detections.clear()
            self.model = attacked_model(model_name, dataset, seed, threat=threat, training=training)
            self.seed = seed
        key = model_variant(architecture, attack)
        if key is None:
            return self.model
        if key not in self.variants:
            model = self.model
            if architecture is not None:
                model = with_architecture(model, architecture, seed)
            if key[1] is not None:
                model = attack.malicious_model(model, public_split(threat, dataset).x, seed)
            self.variants[key] = model
        return self.variants[key]


def model_variant(architecture: Any, attack: Any) -> tuple[Any, str | None] | None:
    """What sets a trial's model apart from the seed's: the defense's architecture change and a
    malicious attack's own model (its name and parameters), or None for the seed's model."""
    shipped = None
    if attack is not None and attack.server == "malicious":
        shipped = canonical_json([attack.name, attack.params()])
    if architecture is None and shipped is None:
        return None
    return architecture, shipped


def attack_group(
    spec: RunSpec,
    dataset: Dataset,
    group: list[Trial],
    cache: GroupCache,
    *,
    skip: Collection[str] = frozenset(),
    checkpoint: resume.Saver | None = None,
) -> GroupResult:
    """Attacks one group of `leakbench.run.plan.attack_groups` (one seed, one attack
    configuration) together.

    Every backend calls this: the local one in its own process, the Ray actors in theirs. The
    whole group is always attacked (batched arithmetic depends on the group's composition);
    the trials whose keys are in ``skip`` (already stored) are left out of the result. With a
    ``checkpoint`` (`leakbench.run.partial.GroupCheckpoint`) the attack's loops save their state
    to it and resume from what it holds (`leakbench.attacks.engine.resume`).

    Returns:
        The ``(key, rows)`` of each trial to store, in the group's order, and the arrays blob
        of each (`leakbench.outputs.arrays.encode_trial`), for one `Store.add_many` call.
    """
    seed = group[0].seed
    classes = dataset.num_classes
    threat = spec.threat_model
    split = private_split(threat, dataset)
    # Groups never mix architectures or attacks (`leakbench.run.plan.attack_groups`).
    architecture, attack = group[0].defense.architecture, group[0].attack
    model = cache.model_for(spec.model, threat, spec.training, dataset, seed, architecture, attack)
    variant = repr(model_variant(architecture, attack))
    cells = [(seed, t.batch_index, _defense_text(t), variant) for t in group]
    for cell in [c for c in cache.observed if c not in cells]:
        del cache.observed[cell]  # consecutive groups share cells; keep only this group's
    private = [(split.x[list(t.indices)], split.y[list(t.indices)]) for t in group]
    view = Observation(threat, spec.local, spec.batch_size, spec.observed_batch,
                       spec.simulated_local)  # fmt: skip
    targets = [
        _target(view, dataset, trial, cache, model, cell, x, y)
        for trial, cell, (x, y) in zip(group, cells, private, strict=True)
    ]
    seeds = [attack_seed(t.seed, t.batch_index) for t in group]
    with resume.saving(checkpoint):
        recs = group[0].attack.attack_many(targets, seeds, width=spec.parallel_trials)
    items, arrays = [], {}
    for trial, target, rec, (x, y) in zip(group, targets, recs, private, strict=True):
        if trial.key in skip:
            continue
        with resume.saving(checkpoint):  # the judge's reruns resume too
            rec, evidence = judged(
                trial, target, (x, y), rec, success_mse=spec.success_mse, lpips=spec.lpips
            )
        rows, matched = trial_rows(trial, y, x, rec, evidence, lpips=spec.lpips)
        if threat.detects:
            checked = (trial.batch_index, variant)
            if checked not in cache.detections:
                cache.detections[checked] = client_detection(
                    threat, spec.batch_size, model, x, tf.one_hot(y, classes)
                )
            rows = [{**row, **cache.detections[checked]} for row in rows]
        items.append((trial.key, rows))
        arrays[trial.key] = encode_trial(x, matched, rec.loss_history)
    return items, arrays


@dataclasses.dataclass(frozen=True)
class Observation:
    """What of a run sets what the server observes of a client: the threat model, the client's
    local training, its batch size, the batch behind one observed update (times the clients of
    secure aggregation) and the local training an attack simulates."""

    threat: ThreatModel
    local: LocalTraining
    batch_size: int
    observed_batch: int
    simulated_local: LocalTraining | None


def _target(
    view: Observation,
    dataset: Dataset,
    trial: Trial,
    cache: GroupCache,
    model: Any,
    cell: tuple[Any, ...],
    x: np.ndarray,
    y: np.ndarray,
) -> AttackTarget:
    """What the server observes of ``trial``'s private batch ``(x, y)`` on ``model``: the
    client's update of its ``cell`` (computed once per cell and kept in ``cache``), with what
    the threat model grants."""
    threat, classes = view.threat, dataset.num_classes
    if cell not in cache.observed:
        if cell[2:] not in cache.observers:
            cache.observers[cell[2:]] = client_observer(threat, view.local, trial.defense, model)
        cache.observed[cell] = observed_update(
            threat.clients, view.batch_size, cache.observers[cell[2:]], x,
            tf.one_hot(y, classes), trial.seed, trial.batch_index,
        )  # fmt: skip
    learns = trial.attack.uses_simulator()
    return AttackTarget(
        model=model,
        gradients=cache.observed[cell],
        input_shape=dataset.input_shape,
        batch_size=view.observed_batch,
        num_classes=classes,
        labels=y if threat.labels_known else None,
        local=view.simulated_local,
        clients=threat.clients,
        statistics=batch_statistics(model, x) if threat.bn_statistics_known else None,
        simulator=simulator(view, dataset, trial, cache, cell) if learns else None,
    )


def simulator(
    view: Observation, dataset: Dataset, trial: Trial, cache: GroupCache, cell: tuple[Any, ...]
) -> Simulator:
    """The `leakbench.attacks.Simulator` of a trial's (seed, defense, model variant) ``cell``:
    the public split (never the private one), and its examples' updates through the very
    observer the client's update was made with (`client_observer`, `observed_update`: the
    same defense, local training and clients) under defense draws of the attacker's own
    stream (`leakbench.core.seeds.simulation_seed`)."""
    if cell[2:] not in cache.simulators:
        observe = cache.observers[cell[2:]]
        threat, classes = view.threat, dataset.num_classes
        public = public_split(threat, dataset)
        seed = simulation_seed(trial.seed)

        def share(x: np.ndarray, y: np.ndarray, draw: int) -> tuple[tf.Tensor, ...]:
            return observed_update(threat.clients, view.batch_size, observe, x,
                                   tf.one_hot(y, classes), seed, draw)  # fmt: skip

        setting = dataclasses.replace(trial.setting, run="")
        key = canonical_json([repr(setting), trial.seed, *cell[2:], view.observed_batch,
                              repr(view.local), ENGINE_VERSION])  # fmt: skip
        folder = cache.folder / INVERTERS if cache.folder is not None else None
        cache.simulators[cell[2:]] = Simulator(
            np.asarray(public.x), np.asarray(public.y), share, key, folder, cache.progress
        )
    return cache.simulators[cell[2:]]


def client_observer(threat: ThreatModel, local: LocalTraining, defense: Any, model: Any) -> Any:
    """``observe(images, targets, seed)``: a client's update as the server sees it after the
    ``local`` training of the ``threat`` model (`RunSpec.local`), the defended update it shares
    (`leakbench.client.update.observer`) or, under ``shares = "weights"``, its weights'
    difference from the server's (`leakbench.client.weights.weights_observer`)."""
    if threat.shares == "weights":
        return weights_observer(defense, model, local)
    return observer(defense, model, local)


def observed_update(
    clients: int,
    size: int,
    observe: Any,
    x: np.ndarray,
    targets: tf.Tensor,
    seed: int,
    batch: int,
) -> tuple[tf.Tensor, ...]:
    """What the server sees of a trial's examples: the defended gradient of one client, or
    under secure aggregation (``threat_model.clients`` K = ``clients`` > 1) the mean of K
    clients' defended gradients, client k holding the k-th ``size`` examples (the run's
    ``batch_size``) and drawing its own noise."""
    if clients == 1:
        return tuple(observe(tf.constant(x), targets, observed_draw(seed, batch)))
    updates = [
        observe(tf.constant(x[k * size : (k + 1) * size]), targets[k * size : (k + 1) * size],
                client_draw(seed, batch, k))
        for k in range(clients)
    ]  # fmt: skip
    return tuple(tf.add_n(list(parts)) / clients for parts in zip(*updates, strict=True))


def client_detection(
    threat: ThreatModel, size: int, model: Any, x: np.ndarray, targets: tf.Tensor
) -> dict[str, Any]:
    """The detection columns of a trial: each of the ``threat`` model's clients checks the
    D-SNR of its own undefended update (``size`` examples, the run's ``batch_size``) on the
    ``model`` it received (`leakbench.components.dsnr.detect`: every layer against the
    threshold of its kind, read from the model's structure); the trial reports the client whose
    layer stands out most, that layer and its threshold, whether any client flags the model,
    and ``missed``: a malicious server's model that no client flags (clients of one example,
    who have nothing to check, included)."""
    checks = [
        detect(model, tf.constant(x[k * size : (k + 1) * size]), targets[k * size : (k + 1) * size])
        for k in range(threat.clients)
    ]
    worst = max(checks, key=lambda check: standing(check.dsnr, check.threshold))
    flagged = any(c.flagged for c in checks)
    return {
        "dsnr": worst.dsnr,
        "dsnr_layer": worst.layer,
        "dsnr_threshold": worst.threshold,
        "flagged": flagged,
        "missed": threat.server == "malicious" and not flagged,
    }


def attacked_model(
    model_name: str,
    dataset: Dataset,
    seed: int,
    *,
    threat: ThreatModel,
    training: TrainingConfig | None,
) -> Any:
    """The model the server holds when the attacked gradient is sent: the seeded
    initialisation of ``model_name``, trained for the ``threat`` model's ``train_steps``
    without a defense first, by the pre-attack recipe of the run's ``training`` (the default
    one without) at the threat model's ``train_lr``."""
    model = build_model(model_name, dataset.input_shape, dataset.num_classes, seed=seed)
    if threat.train_steps:
        train_steps(
            model,
            threat.train_steps,
            training or TrainingConfig(),
            (dataset.train.x, dataset.train.y),
            num_classes=dataset.num_classes,
            seed=seed,
            learning_rate=threat.train_lr,
        )
    return model


def _defense_text(trial: Trial) -> str:
    return canonical_json([trial.defense.name, trial.defense.params()])


def judged(
    trial: Trial,
    target: AttackTarget,
    private: tuple[np.ndarray, np.ndarray],
    rec: Reconstruction,
    *,
    success_mse: float,
    lpips: str,
) -> tuple[Reconstruction, Evidence]:
    """The trial's reconstruction and the judge's evidence (`leakbench.run.judge.settle`): a
    trial that neither converged nor leaked is attacked again, alone, with more budget and
    fresh starts, and keeps the reconstruction with the lowest loss the attacker sees (never
    against ``none``, the baseline, where no verdict needs it). A leak is judged by the run's
    ``success_mse`` and ``lpips`` network (`leakbench.run.judge.leaked`)."""
    x, y = private

    def check(candidate: Reconstruction) -> bool:
        return leaked(x, y, candidate, success_mse, lpips)

    # No holds rests on the baseline: against none the judge only records its evidence.
    protocol = NO_ESCALATION if trial.defense.name == "none" else PROTOCOL_1
    return settle(
        cast(Attack, trial.attack),  # an image run's trials hold image attacks
        target,
        private,
        rec,
        (trial.seed, trial.batch_index),
        check,
        protocol=protocol,
    )


def trial_rows(
    trial: Trial,
    y: np.ndarray,
    x: np.ndarray,
    rec: Reconstruction,
    evidence: Evidence = UNJUDGED,
    *,
    lpips: str,
) -> tuple[list[dict[str, Any]], np.ndarray]:
    """The trial's rows of ``trials.csv`` (one per image) and its reconstructions matched to
    ``x``'s order, with the judge's ``evidence`` (`leakbench.run.judge`; NaN where nothing
    judged the trial), LPIPS by the network ``lpips``; the Flower auditor
    (`leakbench.integrations.flower`) writes its rows through it too."""
    scores = score_batch(x, y, rec.images, rec.labels, lpips)
    predicted = rec.labels[scores.order]
    common = {
        **trial.columns(),
        "label_acc": scores.label_acc,
        "status": rec.status,
        "loss": rec.loss,
        "iterations": len(rec.loss_history),
        "evaluations": rec.evaluations,
        "attempts": rec.attempts,
        "seconds": rec.seconds,
        "iterations_used": rec.iterations_used,
        "stop_reason": rec.stop_reason,
        **evidence.columns(),
    }
    rows = [
        {
            **common,
            "position": pos,
            "image_index": trial.indices[pos],
            "label": int(y[pos]),
            "predicted_label": int(predicted[pos]),
            "mse": float(scores.mse[pos]),
            "psnr": float(scores.psnr[pos]),
            "ssim": float(scores.ssim[pos]),
            "lpips": float(scores.lpips[pos]),
        }
        for pos in range(len(trial.indices))
    ]
    return rows, np.asarray(rec.images)[scores.order]
