"""The learning-rate search of a utility training, made on the validation split alone.

A defense configuration is trained once per learning rate of its recipe
(`leakbench.client.training.TrainingConfig.recipe`), each time from the same initial weights and,
for a defense without a DP accountant, in the same batch order (one trainer, restarted:
`leakbench.client.training.DefendedTrainer.restart`),
on the training split less its validation split (`leakbench.client.training.split_validation`). The
rate whose model has the best validation accuracy is kept (ties: the rate listed first). `select` is
given the training split only, so nothing it decides can depend on the test split: the caller
measures the test accuracy of the kept model afterwards (`leakbench.run.execute.train_one`).

A defense with a DP accountant trains each rate as a run of its own (run ``k`` for the ``k``-th
rate: its own Poisson-sampled batches and its own noise, `leakbench.client.training.run_epochs`),
so that the ``m`` runs of the search are independent releases of the private training split and
their privacy composes: `Selection.epsilon_search` is the accountant's epsilon of all ``m * steps``
noisy steps. Keeping one of the ``m`` models by its validation accuracy is post-processing of the
``m`` models and of the validation split, so the bound covers the kept model with respect to the
examples trained on; it says nothing about the validation examples, which the choice reads
without noise. A defense without an accountant trains every rate on the same batches.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import keras
import numpy as np

from leakbench.client.recipes import Recipe, TrainingConfig
from leakbench.client.training import (
    DefendedTrainer,
    TrainingReport,
    evaluate,
    run_epochs,
    split_validation,
)
from leakbench.defenses import Defense


@dataclasses.dataclass(frozen=True)
class Selection:
    """The outcome of a learning-rate search.

    Attributes:
        model: The model trained at the chosen rate.
        recipe: The recipe searched.
        learning_rate: The chosen rate.
        validation_accuracy: The chosen model's validation accuracy (NaN without a
            validation split).
        validation_accuracies: Every rate's validation accuracy, in the order of ``rates``.
        report: The chosen model's `TrainingReport`.
        epsilon_search: The defense's epsilon, at ``report.delta``, for training every searched
            rate (``len(rates)`` runs of ``report.steps`` steps composed), or None for a
            defense without a guarantee; equal to ``report.epsilon`` for one rate.
        rates: Every rate trained, in order: the recipe's, then those past an edge of the grid
            (`beyond_edge`, at most ``edge_extensions`` of them).
        at_edge: Whether the chosen rate is still the lowest or highest trained (the
            extensions ran out with the edge still winning): its accuracy may be cut short.
    """

    model: keras.Model
    recipe: Recipe
    learning_rate: float
    validation_accuracy: float
    validation_accuracies: tuple[float, ...]
    report: TrainingReport
    epsilon_search: float | None = None
    rates: tuple[float, ...] = ()
    at_edge: bool = False


class Trainers:
    """The latest search's trainer, kept for the next search of the same model and defense
    (``key``): a run trains each defense once per seed and replicate, one after the other, and
    a trainer restarted on the new initial weights computes what a new one would
    (`DefendedTrainer.restart`) without tracing its step again (about a second per search on two
    cores). One trainer is kept, so the memory is one model's."""

    def __init__(self) -> None:
        self._kept: tuple[str, DefendedTrainer] | None = None

    def get(self, key: str, make: Callable[[], DefendedTrainer]) -> DefendedTrainer:
        """The kept trainer if it was made for ``key``, else a new one from ``make``, kept."""
        if self._kept is None or self._kept[0] != key:
            self._kept = (key, make())
        return self._kept[1]


def select(
    build: Callable[[], keras.Model],
    defense: Defense,
    config: TrainingConfig,
    train: tuple[np.ndarray, np.ndarray],
    *,
    num_classes: int,
    seed: int,
    reuse: tuple[Trainers, str] | None = None,
) -> Selection:
    """Trains a fresh ``build()`` at each learning rate of ``defense``'s recipe and keeps the
    one with the best validation accuracy.

    Args:
        build: Returns the model at its initial weights (the same weights on every call).
        defense: The defense every step's gradient passes through.
        config: The ``[training]`` table (recipes, validation share, delta).
        train: The whole training split; its validation split is cut here.
        num_classes: Number of classes.
        seed: Seed of the batch order and of the defense's draws.
        reuse: Where to keep the trainer for the next search, and the key of this search's
            model and defense (equal keys: the same architecture, defense and recipe).
    """
    recipe = config.recipe(defense)
    fit, held = split_validation(train, config.validation)
    built = build()
    initial = built.get_weights()

    def make() -> DefendedTrainer:
        return DefendedTrainer(
            built, defense, recipe.make_optimizer(recipe.learning_rates[0]),
            num_classes=num_classes, seed=seed,
        )  # fmt: skip

    # One trainer for every rate (and, with ``reuse``, every search of the same key), restarted
    # in between: its step is traced once.
    trainer = make() if reuse is None else reuse[0].get(reuse[1], make)
    model = trainer.model
    kept: tuple[int, list[np.ndarray], TrainingReport] | None = None
    rates, accuracies = list(recipe.learning_rates), []
    extensions = config.edge_extensions
    index = 0
    while index < len(rates):
        trainer.restart(initial, rates[index], seed)
        report = run_epochs(trainer, recipe, fit, seed=seed, delta=config.delta, run=index)
        accuracies.append(evaluate(model, *held))
        # Strictly better only: the first listed rate wins a tie (and NaN, without a
        # validation split, never replaces the one rate's model).
        if kept is None or accuracies[index] > accuracies[kept[0]]:
            kept = (index, model.get_weights(), report)
        index += 1
        past = beyond_edge(rates, rates[kept[0]]) if index == len(rates) else None
        if past is not None and extensions > 0:
            rates.append(past)
            extensions -= 1
    if kept is None:  # pragma: no cover - a recipe lists at least one rate (params.Numbers)
        raise ValueError("a recipe without learning rates")
    index, weights, report = kept
    model.set_weights(weights)
    runs = len(rates)
    searched = defense.epsilon(recipe.batch_size / len(fit[0]), runs * report.steps, report.delta)
    return Selection(
        model=model,
        recipe=recipe,
        learning_rate=rates[index],
        validation_accuracy=accuracies[index],
        validation_accuracies=tuple(accuracies),
        report=report,
        epsilon_search=None if searched is None else float(searched),
        rates=tuple(rates),
        at_edge=beyond_edge(rates, rates[index]) is not None,
    )


def beyond_edge(rates: list[float], best: float) -> float | None:
    """The rate one geometric step past the edge of ``rates`` that ``best`` is, or None when
    ``best`` lies inside them (or fewer than two distinct rates were tried: no search, no
    edge). The step is the ratio of the edge to its neighbour: past 0.01 and 0.03 comes 0.09,
    below them 0.00333. Rounded to 12 significant digits, so that a rate reads as written."""
    ordered = sorted(set(rates))
    if len(ordered) < 2 or ordered[0] < best < ordered[-1]:
        return None
    edge, neighbour = (ordered[-1], ordered[-2]) if best == ordered[-1] else ordered[:2]
    return float(f"{edge * edge / neighbour:.12g}")
