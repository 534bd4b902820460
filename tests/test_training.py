"""Training under a defense: the non-finite guard (1 and 2 devices), the default recipe's
accuracy, and the utility columns the runner adds to the leaderboard."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pandas as pd
import pytest
from configs import run_config

from leakbench.client.recipes import DPRecipe, Recipe, TrainingConfig
from leakbench.client.training import DefendedTrainer, evaluate, run_epochs, train_under_defense
from leakbench.components.models import build_model
from leakbench.core.errors import ConfigError
from leakbench.datasets import load_dataset
from leakbench.defenses import make_defense
from leakbench.outputs.tables import UTILITY_COLUMNS
from leakbench.run.config import parse_config
from leakbench.run.runner import run_benchmark

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
    """Test accuracy after the default recipe at its first rate, on the whole training split."""
    data = load_dataset("digits")
    model = build_model("lenet", data.input_shape, data.num_classes, seed=0)
    config = TrainingConfig()
    report = train_under_defense(
        model,
        make_defense(defense, **params),
        config.default,
        config.learning_rates[0],
        (data.train.x, data.train.y),
        num_classes=data.num_classes,
        seed=0,
    )
    assert report.traces == 1 and report.skipped_steps == 0
    return evaluate(model, data.test.x, data.test.y)


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
            training={
                "epochs": 1,
                "batch_size": 64,
                "learning_rates": [1e-3, 3e-3],
                "seeds": 2,
                "dp": {"learning_rates": [1.0, 2.0]},
            },
        )
    )
    result = run_benchmark(spec, tmp_path / "out", progress=False)
    utility = pd.read_csv(tmp_path / "out" / "utility.csv")
    assert list(utility.columns) == UTILITY_COLUMNS
    # One row per trained model: every defense configuration, replicates 0 and 1.
    assert list(utility["defense"]) == ["none"] * 2 + ["gaussian"] * 2 + ["dpsgd"] * 2
    assert list(utility["replicate"]) == [0, 1] * 3
    # 135 of digits' 1347 training examples are held out for validation: 1212 remain.
    assert (utility["validation_examples"] == 135).all()
    default, dp = utility[utility["defense"] != "dpsgd"], utility[utility["defense"] == "dpsgd"]
    assert (default["recipe"] == "default").all() and (default["steps"] == 1212 // 64).all()
    assert (dp["recipe"] == "dp").all() and (dp["steps"] == 1212 // 128).all()
    assert (dp["optimizer"] == "sgd").all() and (dp["batch_size"] == 128).all()
    assert (utility["traces"] == 1).all()
    # The headline rows: DP-SGD's adaptive attack (loss = "cosine") adds a row of its own.
    board = result.leaderboard[result.leaderboard["strongest"]].set_index("defense")
    assert board.loc["none", "accuracy_drop"] == 0.0
    gaussian = utility[utility["defense"] == "gaussian"]["test_accuracy"].to_numpy()
    none = utility[utility["defense"] == "none"]["test_accuracy"].to_numpy()
    assert board.loc["gaussian", "test_accuracy"] == pytest.approx(gaussian.mean())
    # Two models: Student-t with 1 degree of freedom, t(0.975, 1) = 12.7062.
    half = 12.7062 * abs(gaussian[0] - gaussian[1]) / math.sqrt(2) / math.sqrt(2)
    assert board.loc["gaussian", "test_accuracy_ci95"] == pytest.approx(half, rel=1e-4)
    assert board.loc["gaussian", "accuracy_drop"] == pytest.approx((none - gaussian).mean())
    assert math.isnan(board.loc["gaussian", "epsilon"])
    dpsgd = make_defense("dpsgd", norm=1.0, noise_multiplier=1.0)
    assert board.loc["dpsgd", "epsilon"] == pytest.approx(dpsgd.epsilon(128 / 1212, 9, 1e-5))
    # Every rate searched (the grid's two, and those past its edge): all runs' 9 steps composed.
    runs = dp["rates_tried"].map(lambda rates: len(json.loads(rates)))
    assert (runs >= 2).all()
    assert list(dp["epsilon_search"]) == pytest.approx(
        [dpsgd.epsilon(128 / 1212, 9 * n, 1e-5) for n in runs]
    )
    assert board.loc["dpsgd", "epsilon_search"] == pytest.approx(dp["epsilon_search"].max())
    assert (dp["epsilon_search"] > dp["epsilon"]).all()
    assert default["epsilon_search"].isna().all()
    assert math.isnan(board.loc["gaussian", "epsilon_search"])
    assert board.loc["dpsgd", "delta"] == 1e-5
    # A rerun trains nothing again.
    again = run_benchmark(spec, tmp_path / "out", progress=False)
    assert again.trained == 0 and again.training_reused == 6
    assert np.allclose(again.utility["test_accuracy"], result.utility["test_accuracy"])


def test_a_restarted_trainer_computes_what_a_new_one_does() -> None:
    """`DefendedTrainer.restart` (the learning-rate search reuses one traced step): after a
    run at another rate and seed, a restart gives bit-identical weights to a new trainer."""
    data = load_dataset("digits")
    recipe = Recipe("default", 1, 64, "adam", (1e-2,))
    train = (data.train.x[:320], data.train.y[:320])
    defense = make_defense("gaussian", sigma=0.01)

    def fresh() -> tuple[keras.Model, DefendedTrainer]:
        model = build_model("lenet", data.input_shape, data.num_classes, seed=3)
        trainer = DefendedTrainer(model, defense, recipe.make_optimizer(1e-2), num_classes=10,
                                  seed=5)  # fmt: skip
        return model, trainer

    model, trainer = fresh()
    initial = model.get_weights()
    run_epochs(trainer, recipe, train, seed=5, delta=1e-5)
    expected = model.get_weights()

    model, trainer = fresh()
    run_epochs(trainer, recipe, train, seed=7, delta=1e-5)  # another batch order and noise
    trainer.optimizer.learning_rate = 0.5
    run_epochs(trainer, recipe, train, seed=7, delta=1e-5)
    assert not all(np.array_equal(a, b) for a, b in zip(model.get_weights(), expected, strict=True))
    trainer.restart(initial, 1e-2, 5)
    report = run_epochs(trainer, recipe, train, seed=5, delta=1e-5)
    for got, want in zip(model.get_weights(), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    assert report.steps == 5 and report.traces == 1


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ("epochs = 0", "training.epochs"),
        ('optimizer = "rmsprop"', "training.optimizer"),
        ("learning_rate = -1.0", "training.learning_rate"),
        ("learning_rates = []", "training.learning_rates"),
        ("learning_rates = [1e-3, 1e-3]", "training.learning_rates"),
        ("learning_rates = [0.0]", "training.learning_rates"),
        ("validation = 1.5", "training.validation"),
        ("validation = 0\nlearning_rates = [1e-3, 1e-2]", "training.validation must be above 0"),
        ("seeds = 0", "training.seeds"),
        ("dp = 3", "training.dp"),
        ("[training.dp]\nmomentum = 0.9", "training.dp.momentum"),
        ("[training.dp]\nbatch_size = 0", "training.dp.batch_size"),
        ("[training.dp]\nlearning_rates = 1.0", "training.dp.learning_rates"),
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


def test_learning_rate_is_an_old_name_for_a_list_of_one_rate() -> None:
    with pytest.warns(FutureWarning, match="'learning_rate' is deprecated; use 'learning_rates'"):
        spec = parse_config('[[attack]]\nname = "dlg"\n[training]\nlearning_rate = 0.01\n')
    assert spec.training.learning_rates == (0.01,)
    assert parse_config(spec.to_toml()) == spec


def test_only_example_level_defenses_train_with_the_dp_recipe() -> None:
    config = TrainingConfig(dp=DPRecipe(batch_size=256, learning_rates=(4.0,)))
    dp = config.recipe(make_defense("dpsgd", norm=1.0, noise_multiplier=1.0))
    assert (dp.name, dp.optimizer, dp.batch_size, dp.learning_rates) == ("dp", "sgd", 256, (4.0,))
    chain = make_defense("chain", steps=[{"name": "dpsgd", "norm": 1.0, "noise_multiplier": 1.0}])
    assert config.recipe(chain) == dp
    assert config.recipe(make_defense("gaussian", sigma=0.1)) == config.default
    off = TrainingConfig(dp=DPRecipe(enabled=False))
    assert off.recipe(make_defense("dpsgd", norm=1.0, noise_multiplier=1.0)) == off.default


def test_training_can_be_disabled() -> None:
    spec = parse_config('[[attack]]\nname = "dlg"\n[training]\nenabled = false\n')
    assert spec.training is None
    assert parse_config(spec.to_toml()) == spec


def test_a_training_batch_larger_than_the_split_is_refused_before_writing(tmp_path: Path) -> None:
    spec = parse_config('[[attack]]\nname = "idlg"\n[training]\nbatch_size = 1300\n')
    with pytest.raises(
        ConfigError,
        match=r"training\.batch_size .*digits's training split less its validation split \(1212\)",
    ):
        run_benchmark(spec, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()
