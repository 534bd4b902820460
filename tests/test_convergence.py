"""Attacks say why they stopped; a run says when its strongest attack ran out of budget."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
from configs import run_config

from leakbench.attacks import AttackTarget, make_attack
from leakbench.cli import main
from leakbench.components.forward import model_gradients
from leakbench.outputs.tables import budget_share, budget_warning


def _target(model, data, index: int) -> AttackTarget:
    x = tf.constant(data.test.x[index : index + 1])
    grads = model_gradients(model, x, tf.one_hot(data.test.y[index : index + 1], 10))
    return AttackTarget(model, tuple(grads), (8, 8, 1), 1, 10)


def test_idlg_reports_its_stop_reason_and_the_iterations_it_used(digits, lenet) -> None:
    target = _target(lenet, digits, 0)
    short = make_attack("idlg", iterations=3)(target, seed=0)
    assert (short.stop_reason, short.iterations_used) == ("budget", 3)
    # With a stall window the same search ends by itself, well inside a large budget.
    long = make_attack("idlg", iterations=5000, stall_window=100, stall_progress=0.01)
    rec = long(target, seed=0)
    assert rec.stop_reason in ("converged", "stalled")
    assert rec.iterations_used < 5000
    assert float(np.mean((rec.images - digits.test.x[:1]) ** 2)) <= 1e-3


def test_ig_runs_its_schedule_and_says_so(digits, lenet) -> None:
    rec = make_attack("ig", iterations=4)(_target(lenet, digits, 1), seed=0)
    assert (rec.stop_reason, rec.iterations_used) == ("schedule", 4)


def test_a_diverged_attack_says_diverged(digits, lenet) -> None:
    bad = _target(lenet, digits, 0)
    bad = AttackTarget(lenet, tuple(g * np.nan for g in bad.gradients), (8, 8, 1), 1, 10)
    rec = make_attack("dlg", iterations=5, retries=0)(bad, seed=0)
    assert (rec.status, rec.stop_reason) == ("diverged", "diverged")


def test_budget_share_counts_trials_not_images() -> None:
    # Two trials of a batch of 2 (4 rows), one of which hit its budget.
    trials = pd.DataFrame(
        {"seed": [0, 0, 0, 0], "batch_index": [0, 0, 1, 1],
         "stop_reason": ["budget", "budget", "converged", "converged"]}
    )  # fmt: skip
    assert budget_share(trials) == 0.5
    # A fixed schedule (ig) ended on its budget too: no convergence test stopped it.
    assert budget_share(trials.assign(stop_reason="schedule")) == 1.0
    assert np.isnan(budget_share(trials.drop(columns="stop_reason")))


def test_the_warning_names_only_strongest_attacks_over_ten_percent() -> None:
    board = pd.DataFrame(
        {"attack": ["dlg", "idlg", "dlg"], "defense": ["none", "none", "prune"],
         "defense_params": ["{}", "{}", "{}"], "strongest": [False, True, True],
         "budget_share": [1.0, 0.1, 0.125]}
    )  # fmt: skip
    line = budget_warning(board)
    assert line == "1 cell(s) hit the iteration budget in >10% of trials; raise iterations"
    assert len("leakbench: warning: " + line) <= 100
    assert budget_warning(board.assign(budget_share=0.0)) is None


@pytest.mark.parametrize(("iterations", "warned"), [(2, True), (300, False)])
def test_run_warns_in_one_line_when_the_budget_was_short(tmp_path, iterations, warned) -> None:
    config = tmp_path / "short.toml"
    config.write_text(
        run_config("short", images=2, attacks=({"name": "idlg", "iterations": iterations,
                                                 "stall_window": 50, "stall_progress": 0.01},)),
        encoding="utf-8",
    )  # fmt: skip
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        assert main(["run", str(config), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    lines = [line for line in err.getvalue().splitlines() if "iteration budget" in line]
    assert len(lines) == (1 if warned else 0)
    if warned:
        assert lines[0].startswith("leakbench: warning: 1 cell(s) hit the iteration budget")
    trials = pd.read_csv(tmp_path / "out" / "trials.csv")
    assert set(trials["stop_reason"]) <= {"converged", "stalled", "budget"}
    assert (trials["iterations_used"] <= iterations).all()
