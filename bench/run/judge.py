"""The judge: convergence evidence of a gradient-matching attack, computed with the truth.

An attack that failed to optimise must not count as a defense that worked. The attacker sees
only its own loss; the judge also holds the private batch, so it can say whether the attack
reached the bottom of its own objective. For a trial of a gradient-matching attack (`dlg`,
`idlg`, `ig`: `leakbench.attacks.matching.MatchingAttack`) it evaluates the attack's matching
loss, without priors, under the same observed update and the same comparison (``loss``,
``match``, the simulated local steps, the clients; `objective_values`) at

* the true images with their one-hot true labels: ``truth_loss`` (0 without a defense, and 0
  for an adaptive attack that undoes the defense, ``match = "kept"`` under pruning; above 0
  under noise, where a reconstruction may fit the noisy update better than the truth does);
* the reconstruction (the images the attack returned, clipped into [0, 1], with the one-hot of
  its returned labels): ``judged_loss``.

``converged`` is 1 when ``judged_loss <= truth_loss * (1 + RELATIVE_TOLERANCE) +
ABSOLUTE_TOLERANCE[loss] * reference``, else 0, where ``reference`` is the objective's own
scale: its loss for a null update (a zero dummy gradient against the observed one: the observed
update's squared norm for ``l2``, its L1 norm for ``l1``, one half for ``cosine``). The rule is
`converged`; `PROTOCOL_1` holds its constants, each measured (the comments above them).

A trial that did not converge and leaked nothing by the scores known when it is attacked (no
image with MSE at most ``success_mse``, PSNR at least
`leakbench.components.leakage.RECOGNISABLE_PSNR` or LPIPS at most ``RECOGNISABLE_LPIPS``) is
escalated (`settle`): round r reruns the attack with its ``iterations`` multiplied by
``budget_factor ** r`` (for `ig` a stretched schedule: its learning-rate decay follows the
iterations) from ``starts`` fresh starts, seeded from the trial and the round
(`escalation_seed`), and keeps, among the reconstructions so far, the one with the lowest loss
*the attacker sees* (`Reconstruction.loss`: never the judged loss, which needs the private
batch), until it converges, leaks, or ``rounds`` rounds have run. Each trial escalates alone,
so its numbers never depend on the other trials of its group. The trial's rows record the
evidence (`Evidence.columns`): a trial still at 0 after its escalations and with nothing
leaked is an inconclusive attack, never a defense that held.

Where the truth cannot be evaluated, every column is NaN (``escalations`` 0): an attack that
learns the client's MixUp mixing or its PRECODE noise draw (the truth holds a draw the judge
does not rebuild), a malicious server's or an analytic attack, and any attack that is not a
gradient-matching one the judge knows the loss of.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

from leakbench.attacks import AttackTarget, Reconstruction
from leakbench.attacks.base import Attack, observed_as, simulated
from leakbench.attacks.dlg import DLG
from leakbench.attacks.engine.losses import LOSSES
from leakbench.attacks.engine.matching import objective_values
from leakbench.attacks.ig import InvertingGradients
from leakbench.attacks.suite import PROTOCOL
from leakbench.components.bottleneck import noise_width
from leakbench.components.forward import head_start
from leakbench.components.leakage import RECOGNISABLE_LPIPS, RECOGNISABLE_PSNR
from leakbench.components.metrics import score_batch
from leakbench.core.params import METADATA_KEY
from leakbench.core.seeds import attack_seed

# Escalation seeds: ESCALATION_STREAM + attack_seed * ESCALATION_SLOTS + slot, where slot =
# (round - 1) * starts + start. The attack seeds stay below 2**51 (`leakbench.core.seeds`), so
# these lie in [2**58, 2**58 + 2**57): apart from every attack seed and from the first words of
# the training (2**56) and audit (2**57) streams.
ESCALATION_STREAM = 1 << 58
ESCALATION_SLOTS = 64


@dataclasses.dataclass(frozen=True)
class Protocol:
    """The judge's protocol: the convergence tolerance and the escalation's cap.

    Attributes:
        number: The protocol's number (what a report cites).
        relative: Share of the truth's loss a converged reconstruction may exceed it by.
        absolute: Per matching loss, the share of the objective's reference scale it may
            exceed it by besides; a loss not named here is not judged.
        rounds: Most escalation rounds of a trial.
        budget_factor: Round r multiplies the attack's iterations by this to the power r
            (capped at the largest value the parameter allows).
        starts: Fresh starts per round.
        schedule_starts: Fresh starts per round of an attack that ran a fixed schedule
            (``stop_reason = "schedule"``, `ig`): its check is the doubled schedule itself.
    """

    number: int
    relative: float
    absolute: tuple[tuple[str, float], ...]
    rounds: int
    budget_factor: int
    starts: int
    schedule_starts: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.schedule_starts <= self.starts:
            raise ValueError("schedule_starts must be in [1, starts]")
        if self.rounds * self.starts > ESCALATION_SLOTS:
            raise ValueError(f"rounds * starts must be at most {ESCALATION_SLOTS}")

    def tolerance(self, loss: str) -> float | None:
        """The absolute share for matching loss ``loss``, None when the protocol has none."""
        return dict(self.absolute).get(loss)


# Protocol 1. Every number is the judge's gap (judged_loss - truth_loss) / reference, measured
# with `objective_values` on the DLG LeNet at initialisation, batch 1 (2026-12): digits (16
# images per cell, seed 0; none, prune 0.5 and 0.9, topk 0.1, clip 0.1, gaussian 1e-2 and 1e-1;
# idlg match all and kept, dlg loss cosine and l1, ig) and CIFAR-10 (results/cifar10: its 8
# images, with the committed trials' losses). The l2 reference is 14..22 on digits and 0.004
# to 730 on CIFAR-10 (a confident model's gradient is small): only a share of it compares.
#
# RELATIVE_TOLERANCE 0.01: under noise the truth's loss is the noise's (Gaussian sigma 1e-2 on
#   digits: 0.07..0.84). Attacks that fit the noisy update ended below the truth or at most
#   0.07% above it (sigma 0.1: judged 80.07, truth 80.03); failures ended 2.3% (CIFAR-10
#   DP-SGD, 5.6 dB), 42% (ig, digits, Gaussian 1e-2, 8 dB) and 100% (CIFAR-10, Gaussian 0.1,
#   5.2 dB) above it.
RELATIVE_TOLERANCE = 0.01
# ABSOLUTE_TOLERANCE, per matching loss, lies between float32's floor and the failures:
# * l2 2e-9: the truth's loss is at most 2e-13 of the reference (float32 rounding); recovered
#   images ended at most 2.3e-10 (digits, 100 dB) and 1.3e-9 (CIFAR-10, 37-50 dB) above it.
#   The adaptive idlg match = "kept" stopped by its cap under prune 0.5, prune 0.9 and top-k
#   on CIFAR-10 (5.8-7.6 dB; the losses 2.5e-5..3.5e-4 among them) ended 1.3e-8 to
#   2.6e-6 above it, and an undefended dlg stuck at loss 1.60 (4.5 dB) is about 0.1 above it
#   on digits: every failure is called not converged.
# * cosine 1e-5: measured up to engine 7, when 1 - cos was computed as 1 - dot / norms, good
#   to about 1e-7 in float32 (the truth's values reached 4.2e-7; its reference was 1); dlg
#   loss = "cosine" that recovered digits (43 dB) ended at most 1.6e-6 above the truth,
#   failures at least 1.6e-3 (ig, 8 dB) and 7.8e-3 (dlg). Since engine 8 the distance keeps
#   its precision to about 1e-14 and its reference is 1/2: idlg's recovered digits (83-91 dB)
#   end 4e-11 to 1.5e-10 above the truth (about 1e-13), CIFAR-10 reconstructions at 30-43 dB
#   1e-9 to 1e-7 above it (counted converged), one stalled at 21 dB 2.4e-5 above it (not).
#   The constant is protocol 1's and stays; a tighter one is a new protocol.
# * l1 1e-3: a first-power distance (a relative gradient error e costs e, not e**2); dlg
#   loss = "l1" that recovered digits (100 dB) ended up to 4.5e-5 above the truth (it stalls
#   on the kink), failures at least 3.4e-2.
ABSOLUTE_TOLERANCE = (("l2", 2e-9), ("cosine", 1e-5), ("l1", 1e-3))
# The escalation's cap (one round, twice the budget, two fresh starts), chosen for its cost.
# Digits, 400 trials of 25 cells in one process: 237 s unescalated; 127 trials escalated (every
# ig trial, 45 dlg, 2 idlg) for 278 s more: 1.2 s per dlg trial (2 x 20,000 iterations at
# most), 7.8 s per idlg trial under prune 0.9, 2.6 s per ig trial with two starts (hence one,
# SCHEDULE_STARTS), against 0.15-0.7 s for a trial itself. It lowered the attacker's loss in 100
# of them, 11 converged and 5 leaked (dlg loss = "cosine": none, clip, prune 0.5).
ESCALATION_ROUNDS = 1
BUDGET_FACTOR = 2
STARTS = 2
# ig's check: its schedule doubled, from one fresh start (on digits it never recovers an image,
# 7-9 dB, and the doubled schedule changed none of 80 trials; a second start doubled the cost).
SCHEDULE_STARTS = 1
PROTOCOL_1 = Protocol(
    number=PROTOCOL,
    relative=RELATIVE_TOLERANCE,
    absolute=ABSOLUTE_TOLERANCE,
    rounds=ESCALATION_ROUNDS,
    budget_factor=BUDGET_FACTOR,
    starts=STARTS,
    schedule_starts=SCHEDULE_STARTS,
)
# The judge without its reruns: what a trial against ``none`` gets (no verdict rests on it).
NO_ESCALATION = dataclasses.replace(PROTOCOL_1, rounds=0)


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What the judge found of one trial: NaN losses and ``converged`` where the truth cannot
    be evaluated (``escalations`` 0: none ran), every field NaN where no judge saw the trial
    (`UNJUDGED`)."""

    truth_loss: float = math.nan
    judged_loss: float = math.nan
    converged: float = math.nan
    escalations: float = 0

    def columns(self) -> dict[str, Any]:
        """The trial columns of `leakbench.outputs.tables.TRIAL_COLUMNS` this fills."""
        return dataclasses.asdict(self)


# A trial that was never judged (rows written outside an attack unit: the Flower auditor).
UNJUDGED = Evidence(escalations=math.nan)


def matching_loss(attack: Attack) -> str | None:
    """The name of the matching loss ``attack`` minimises (`leakbench.attacks.engine.losses`),
    or None when the judge does not know it."""
    if isinstance(attack, (DLG, InvertingGradients)):
        return attack.loss
    return None


def judgeable(attack: Attack, target: AttackTarget, protocol: Protocol = PROTOCOL_1) -> bool:
    """Whether the truth's loss under ``attack``'s objective can be evaluated for ``target``
    and ``protocol`` has a tolerance for its matching loss."""
    loss = matching_loss(attack)
    if attack.server != "honest" or loss is None or protocol.tolerance(loss) is None:
        return False
    if isinstance(attack, DLG):
        if attack.mixing == "learn" and target.batch_size > 1:
            return False
        if attack.noise == "learn" and noise_width(target.model) > 0:
            return False
    return True


def reference_scale(attack: Any, target: AttackTarget) -> float:
    """The objective's loss for a null dummy update (all zeros) against the observed one, over
    the tensors it compares: the scale the judge's absolute tolerance is a share of."""
    observed = observed_as(target, attack.local_training)[: len(target.model.trainable_variables)]
    compared = head_start(target.model) if attack.match == "features" else len(observed)
    batched = [o[None] for o in observed[:compared]]
    distance = LOSSES.get(str(matching_loss(attack)))
    return float(distance([tf.zeros_like(o) for o in batched], batched).numpy()[0])


def losses_at(
    attack: Any, target: AttackTarget, points: list[tuple[np.ndarray, np.ndarray]]
) -> list[float]:
    """``attack``'s matching loss, without priors, at each (images [batch, H, W, C], labels
    [batch]) of ``points``, one problem per call (so a value depends on nothing else)."""
    local = simulated(target, attack.local_training)
    values = objective_values(
        target.model,
        input_shape=target.input_shape,
        batch_size=target.batch_size,
        num_classes=target.num_classes,
        loss=str(matching_loss(attack)),
        match=attack.match,
        local=local,
        clients=target.clients,
    )
    weights = tuple(v.value[None] for v in target.model.trainable_variables)
    observed = tuple(o[None] for o in observed_as(target, attack.local_training))
    out = []
    for images, labels in points:
        z = tf.reshape(tf.constant(np.asarray(images, np.float32)), (1, -1))
        onehot = tf.one_hot(np.asarray(labels, np.int64)[None], target.num_classes)
        out.append(float(values(z, weights, observed, onehot).numpy()[0]))
    return out


def converged(
    judged: float, truth: float, reference: float, loss: str, protocol: Protocol = PROTOCOL_1
) -> bool:
    """The protocol's rule: the reconstruction's judged loss is at most the truth's plus the
    tolerance (``relative`` of the truth's loss and the ``absolute`` share of matching loss
    ``loss`` of the reference scale). A non-finite judged loss has not converged."""
    share = protocol.tolerance(loss)
    if share is None:
        raise ValueError(f"protocol {protocol.number} has no tolerance for loss {loss!r}")
    if not np.isfinite(judged):
        return False
    return judged <= truth * (1.0 + protocol.relative) + share * reference


def leaked(
    x: np.ndarray, y: np.ndarray, rec: Reconstruction, success_mse: float, lpips: str
) -> bool:
    """Whether any reconstructed image leaked by the scores an attack unit has: MSE at most
    ``success_mse``, PSNR at least `RECOGNISABLE_PSNR` or LPIPS at most `RECOGNISABLE_LPIPS`
    (the identification test needs the distractor pool, at export)."""
    scores = score_batch(x, y, rec.images, rec.labels, lpips)
    return bool(
        np.any(scores.mse <= success_mse)
        or np.any(scores.psnr >= RECOGNISABLE_PSNR)
        or np.any(scores.lpips <= RECOGNISABLE_LPIPS)
    )


def escalation_seed(seed: int, batch: int, round_: int, start: int, protocol: Protocol) -> int:
    """The attack seed of fresh start ``start`` (0-based) of escalation round ``round_``
    (1-based) of the trial on ``batch`` under run seed ``seed``."""
    slot = (round_ - 1) * protocol.starts + start
    return ESCALATION_STREAM + attack_seed(seed, batch) * ESCALATION_SLOTS + slot


def escalated(attack: Any, round_: int, protocol: Protocol) -> Attack:
    """``attack`` with its iterations multiplied by ``budget_factor ** round_``, at most the
    largest value its parameter allows."""
    declared = {f.name: f for f in dataclasses.fields(attack)}["iterations"]
    high = declared.metadata[METADATA_KEY].kind.high
    budget = attack.iterations * protocol.budget_factor**round_
    return dataclasses.replace(attack, iterations=min(budget, high) if high else budget)


def best(recs: list[Reconstruction]) -> Reconstruction:
    """The reconstruction with the lowest loss the attacker sees (the first among equals; a
    non-finite loss only when every one is), charged with everyone's time and evaluations."""
    losses = [r.loss if np.isfinite(r.loss) and r.status == "ok" else np.inf for r in recs]
    kept = recs[int(np.argmin(losses))]
    return dataclasses.replace(
        kept,
        seconds=float(sum(r.seconds for r in recs)),
        evaluations=int(sum(r.evaluations for r in recs)),
    )


def settle(
    attack: Attack,
    target: AttackTarget,
    truth: tuple[np.ndarray, np.ndarray],
    rec: Reconstruction,
    trial: tuple[int, int],
    check: Callable[[Reconstruction], bool],
    *,
    protocol: Protocol = PROTOCOL_1,
) -> tuple[Reconstruction, Evidence]:
    """Judges one trial and escalates it while it has neither converged nor leaked.

    Args:
        attack: The trial's attack; ``target`` what it attacked; ``truth`` the private
            (images, labels); ``rec`` its reconstruction.
        trial: The trial's (run seed, batch index), which seeds the escalation's starts.
        check: ``rec -> bool``, whether a reconstruction leaked (`leaked`).
        protocol: The tolerance and the cap (`PROTOCOL_1`).

    Returns:
        The reconstruction kept (the original, or an escalation's with a lower attacker's
        loss) and the evidence.
    """
    if not judgeable(attack, target, protocol):
        return rec, Evidence()
    x, y = truth
    loss = str(matching_loss(attack))
    reference = reference_scale(attack, target)
    truth_loss, judged = losses_at(attack, target, [(x, y), (rec.images, rec.labels)])
    done = converged(judged, truth_loss, reference, loss, protocol)
    starts = protocol.schedule_starts if rec.stop_reason == "schedule" else protocol.starts
    rounds = 0
    while not done and rounds < protocol.rounds and not check(rec):
        rounds += 1
        seeds = [escalation_seed(*trial, rounds, k, protocol) for k in range(starts)]
        # The starts run together (one program of their own), apart from every other trial.
        fresh = escalated(attack, rounds, protocol).attack_many(
            [target] * starts, seeds, width=starts
        )
        rec = best([rec, *fresh])
        (judged,) = losses_at(attack, target, [(rec.images, rec.labels)])
        done = converged(judged, truth_loss, reference, loss, protocol)
    return rec, Evidence(truth_loss, judged, float(done), rounds)
