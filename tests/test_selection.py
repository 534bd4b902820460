"""Fair utility: the validation split, the learning-rate search made on it alone, the training
replicates, and their keys."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pandas as pd
import pytest
from configs import run_config

from leakbench.client import selection
from leakbench.client.recipes import DPRecipe, TrainingConfig
from leakbench.client.selection import beyond_edge
from leakbench.client.training import (
    TrainingReport,
    evaluate,
    split_validation,
    train_under_defense,
)
from leakbench.components.models import build_model
from leakbench.core.errors import ConfigError
from leakbench.core.seeds import REPLICATE_STRIDE, training_seed, validation_indices
from leakbench.datasets import Dataset, load_dataset
from leakbench.datasets.base import Split
from leakbench.defenses import make_defense
from leakbench.outputs.tables import utility_summary
from leakbench.run import execute
from leakbench.run.config import parse_config
from leakbench.run.plan import plan_training

RATES = [1e-3, 1e-2, 3e-2]


def _spec(**training):
    return parse_config(
        run_config(
            "select",
            images=1,
            defenses=({"name": "gaussian", "sigma": 0.01},),
            training={
                "epochs": 1,
                "batch_size": 64,
                "learning_rates": RATES,
                "seeds": 1,
                **training,
            },
        )  # fmt: skip
    )


def test_the_validation_split_is_a_fixed_share_of_the_training_split() -> None:
    x = np.arange(1347, dtype=np.float32)[:, None]
    y = np.arange(1347)
    (fit_x, fit_y), (held_x, held_y) = split_validation((x, y), 0.1)
    assert len(held_y) == 135 and len(fit_y) == 1212  # round(134.7)
    assert sorted([*fit_y, *held_y]) == list(range(1347))  # disjoint, nothing lost
    assert np.array_equal(fit_x[:, 0], fit_y) and np.array_equal(held_x[:, 0], held_y)
    assert np.all(np.diff(fit_y) > 0)  # the rest keeps its order
    # The same examples every time, whatever the seed; a positive share holds out at least one.
    assert np.array_equal(validation_indices(1347, 0.1), held_y)
    assert len(validation_indices(10, 0.0)) == 0 and len(validation_indices(10, 0.01)) == 1


def test_replicate_seeds_are_distinct_from_every_run_seed() -> None:
    assert training_seed(7, 0) == 7  # replicate 0: the weights the attacks see
    assert training_seed(7, 2) == 7 + 2 * 2**31
    assert training_seed(2**31 - 1, 1) > 2**31 - 1  # above every run seed
    assert REPLICATE_STRIDE == 2**31
    with pytest.raises(ValueError, match="replicate"):
        training_seed(0, 100)


def test_the_chosen_rate_is_the_best_on_validation_and_its_model_is_reported() -> None:
    spec = _spec()
    data = load_dataset("digits")
    job = plan_training(spec)[0]
    row = execute.train_one(spec.model, data, job)[0]
    accuracies = json.loads(row["validation_accuracies"])
    tried = json.loads(row["rates_tried"])
    assert json.loads(row["learning_rates"]) == RATES and tried[:3] == RATES
    assert len(accuracies) == len(tried)
    best = int(np.argmax(accuracies))  # the first of equals, as the search keeps
    assert row["learning_rate"] == tried[best]
    assert row["validation_accuracy"] == accuracies[best]
    # The reported test accuracy is that of a model trained anew at the chosen rate, from the
    # same weights, on the training split less its validation split.
    fit, held = split_validation((data.train.x, data.train.y), 0.1)
    model = build_model("lenet", data.input_shape, data.num_classes, seed=0)
    recipe = spec.training.recipe(job.defense)
    train_under_defense(model, job.defense, recipe, tried[best], fit, num_classes=10, seed=0)
    assert evaluate(model, *held) == accuracies[best]
    assert evaluate(model, data.test.x, data.test.y) == row["test_accuracy"]


def test_the_test_split_has_no_say_in_the_choice() -> None:
    """Poisoning the test split (other images, shuffled labels) changes the reported test
    accuracy and nothing of the search: not one validation accuracy, not the chosen rate."""
    spec = _spec()
    data = load_dataset("digits")
    rng = np.random.default_rng(0)
    poisoned = dataclasses.replace(
        data,
        test=Split(rng.random(data.test.x.shape, np.float32), rng.permutation(data.test.y)),
    )
    job = plan_training(spec)[0]
    clean = execute.train_one(spec.model, data, job)[0]
    dirty = execute.train_one(spec.model, poisoned, job)[0]
    search = ["learning_rate", "validation_accuracies", "validation_accuracy", "final_loss"]
    assert {k: clean[k] for k in search} == {k: dirty[k] for k in search}
    assert clean["test_accuracy"] != dirty["test_accuracy"]


class _Guarded:
    """A test split that refuses to be read until the search is over."""

    def __init__(self, split: Split, log: list[str]) -> None:
        self._split, self._log = split, log

    def _read(self, what: str) -> np.ndarray:
        if "selected" not in self._log:
            raise AssertionError(f"the test split's {what} was read during the search")
        self._log.append(f"test.{what}")
        return getattr(self._split, what)

    @property
    def x(self) -> np.ndarray:
        return self._read("x")

    @property
    def y(self) -> np.ndarray:
        return self._read("y")

    def __len__(self) -> int:
        return len(self._split)


def test_the_test_split_is_read_only_after_the_search(monkeypatch) -> None:
    log: list[str] = []
    real = execute.select

    def select(*args, **kwargs):
        chosen = real(*args, **kwargs)
        log.append("selected")
        return chosen

    monkeypatch.setattr(execute, "select", select)
    data = load_dataset("digits")
    guarded = Dataset(data.name, data.train, _Guarded(data.test, log), data.class_names)
    row = execute.train_one(_spec().model, guarded, plan_training(_spec())[0])[0]
    assert log[0] == "selected" and "test.x" in log and "test.y" in log
    assert 0.0 <= row["test_accuracy"] <= 1.0


def test_replicates_and_their_keys() -> None:
    base = {"epochs": 1, "batch_size": 64, "learning_rates": [1e-3]}
    two = parse_config(run_config("k", images=1, seeds=(0, 1), training={**base, "seeds": 2}))
    three = parse_config(run_config("k", images=1, seeds=(0, 1), training={**base, "seeds": 3}))
    jobs = plan_training(three)
    assert [(j.seed, j.replicate) for j in jobs] == [(s, r) for s in (0, 1) for r in range(3)]
    assert len({j.key for j in jobs}) == 6
    # More replicates extend fewer: the first two keep their keys.
    assert [j.key for j in plan_training(two)] == [j.key for j in jobs if j.replicate < 2]
    # Everything that changes a number changes the key: validation share, rates, recipe.
    for change in ({"validation": 0.2}, {"learning_rates": [1e-2]}, {"optimizer": "sgd"}):
        other = parse_config(run_config("k", images=1, training={**base, **change}))
        assert plan_training(other)[0].key != plan_training(two)[0].key
    # The DP recipe is a dpsgd training's, not a gaussian one's.
    dp = {"dp": {"batch_size": 64, "learning_rates": [4.0]}}
    defenses = (
        {"name": "gaussian", "sigma": 0.1},
        {"name": "dpsgd", "norm": 1.0, "noise_multiplier": 1.0},
    )
    plain = parse_config(
        run_config(
            "k", images=1, defenses=defenses, training={**base, "dp": {"learning_rates": [4.0]}}
        )
    )
    changed = parse_config(run_config("k", images=1, defenses=defenses, training={**base, **dp}))
    keys = [[j.key for j in plan_training(s) if j.replicate == 0] for s in (plain, changed)]
    assert keys[0][0] == keys[1][0] and keys[0][1] != keys[1][1]


def test_the_accuracy_summary_is_over_every_trained_model_by_hand() -> None:
    """Three replicates of one seed: mean, Student-t half-width (t(0.975, 2) = 4.302653) and
    the drop against ``none`` paired by replicate."""
    rows = [
        ("none", 0, 0.95), ("none", 1, 0.93), ("none", 2, 0.91),
        ("gaussian", 0, 0.90), ("gaussian", 1, 0.80), ("gaussian", 2, 0.70),
    ]  # fmt: skip
    utility = pd.DataFrame(
        [
            {"dataset": "digits", "model": "lenet", "defense": d, "defense_params": "{}",
             "seed": 0, "replicate": r, "test_accuracy": a, "epsilon": np.nan, "delta": 1e-5,
             "skipped_steps": 1}
            for d, r, a in rows
        ]
    )  # fmt: skip
    summary = utility_summary(utility).set_index("defense")
    assert summary.loc["gaussian", "test_accuracy"] == pytest.approx(0.8)
    assert summary.loc["gaussian", "test_accuracy_ci95"] == pytest.approx(
        4.302653 * 0.1 / np.sqrt(3), rel=1e-6
    )
    # (0.05 + 0.13 + 0.21) / 3: each replicate against the none model of the same replicate.
    assert summary.loc["gaussian", "accuracy_drop"] == pytest.approx(0.13)
    assert summary.loc["none", "accuracy_drop"] == 0.0
    assert summary.loc["gaussian", "skipped_steps"] == 3
    # One model: no interval.
    single = utility_summary(utility[utility["replicate"] == 0]).set_index("defense")
    assert np.isnan(single.loc["gaussian", "test_accuracy_ci95"])
    assert single.loc["gaussian", "accuracy_drop"] == pytest.approx(0.05)


def test_a_reused_trainer_trains_what_a_new_one_does(monkeypatch) -> None:
    # A process keeps its trainer from one training to the next of the same defense and
    # restarts it on the next seed's weights: the row is the one a new trainer gives.
    from leakbench.client.selection import Trainers

    spec = _spec(seeds=2, learning_rates=[1e-2, 3e-2])
    data = load_dataset("digits")
    first, second = plan_training(spec)
    assert (first.replicate, second.replicate) == (0, 1)
    monkeypatch.setattr(execute, "_TRAINERS", Trainers())
    execute.train_one(spec.model, data, first)
    kept = execute._TRAINERS._kept
    reused = execute.train_one(spec.model, data, second)[0]
    assert execute._TRAINERS._kept is kept  # the same trainer served both
    monkeypatch.setattr(execute, "_TRAINERS", Trainers())
    fresh = execute.train_one(spec.model, data, second)[0]
    timing = {"seconds_per_step"}
    assert {k: v for k, v in reused.items() if k not in timing} == {
        k: v for k, v in fresh.items() if k not in timing
    }
    # Another defense gets a trainer of its own.
    other = dataclasses.replace(first, defense=type(first.defense)(sigma=0.1))
    execute.train_one(spec.model, data, other)
    assert execute._TRAINERS._kept is not kept


def test_the_rate_past_an_edge_by_hand() -> None:
    assert beyond_edge([0.01, 0.03], 0.03) == 0.09  # 0.03 * 0.03 / 0.01
    assert beyond_edge([0.01, 0.03], 0.01) == 0.00333333333333  # 0.01 * 0.01 / 0.03
    # The grid's order does not matter, only its ends.
    assert beyond_edge([1e-3, 3e-4, 3e-3], 3e-4) == 9e-5
    assert beyond_edge([1e-3, 3e-4, 3e-3], 3e-3) == 9e-3
    assert beyond_edge([1e-3, 3e-4, 3e-3], 1e-3) is None  # inside
    assert beyond_edge([4.0], 4.0) is None  # no search, no edge
    assert beyond_edge([4.0, 4.0], 4.0) is None


class _Model:
    def __init__(self) -> None:
        self.rate = 0.0

    def get_weights(self) -> list[np.ndarray]:
        return [np.array(self.rate)]

    def set_weights(self, weights: list[np.ndarray]) -> None:
        self.rate = float(weights[0])


class _Trainer:
    """A trainer that trains nothing: it remembers its rate so that a fake validation
    accuracy can be read from it."""

    def __init__(self, model, *args, **kwargs) -> None:
        self.model, self.runs = model, []

    def restart(self, initial, rate, seed) -> None:
        self.model.rate = rate


def _search(monkeypatch, accuracy, rates, extensions=2):
    """The rates `select` trains, and what it keeps, when a model at rate r scores
    ``accuracy(r)`` on validation."""
    runs: list[int] = []

    def run_epochs(trainer, recipe, fit, *, seed, delta, run):
        runs.append(run)
        return TrainingReport(10, 0, 1, 0.0, 0.1, None, delta)

    monkeypatch.setattr(selection, "DefendedTrainer", _Trainer)
    monkeypatch.setattr(selection, "run_epochs", run_epochs)
    monkeypatch.setattr(selection, "evaluate", lambda model, x, y: accuracy(model.rate))
    config = TrainingConfig(learning_rates=tuple(rates), edge_extensions=extensions)
    x, y = np.zeros((100, 1), np.float32), np.zeros(100, np.int64)
    chosen = selection.select(_Model, make_defense("none"), config, (x, y), num_classes=2, seed=0)
    assert runs == list(range(len(chosen.rates)))  # each rate a run of its own
    return chosen


def test_a_search_goes_past_the_edge_its_best_rate_is_at(monkeypatch) -> None:
    # Accuracy peaks at 0.1: from [0.01, 0.03] the search tries 0.09, then 0.27, and keeps 0.09.
    peak = lambda r: -abs(np.log(r / 0.1))  # noqa: E731
    chosen = _search(monkeypatch, peak, [0.01, 0.03])
    assert chosen.rates == (0.01, 0.03, 0.09, 0.27)
    assert chosen.learning_rate == 0.09 and not chosen.at_edge
    assert chosen.validation_accuracies == tuple(peak(r) for r in chosen.rates)
    # Downwards too.
    low = lambda r: -abs(np.log(r / 0.001))  # noqa: E731
    chosen = _search(monkeypatch, low, [0.01, 0.03])
    assert chosen.rates == (0.01, 0.03, 0.00333333333333, 0.00111111111111)
    assert chosen.learning_rate == 0.00111111111111 and chosen.at_edge  # out of extensions


def test_an_inside_winner_and_no_extensions_leave_the_grid_alone(monkeypatch) -> None:
    peak = lambda r: -abs(np.log(r / 0.01))  # noqa: E731
    chosen = _search(monkeypatch, peak, [0.003, 0.01, 0.03])
    assert chosen.rates == (0.003, 0.01, 0.03) and chosen.learning_rate == 0.01
    rising = lambda r: r  # noqa: E731
    chosen = _search(monkeypatch, rising, [0.003, 0.01, 0.03], extensions=0)
    assert chosen.rates == (0.003, 0.01, 0.03) and chosen.at_edge
    # A tie past the edge keeps the rate trained first, now inside: the search stops there.
    flat = lambda r: min(r, 0.03)  # noqa: E731
    chosen = _search(monkeypatch, flat, [0.01, 0.03])
    assert chosen.rates == (0.01, 0.03, 0.09) and chosen.learning_rate == 0.03
    assert not chosen.at_edge


def test_the_dp_recipe_trains_as_many_epochs_as_the_others_by_default() -> None:
    dpsgd = make_defense("dpsgd", norm=1.0, noise_multiplier=1.0)
    assert TrainingConfig(epochs=7).recipe(dpsgd).epochs == 7
    assert TrainingConfig(epochs=7, dp=DPRecipe(epochs=3)).recipe(dpsgd).epochs == 3


@pytest.mark.parametrize(
    "dp, field",
    [
        ({"epochs": 15}, "training.dp.epochs must be 0 or training.epochs (5)"),
        ({"learning_rates": [2.0, 4.0, 8.0]}, "training.dp.learning_rates must list as many"),
    ],
)
def test_protocol_2_refuses_an_unequal_dp_budget(dp, field) -> None:
    defenses = ({"name": "dpsgd", "norm": 1.0, "noise_multiplier": 1.0},)
    training = {"epochs": 5, "learning_rates": [1e-2, 3e-2], "dp": {"learning_rates": [4.0, 8.0]}}
    unequal = {**training, "dp": {**training["dp"], **dp}}
    parse_config(run_config("fair", images=1, defenses=defenses, training=training))
    with pytest.raises(ConfigError, match=field.replace("(", r"\(").replace(")", r"\)")):
        parse_config(run_config("fair", images=1, defenses=defenses, training=unequal))
    # Protocol 1 allowed it, and a run without an example-level defense does not use the recipe.
    parse_config(
        "protocol = 1\n" + run_config("fair", images=1, defenses=defenses, training=unequal)
    )
    parse_config(run_config("fair", images=1, training=unequal))
