"""Training under a defense: the non-finite guard (1 and 2 devices), the default recipe's
accuracy, and the utility columns the runner adds to the leaderboard."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from configs import run_config

from leakbench.config import parse_config
from leakbench.datasets import load_dataset
from leakbench.defenses import make_defense
from leakbench.errors import ConfigError
from leakbench.models import build_model
from leakbench.runner import run_benchmark
from leakbench.training import TrainingConfig, train_under_defense

GUARD_SCRIPT = Path(__file__).with_name("guard_check.py")


def _guard_report(devices: int) -> dict:
    proc = subprocess.run(
        [sys.executable, str(GUARD_SCRIPT), "--devices", str(devices)],
        env=dict(os.environ, PYTHONSAFEPATH="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("devices", [1, 2], ids=["one-device", "mirrored-2-devices"])
def test_nan_steps_are_skipped_bit_for_bit_and_training_goes_on(devices: int) -> None:
    """Acceptance 3: a defense that returns NaN on every 7th step (from step 3)."""
    report = _guard_report(devices)
    clean, poisoned = report["clean"], report["poisoned"]
    steps = poisoned["steps"]
    expected = len([t for t in range(steps) if t % 7 == 3])
    # Every checked step: the poisoned ones changed nothing (weights, slots, iteration count),
    # the others updated.
    assert poisoned["violations"] == [] and clean["violations"] == []
    assert poisoned["checked_updates"] == poisoned["checked_steps"] - len(
        [t for t in range(poisoned["checked_steps"]) if t % 7 == 3]
    )
    assert poisoned["skipped_steps"] == expected
    assert poisoned["iterations"] == steps - expected
    assert clean["skipped_steps"] == 0 and clean["iterations"] == steps
    assert poisoned["finite_weights"]
    assert poisoned["traces"] == 1 and clean["traces"] == 1
    assert clean["accuracy"] >= 0.9
    assert abs(clean["accuracy"] - poisoned["accuracy"]) <= 0.02


def _accuracy(defense: str, **params: float) -> float:
    data = load_dataset("digits")
    model = build_model("lenet", data.input_shape, data.num_classes, seed=0)
    report = train_under_defense(
        model,
        make_defense(defense, **params),
        TrainingConfig(),
        (data.train.x, data.train.y),
        (data.test.x, data.test.y),
        num_classes=data.num_classes,
        seed=0,
    )
    assert report.traces == 1 and report.skipped_steps == 0
    return report.test_accuracy


def test_default_recipe_reaches_90_percent_and_noise_costs_accuracy() -> None:
    """Acceptance 5 on the embedded digits with the default [training] recipe."""
    clean = _accuracy("none")
    small = _accuracy("gaussian", sigma=0.01)
    large = _accuracy("gaussian", sigma=0.1)
    assert clean >= 0.90
    assert clean > small > large


def test_runner_writes_utility_and_leaderboard_columns(tmp_path: Path) -> None:
    spec = parse_config(
        run_config(
            "utility",
            images=1,
            defenses=(
                {"name": "none"},
                {"name": "gaussian", "sigma": 0.1},
                {"name": "dpsgd", "norm": 1.0, "noise_multiplier": 1.0},
            ),
            training={"epochs": 1, "batch_size": 64},
        )
    )
    result = run_benchmark(spec, tmp_path / "out", progress=False)
    utility = pd.read_csv(tmp_path / "out" / "utility.csv")
    assert list(utility["defense"]) == ["none", "gaussian", "dpsgd"]
    assert (utility["steps"] == 1347 // 64).all()
    assert (utility["traces"] == 1).all()
    board = result.leaderboard.set_index("defense")
    assert board.loc["none", "accuracy_drop"] == 0.0
    assert board.loc["gaussian", "accuracy_drop"] == pytest.approx(
        board.loc["none", "test_accuracy"] - board.loc["gaussian", "test_accuracy"]
    )
    assert math.isnan(board.loc["gaussian", "epsilon"])
    dpsgd = make_defense("dpsgd", norm=1.0, noise_multiplier=1.0)
    assert board.loc["dpsgd", "epsilon"] == pytest.approx(dpsgd.epsilon(64 / 1347, 21, 1e-5))
    assert board.loc["dpsgd", "delta"] == 1e-5
    # A rerun trains nothing again.
    again = run_benchmark(spec, tmp_path / "out", progress=False)
    assert again.trained == 0 and again.training_reused == 3
    assert np.allclose(again.utility["test_accuracy"], result.utility["test_accuracy"])


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ("epochs = 0", "training.epochs"),
        ('optimizer = "rmsprop"', "training.optimizer"),
        ("learning_rate = -1.0", "training.learning_rate"),
        ("batch_size = true", "training.batch_size"),
        ("delta = 1.5", "training.delta"),
        ("momentum = 0.9", "training.momentum"),
        ('enabled = "yes"', "training.enabled"),
    ],
)
def test_bad_training_tables_name_the_field(table: str, field: str) -> None:
    text = f'[[attack]]\nname = "dlg"\n[training]\n{table}\n'
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        parse_config(text)


def test_training_can_be_disabled() -> None:
    spec = parse_config('[[attack]]\nname = "dlg"\n[training]\nenabled = false\n')
    assert spec.training is None
    assert parse_config(spec.to_toml()) == spec


def test_a_training_batch_larger_than_the_split_is_refused_before_writing(tmp_path: Path) -> None:
    spec = parse_config('[[attack]]\nname = "idlg"\n[training]\nbatch_size = 5000\n')
    with pytest.raises(
        ConfigError, match=r"training\.batch_size .*digits's training split \(1347\)"
    ):
        run_benchmark(spec, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
