"""Training under a defense: what a defense costs in accuracy.

The train step is one ``tf.function`` per (model, defense, batch shape), traced once. Every step's
randomness comes from stateless ops keyed by ``(seed, step)`` in the training's own stream
(`leakbench.core.seeds.training_draw`), where ``step`` is a variable the step itself advances, so no
step builds new ops and nothing retraces (the graph, the memory and the step time stay flat; see
``benchmarks/train_steady_state.py``).

The defense is applied client-side, to the gradient of the client's batch (or to its
per-example gradients, for example-level defenses such as DP-SGD), through the same
`defended_gradients` the attacks observe. If any entry of the defended gradient is NaN or Inf
the update is skipped: weights, BatchNorm's moving statistics, optimizer slots and the
optimizer's iteration count stay bit-identical, and ``skipped_steps`` goes up. The forward pass
runs in training mode (`leakbench.components.forward.forward_training`); a step that is applied also
writes back the moving statistics it computed, as Keras' own training does. Under a
``tf.distribute`` strategy each replica defends its own share of the batch before the all-reduce,
and the skip decision is all-reduced too, so the replicas always skip together.

Under ``tf.distribute.ParameterServerStrategy`` the variables live on the parameter servers and
`DefendedTrainer.schedule` hands each step to whichever worker the coordinator picks: that
worker is one client, defends the gradient of its batch and skips its own update if the result
is non-finite. Workers update asynchronously, so there is no all-reduce and nothing to skip
together; the coordinator numbers the steps it schedules, so step ``t`` still draws its noise
from ``(seed, t)`` whichever worker runs it.
"""

from __future__ import annotations

import dataclasses
import time
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf

from leakbench.client.recipes import Recipe, TrainingConfig
from leakbench.client.update import defended_step
from leakbench.core.seeds import training_client, training_draw, validation_indices
from leakbench.defenses import Defense, NoDefense


class StepResult(NamedTuple):
    """What one train step reports (scalar tensors)."""

    loss: tf.Tensor
    skipped: tf.Tensor
    global_norm: tf.Tensor


class DefendedTrainer:
    """Trains ``model`` with gradients passed through ``defense``.

    Build the model and call this constructor inside ``strategy.scope()`` when distributing.
    Run a step with ``step(images, labels)`` (one device, or a synchronous strategy such as
    ``MirroredStrategy`` / ``MultiWorkerMirroredStrategy``, where every worker passes the same
    global batch), or with ``schedule(images, labels)`` under ``ParameterServerStrategy``.

    Args:
        model: The Keras model (its variables are updated in place).
        defense: The defense applied to each step's gradient.
        optimizer: A Keras optimizer (built here on the model's variables).
        num_classes: Number of classes (labels are one-hot encoded inside the step).
        seed: Seed of the defense's randomness; step ``t`` uses the stateless key
            ``leakbench.core.seeds.training_draw(seed, t)``.
        strategy: A ``tf.distribute`` strategy, or None for the default (single device).
    """

    def __init__(
        self,
        model: keras.Model,
        defense: Defense,
        optimizer: keras.optimizers.Optimizer,
        *,
        num_classes: int,
        seed: int,
        strategy: tf.distribute.Strategy | None = None,
    ) -> None:
        self.model = model
        self.defense = defense
        self.optimizer = optimizer
        self.num_classes = num_classes
        self.strategy = strategy or tf.distribute.get_strategy()
        self.traces = 0
        with self.strategy.scope():
            optimizer.build(model.trainable_variables)
            # Written once per step by the first replica only; read by every replica.
            counter = {
                "dtype": tf.int64,
                "trainable": False,
                "aggregation": tf.VariableAggregation.ONLY_FIRST_REPLICA,
            }
            # A variable, not a constant, so that `restart` can change it without a retrace.
            self.seed = tf.Variable(seed, name="seed", **counter)
            self.step_count = tf.Variable(0, name="steps", **counter)
            self.skipped_steps = tf.Variable(0, name="skipped_steps", **counter)
        self.step = tf.function(self._global_step)
        self._next_scheduled: int | None = None  # ParameterServerStrategy: next step's number

    def restart(self, weights: list[np.ndarray], learning_rate: float, seed: int) -> None:
        """Puts the trainer back to a fresh start without retracing its step: the model's
        variables to ``weights`` (in `keras.Model.get_weights` order), every optimizer variable
        to zero and its learning rate to ``learning_rate``, the step counters to zero and the
        defense's seed to ``seed``. The steps that follow compute what a new trainer of a new
        optimizer on a model with these weights would (`tests/test_training.py` checks it)."""
        self.model.set_weights(weights)
        for variable in self.optimizer.variables:
            variable.assign(np.zeros(variable.shape, variable.dtype))
        self.optimizer.learning_rate = learning_rate
        self.seed.assign(seed)
        self.step_count.assign(0)
        self.skipped_steps.assign(0)
        self._next_scheduled = None

    def schedule(
        self, images: tf.Tensor, labels: tf.Tensor
    ) -> tf.distribute.experimental.coordinator.RemoteValue:
        """Schedules one train step on a worker (``ParameterServerStrategy`` only).

        Steps are numbered here, on the coordinator, in the order they are scheduled (from the
        current ``step_count``), and step ``t`` draws its noise from ``(seed, t)``: two workers
        reading the shared step counter at the same time would otherwise draw the same noise.

        Returns:
            The step's `StepResult` as a ``RemoteValue``; ``fetch()`` it, or call the
            coordinator's ``join()`` to wait for every scheduled step.
        """
        if not isinstance(self.strategy, tf.distribute.ParameterServerStrategy):
            raise TypeError(
                "DefendedTrainer.schedule needs a ParameterServerStrategy; call step() instead"
            )
        # One coordinator per strategy: this returns the caller's if it made one.
        coordinator = tf.distribute.coordinator.ClusterCoordinator(self.strategy)
        if self._next_scheduled is None:
            self._next_scheduled = int(self.step_count.numpy())
        step = tf.constant(self._next_scheduled, tf.int64)
        self._next_scheduled += 1
        return coordinator.schedule(self.step, args=(images, labels, step))

    def _global_step(
        self, images: tf.Tensor, labels: tf.Tensor, step: tf.Tensor | None = None
    ) -> StepResult:
        """One train step on a global batch (``self.step`` is its compiled form).

        ``step`` numbers the step for the defense's seed; None means the step counter.
        """
        self.traces += 1  # a Python side effect: runs once per trace, never per step
        strategy = self.strategy
        if step is None:
            step = self.step_count.read_value()
        grads, state, bad, loss, norm = strategy.run(
            self._replica_gradients, args=(images, labels, step)
        )
        # BatchNorm's updated moving statistics: the mean over replicas, as each replica saw
        # its own share of the batch (one replica: its own values).
        state = [strategy.reduce(tf.distribute.ReduceOp.MEAN, v, axis=None) for v in state]
        first = strategy.experimental_local_results
        # `bad` was all-reduced, so every replica holds the same count and takes the same branch.
        # The branch is taken here, in cross-replica context: a synchronisation point (the
        # optimizer's all-reduce) inside a replica-context `tf.cond` is not supported.
        finite = tf.equal(first(bad)[0], 0)

        def apply() -> tf.Tensor:
            strategy.run(self._replica_apply, args=(grads,))
            # Skipped together with the weights: a non-finite step leaves the statistics too.
            for variable, value in zip(self.model.non_trainable_variables, state, strict=True):
                variable.assign(value)
            return tf.constant(False)

        skipped = tf.cond(finite, apply, lambda: tf.constant(True))
        self.skipped_steps.assign_add(tf.cast(skipped, tf.int64))
        self.step_count.assign_add(1)
        return StepResult(
            loss=strategy.reduce(tf.distribute.ReduceOp.MEAN, loss, axis=None),
            skipped=skipped,
            global_norm=first(norm)[0],
        )

    def _replica_gradients(
        self, images: tf.Tensor, labels: tf.Tensor, step: tf.Tensor
    ) -> tuple[list[tf.Tensor], list[tf.Tensor], tf.Tensor, tf.Tensor, tf.Tensor]:
        """Per replica: the defended gradient of its share of the batch, scaled for the sum,
        and the moving statistics its forward pass leaves."""
        replicas = self.strategy.num_replicas_in_sync
        client = training_client(self.seed)
        if replicas > 1:
            # Each replica is a client with its own share of the batch and its own noise.
            rid = tf.distribute.get_replica_context().replica_id_in_sync_group
            share = tf.shape(images)[0] // replicas
            images = images[rid * share : (rid + 1) * share]
            labels = labels[rid * share : (rid + 1) * share]
            client = training_client(self.seed, rid)
        seed = training_draw(client, step)
        targets = tf.one_hot(labels, self.num_classes)
        loss, grads, state = defended_step(self.defense, self.model, images, targets, seed)
        norm = tf.linalg.global_norm(grads)
        # Non-finite moving statistics would poison inference as NaN weights poison training.
        bad = tf.add_n(
            [
                tf.reduce_sum(tf.cast(~tf.math.is_finite(g), tf.int64))
                for g in [*grads, *state]
                if g.dtype.is_floating  # PRECODE's noise seed is an integer pair
            ]
        )
        if replicas > 1:
            bad = tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, bad)
        # The optimizer sums replicas' gradients; scaling by 1/replicas makes that the mean.
        return [g / replicas for g in grads], state, bad, loss, norm

    def _replica_apply(self, grads: list[tf.Tensor]) -> None:
        self.optimizer.apply_gradients(zip(grads, self.model.trainable_variables, strict=True))


@dataclasses.dataclass(frozen=True)
class TrainingReport:
    """The outcome of training under one defense at one learning rate.

    Attributes:
        steps: Train steps run (skipped ones included).
        skipped_steps: Steps whose defended gradient was non-finite (no update made).
        traces: Times the step function was traced (1 when nothing retraced).
        seconds_per_step: Mean wall time per step, the first (tracing) step excluded.
        final_loss: Training loss of the last step.
        epsilon: The defense's (epsilon, `delta`)-DP guarantee for this training, or None.
        delta: The delta of ``epsilon``.
    """

    steps: int
    skipped_steps: int
    traces: int
    seconds_per_step: float
    final_loss: float
    epsilon: float | None
    delta: float


def evaluate(model: keras.Model, images: np.ndarray, labels: np.ndarray) -> float:
    """Top-1 accuracy of ``model`` on a split (inference mode, batches of 256); NaN for an
    empty split."""
    if len(images) == 0:
        return float("nan")
    hits = 0
    for start in range(0, len(images), 256):
        logits = model(tf.constant(images[start : start + 256]), training=False)
        hits += int(np.sum(np.argmax(np.asarray(logits), axis=1) == labels[start : start + 256]))
    return hits / len(images)


def split_validation(
    train: tuple[np.ndarray, np.ndarray], share: float
) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The training split cut into (what the model trains on, the validation split): the
    validation examples are `leakbench.core.seeds.validation_indices`, the rest keeps its order."""
    x, y = train
    held = validation_indices(len(x), share)
    rest = np.setdiff1d(np.arange(len(x)), held)
    return (x[rest], y[rest]), (x[held], y[held])


def train_steps(
    model: keras.Model,
    steps: int,
    config: TrainingConfig,
    train: tuple[np.ndarray, np.ndarray],
    *,
    num_classes: int,
    seed: int,
) -> None:
    """Trains ``model`` in place for ``steps`` steps without a defense: the model state that an
    attack after some federated rounds sees. Batches come from a seeded shuffle of the whole
    training split, as in `train_under_defense` (same seed, same batches), at the first
    learning rate of ``config`` (`TrainingConfig.pretraining`)."""
    x_train, y_train = train
    n = len(x_train)
    recipe = config.default
    recipe.check_fits(n)
    trainer = DefendedTrainer(
        model, NoDefense(), config.make_optimizer(), num_classes=num_classes, seed=seed
    )
    rng = np.random.default_rng(seed)
    per_epoch = n // recipe.batch_size
    order = rng.permutation(n)
    for step in range(steps):
        b = step % per_epoch
        if step and b == 0:
            order = rng.permutation(n)
        idx = order[b * recipe.batch_size : (b + 1) * recipe.batch_size]
        trainer.step(tf.constant(x_train[idx]), tf.constant(y_train[idx]))


def train_under_defense(
    model: keras.Model,
    defense: Defense,
    recipe: Recipe,
    learning_rate: float,
    train: tuple[np.ndarray, np.ndarray],
    *,
    num_classes: int,
    seed: int,
    delta: float = 1e-5,
) -> TrainingReport:
    """Trains ``model`` in place under ``defense`` with ``recipe`` at ``learning_rate`` and
    reports the cost (`run_epochs`). It sees only ``train``: accuracy is the caller's."""
    trainer = DefendedTrainer(
        model, defense, recipe.make_optimizer(learning_rate), num_classes=num_classes, seed=seed
    )
    return run_epochs(trainer, recipe, train, seed=seed, delta=delta)


def run_epochs(
    trainer: DefendedTrainer,
    recipe: Recipe,
    train: tuple[np.ndarray, np.ndarray],
    *,
    seed: int,
    delta: float,
) -> TrainingReport:
    """Runs ``recipe.epochs`` epochs of ``trainer`` on ``train`` and reports the cost.

    Batches are drawn by shuffling the training split each epoch with a generator seeded by
    ``seed`` (the same order for every defense and rate); the last incomplete batch is dropped.
    """
    x_train, y_train = train
    n = len(x_train)
    recipe.check_fits(n)
    rng = np.random.default_rng(seed)
    per_epoch = n // recipe.batch_size
    result: StepResult | None = None
    start = None
    for _ in range(recipe.epochs):
        order = rng.permutation(n)
        for b in range(per_epoch):
            idx = order[b * recipe.batch_size : (b + 1) * recipe.batch_size]
            result = trainer.step(tf.constant(x_train[idx]), tf.constant(y_train[idx]))
            if start is None:
                start = time.perf_counter()  # after the first step, which may trace
    steps = int(trainer.step_count.numpy())
    elapsed = time.perf_counter() - start if start is not None else 0.0
    epsilon = trainer.defense.epsilon(recipe.batch_size / n, steps, delta)
    return TrainingReport(
        steps=steps,
        skipped_steps=int(trainer.skipped_steps.numpy()),
        traces=trainer.traces,
        seconds_per_step=elapsed / max(steps - 1, 1),
        final_loss=float(result.loss) if result is not None else float("nan"),
        epsilon=None if epsilon is None else float(epsilon),
        delta=delta,
    )
