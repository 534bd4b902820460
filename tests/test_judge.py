"""The judge (`leakbench.run.judge`): convergence judged with the truth, and the escalation."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import tensorflow as tf

from leakbench.attacks import AttackTarget, Reconstruction, make_attack
from leakbench.components.forward import model_gradients
from leakbench.defenses import make_defense
from leakbench.run import judge
from leakbench.run.execute import trial_rows

SHAPE = (8, 8, 1)
# One round of one fresh start at twice the budget: enough to see an escalation, fast.
SMALL = dataclasses.replace(judge.PROTOCOL_1, rounds=1, budget_factor=2, starts=1)


def _case(model, data, index: int, defense: str | None = None, **params: float):
    """The target of test image ``index`` (its defended gradient) and its private batch."""
    x, y = data.test.x[index : index + 1], data.test.y[index : index + 1]
    grads = model_gradients(model, tf.constant(x), tf.one_hot(y, 10))
    if defense is not None:
        grads = make_defense(defense, **params)(grads, seed=tf.constant([0, index], tf.int64))
    return AttackTarget(model, tuple(grads), SHAPE, 1, 10), (x, y)


def _settle(attack, target, truth, seed: int, protocol=SMALL):
    """Attacks ``target`` and lets the judge settle the trial (leaks by the run's scores)."""
    (rec,) = attack.attack_many([target], [seed])
    x, y = truth

    def check(candidate: Reconstruction) -> bool:
        return judge.leaked(x, y, candidate, 1e-3, "none")

    return rec, *judge.settle(attack, target, truth, rec, (0, seed), check, protocol=protocol)


def test_an_attack_stopped_above_the_truth_is_not_converged(digits, lenet) -> None:
    """idlg capped at 3 iterations ends well above the true image's loss (0 undefended); the
    escalation (6 iterations, a fresh start) does not get there either: converged 0."""
    target, truth = _case(lenet, digits, 0)
    first, rec, evidence = _settle(make_attack("idlg", iterations=3), target, truth, 0)
    assert evidence.truth_loss < 1e-9 < evidence.judged_loss
    assert evidence.converged == 0.0
    assert evidence.escalations == 1
    assert rec.loss <= first.loss


def test_a_recovered_digit_is_converged_without_escalation(digits, lenet) -> None:
    """Undefended idlg recovers its digit: judged and true losses ~0, converged 1."""
    target, truth = _case(lenet, digits, 1)
    first, rec, evidence = _settle(make_attack("idlg"), target, truth, 1)
    assert evidence.truth_loss < 1e-9 and evidence.judged_loss < 1e-9
    assert evidence.converged == 1.0 and evidence.escalations == 0
    assert rec is first


def test_under_noise_a_reconstruction_below_the_truth_is_converged(digits, lenet) -> None:
    """Under Gaussian noise the true image no longer matches (its loss is the noise's), and an
    attack that fits the noisy gradient better than the truth has converged."""
    target, truth = _case(lenet, digits, 1, "gaussian", sigma=1e-2)
    _, _, evidence = _settle(make_attack("idlg"), target, truth, 1)
    assert evidence.truth_loss > 1e-3
    assert evidence.judged_loss <= evidence.truth_loss * (1 + SMALL.relative)
    assert evidence.converged == 1.0
    truth = evidence.truth_loss
    assert judge.converged(0.5 * truth, truth, 1.0, "l2", SMALL)
    assert not judge.converged(2.0 * truth, truth, 1.0, "l2", SMALL)


def test_escalation_keeps_the_lowest_attacker_loss_and_is_deterministic(digits, lenet) -> None:
    """The kept reconstruction is the one the attacker's own loss prefers, among the original
    and the escalation's starts, and the same trial settles the same way twice."""
    target, truth = _case(lenet, digits, 2)
    attack = make_attack("idlg", iterations=3)
    protocol = dataclasses.replace(SMALL, starts=2)
    first, rec, evidence = _settle(attack, target, truth, 2, protocol)
    seeds = [judge.escalation_seed(0, 2, 1, k, protocol) for k in range(protocol.starts)]
    fresh = judge.escalated(attack, 1, protocol).attack_many([target] * 2, seeds)
    assert fresh[0].loss != fresh[1].loss
    losses = [first.loss, *(f.loss for f in fresh)]
    assert rec.loss == min(losses)
    assert evidence.escalations == 1
    _, again, twice = _settle(attack, target, truth, 2, protocol)
    assert twice == evidence
    np.testing.assert_array_equal(again.images, rec.images)


def test_a_fixed_schedule_gets_a_doubled_schedule_check(digits, lenet) -> None:
    """ig ends on its schedule, above the truth's cosine loss: its check reruns it with the
    schedule doubled, from one start (`Protocol.schedule_starts`), and keeps the better loss."""
    target, truth = _case(lenet, digits, 3)
    attack = make_attack("ig", iterations=20)
    protocol = dataclasses.replace(SMALL, starts=2)
    first, rec, evidence = _settle(attack, target, truth, 3, protocol)
    assert first.stop_reason == "schedule" and evidence.escalations == 1
    assert evidence.converged == 0.0 and evidence.truth_loss < 1e-5 < evidence.judged_loss
    seed = judge.escalation_seed(0, 3, 1, 0, protocol)
    (fresh,) = judge.escalated(attack, 1, protocol).attack_many([target], [seed])
    assert fresh.iterations_used == 40
    assert rec.loss == min(first.loss, fresh.loss)
    assert rec.evaluations == first.evaluations + fresh.evaluations


def test_best_ignores_failed_attempts_and_charges_every_one() -> None:
    """`judge.best` prefers a finite loss of an ``ok`` attempt and adds up time and work."""

    def rec(loss: float, status: str = "ok") -> Reconstruction:
        return Reconstruction(
            np.zeros((1, *SHAPE), np.float32), np.zeros(1, np.int64), loss, np.zeros(0),
            status, evaluations=10, attempts=1, seconds=1.0,
        )  # fmt: skip

    kept = judge.best([rec(0.5), rec(math.nan, "diverged"), rec(0.25), rec(0.25)])
    assert kept.loss == 0.25 and kept.seconds == 4.0 and kept.evaluations == 40


def test_escalation_seeds_are_apart_from_the_attack_seeds() -> None:
    """Each (trial, round, start) has its own seed, none an attack seed of the run."""
    seeds = {
        judge.escalation_seed(seed, batch, r, k, judge.PROTOCOL_1)
        for seed in (0, 1, 2**31 - 1)
        for batch in (0, 1, 999)
        for r in range(1, judge.PROTOCOL_1.rounds + 1)
        for k in range(judge.PROTOCOL_1.starts)
    }
    assert len(seeds) == 9 * judge.PROTOCOL_1.rounds * judge.PROTOCOL_1.starts
    assert min(seeds) >= judge.ESCALATION_STREAM and max(seeds) < 2**63


def test_the_escalated_budget_doubles_and_stays_allowed() -> None:
    protocol = dataclasses.replace(judge.PROTOCOL_1, budget_factor=2)
    assert judge.escalated(make_attack("ig", iterations=100), 1, protocol).iterations == 200
    assert judge.escalated(make_attack("dlg", iterations=90_000), 1, protocol).iterations == 100_000


@pytest.mark.parametrize(
    ("name", "params"),
    [("analytic", {}), ("dlg", {"mixing": "learn"})],
)
def test_what_the_judge_cannot_evaluate_is_nan(digits, lenet, name: str, params: dict) -> None:
    """No truth for an analytic attack, nor for one that learns the client's MixUp mixing (its
    truth holds the client's draw): NaN evidence, no escalation."""
    batch = 2 if name == "dlg" else 1
    x, y = digits.test.x[:batch], digits.test.y[:batch]
    grads = model_gradients(lenet, tf.constant(x), tf.one_hot(y, 10))
    target = AttackTarget(lenet, tuple(grads), SHAPE, batch, 10)
    attack = make_attack(name, **params)
    assert not judge.judgeable(attack, target)
    dummy = Reconstruction(x, y, 1.0, np.zeros(0), "ok", 1, 1, 0.0)
    rec, evidence = judge.settle(attack, target, (x, y), dummy, (0, 0), lambda r: False)
    assert rec is dummy and math.isnan(evidence.converged) and evidence.escalations == 0


def test_rows_written_outside_an_attack_unit_are_unjudged() -> None:
    """`trial_rows` without evidence (the Flower auditor's) leaves every judge column NaN."""
    assert all(math.isnan(v) for v in judge.UNJUDGED.columns().values())
    assert "evidence" in trial_rows.__code__.co_varnames


@pytest.mark.parametrize("loss", ["cosine", "l2", "l1"])
def test_the_judge_reads_the_loss_ig_minimises(loss: str) -> None:
    attack = make_attack("ig", loss=loss)
    assert judge.matching_loss(attack) == loss
    assert judge.matching_loss(make_attack("dlg", loss=loss)) == loss
