"""Training under a defense: what a defense costs in accuracy (images) or perplexity (text).

One trainer serves every modality (`leakbench.modalities`): a step's batch is the modality's
``(inputs, targets)`` pair (images and integer labels, one-hot encoded inside the step; a text
batch's token ids twice) and its defended update is `leakbench.client.update.defended_step` of
that modality, the very update an attacker observes.

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

A defense with a DP accountant (`leakbench.defenses.Defense.dp_event`: ``dpsgd``, or a chain
holding it) trains as its accountant assumes (`run_epochs`): on Poisson-sampled batches, each
example in each step's batch independently with probability ``q = batch_size / n``, with the
defense's release normalised by the expected batch size ``q * n`` (`DefendedTrainer.sampled_step`:
one ``tf.function`` whose batch axis is None, so batches of any size, 0 included, share one
trace). Every other defense trains on shuffled fixed-size batches.

A text model trains the same way (`train_text`: one recipe, no search) and is scored on
held-out rows by `leakbench.modalities.text.text_utility`, its perplexity and next-token accuracy.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf

from leakbench.client.recipes import Recipe, TrainingConfig, make_optimizer
from leakbench.client.update import defended_step, sampled_step
from leakbench.components.text_models import EMBEDDING, build_text_model
from leakbench.core.seeds import (
    poisson_generator,
    sampled_draw,
    training_client,
    training_draw,
    validation_indices,
)
from leakbench.defenses import Defense, NoDefense
from leakbench.modalities import IMAGE, TEXT, Modality
from leakbench.modalities.text import check_training, text_utility


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
        seed: Seed of the defense's randomness; step ``t`` uses the stateless key
            ``leakbench.core.seeds.training_draw(seed, t)``.
        num_classes: Number of classes (labels are one-hot encoded inside the step); None:
            the step's targets are given as they are (a text batch's ids).
        strategy: A ``tf.distribute`` strategy, or None for the default (single device).
        modality: What a batch is (`leakbench.modalities`); a defense that cannot act on it
            is refused here, in one line.
    """

    def __init__(
        self,
        model: keras.Model,
        defense: Defense,
        optimizer: keras.optimizers.Optimizer,
        *,
        seed: int,
        num_classes: int | None = None,
        strategy: tf.distribute.Strategy | None = None,
        modality: Modality = IMAGE,
    ) -> None:
        modality.check_defense(defense)
        self.modality = modality
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
        # The step on Poisson-sampled batches (DP training), traced on its first call.
        self._sampled: Callable[..., StepResult] | None = None

    def sampled_step(
        self, images: np.ndarray | tf.Tensor, labels: np.ndarray | tf.Tensor, expected_size: int,
        run: int = 0,
    ) -> StepResult:  # fmt: skip
        """One train step on a Poisson-sampled batch of any size, 0 included (DP training, one
        device): the defense releases `leakbench.defenses.Defense.apply_sampled`, normalised by
        ``expected_size``, and step ``t`` draws from `leakbench.core.seeds.sampled_draw` of the
        step's key and ``run`` (the search's run number; `run_epochs`). One ``tf.function``
        whose batch axis is None serves every batch size, so it is traced once."""
        images, labels = tf.convert_to_tensor(images), tf.convert_to_tensor(labels)
        if self._sampled is None:
            self._sampled = self._sampled_function(images, labels)
        return self._sampled(
            images, labels, tf.constant(expected_size, tf.int64), tf.constant(run, tf.int64)
        )

    def _sampled_function(self, images: tf.Tensor, labels: tf.Tensor) -> Callable[..., StepResult]:
        """The compiled `sampled_step` for batches shaped like ``images`` and ``labels`` but for
        their batch axis."""
        if self.strategy.num_replicas_in_sync > 1:
            # A replica's share of a Poisson sample and its own noise are not the mechanism the
            # accountant analyses.
            raise ValueError(
                "DefendedTrainer.sampled_step trains on one replica; a Poisson-sampled DP step "
                f"does not split over {self.strategy.num_replicas_in_sync} replicas"
            )
        signature = (
            tf.TensorSpec([None, *images.shape[1:]], images.dtype),
            tf.TensorSpec([None, *labels.shape[1:]], labels.dtype),
            tf.TensorSpec([], tf.int64),
            tf.TensorSpec([], tf.int64),
        )

        def step(x: tf.Tensor, y: tf.Tensor, expected: tf.Tensor, run: tf.Tensor) -> StepResult:
            return self._global_step(x, y, sampled=(expected, run))

        return tf.function(step, input_signature=signature)

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
        self,
        images: tf.Tensor,
        labels: tf.Tensor,
        step: tf.Tensor | None = None,
        sampled: tuple[tf.Tensor, tf.Tensor] | None = None,
    ) -> StepResult:
        """One train step on a global batch (``self.step`` is its compiled form).

        ``step`` numbers the step for the defense's seed; None means the step counter.
        ``sampled`` is ``(expected batch size, run)`` for a Poisson-sampled batch
        (`sampled_step`), None for a fixed-size one.
        """
        self.traces += 1  # a Python side effect: runs once per trace, never per step
        strategy = self.strategy
        if step is None:
            step = self.step_count.read_value()
        grads, state, bad, loss, norm = strategy.run(
            self._replica_gradients,
            args=(images, labels, step),
            kwargs={} if sampled is None else {"sampled": sampled},
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
        self,
        images: tf.Tensor,
        labels: tf.Tensor,
        step: tf.Tensor,
        sampled: tuple[tf.Tensor, tf.Tensor] | None = None,
    ) -> tuple[list[tf.Tensor], list[tf.Tensor], tf.Tensor, tf.Tensor, tf.Tensor]:
        """Per replica: the defended gradient of its share of the batch, scaled for the sum,
        and the moving statistics its forward pass leaves (``sampled``: see `_global_step`)."""
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
        targets = labels if self.num_classes is None else tf.one_hot(labels, self.num_classes)
        model, modality = self.model, self.modality
        if sampled is None:
            loss, grads, state = defended_step(
                self.defense, model, images, targets, seed, modality=modality
            )
        else:
            expected, run = sampled
            loss, grads, state = sampled_step(
                self.defense, model, images, targets, sampled_draw(seed, run), expected, modality
            )
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
        final_loss: Training loss of the last step (NaN if that step's Poisson-sampled batch
            was empty).
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
    learning_rate: float = 0,
) -> None:
    """Trains ``model`` in place for ``steps`` steps without a defense: the model state that an
    attack after some federated rounds sees. Batches come from a seeded shuffle of the whole
    training split, as in `train_under_defense` (same seed, same batches), at ``learning_rate``
    (0: the first of ``config``'s grid; `TrainingConfig.pretraining`)."""
    x_train, y_train = train
    n = len(x_train)
    recipe = config.default
    recipe.check_fits(n)
    trainer = DefendedTrainer(
        model,
        NoDefense(),
        config.make_optimizer(learning_rate),
        num_classes=num_classes,
        seed=seed,
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
    run: int = 0,
) -> TrainingReport:
    """Trains ``model`` in place under ``defense`` with ``recipe`` at ``learning_rate`` and
    reports the cost (`run_epochs`, ``run`` its run of a search). It sees only ``train``:
    accuracy is the caller's."""
    trainer = DefendedTrainer(
        model, defense, recipe.make_optimizer(learning_rate), num_classes=num_classes, seed=seed
    )
    return run_epochs(trainer, recipe, train, seed=seed, delta=delta, run=run)


def accounted(defense: Defense) -> bool:
    """Whether ``defense`` has a DP accountant (`leakbench.defenses.Defense.dp_event`), and so
    trains on Poisson-sampled batches (`run_epochs`)."""
    return defense.dp_event(1.0, 1) is not None


def shuffled_batches(
    rng: np.random.Generator, n: int, batch_size: int, epochs: int
) -> Iterator[np.ndarray]:
    """The indices of each step's batch for a defense without an accountant: per epoch, a
    permutation of the ``n`` examples from ``rng`` cut into ``n // batch_size`` batches of
    ``batch_size`` (the last incomplete one dropped)."""
    per_epoch = n // batch_size
    for _ in range(epochs):
        order = rng.permutation(n)
        for b in range(per_epoch):
            yield order[b * batch_size : (b + 1) * batch_size]


def poisson_batches(
    rng: np.random.Generator, n: int, rate: float, steps: int
) -> Iterator[np.ndarray]:
    """The indices of each step's batch for a defense with an accountant: in each of ``steps``
    steps, every one of the ``n`` examples is in the batch independently with probability
    ``rate`` (one uniform draw of ``rng`` per example and step), so a batch holds Binomial(n,
    rate) examples, in index order, and may be empty."""
    for _ in range(steps):
        yield np.flatnonzero(rng.random(n) < rate)


def run_epochs(
    trainer: DefendedTrainer,
    recipe: Recipe,
    train: tuple[np.ndarray, np.ndarray],
    *,
    seed: int,
    delta: float,
    run: int = 0,
) -> TrainingReport:
    """Runs ``recipe.epochs`` epochs of ``trainer`` on ``train`` and reports the cost: ``epochs
    * (n // batch_size)`` steps on the ``n`` examples.

    A defense without an accountant trains on shuffled fixed-size batches
    (`shuffled_batches`, the generator seeded by ``seed``: the same order for every such
    defense, rate and ``run``). One with an accountant (`accounted`) trains on the batches its
    accountant analyses (`poisson_batches` at rate ``q = batch_size / n``, from
    `leakbench.core.seeds.poisson_generator` of ``seed`` and ``run``), each step releasing the
    defense's noisy sum over the expected batch size ``q * n = batch_size``
    (`DefendedTrainer.sampled_step`); ``run`` numbers the runs of a learning-rate search, each
    with batches and noise of its own (`leakbench.client.selection`). ``epsilon`` is the
    accountant's for those steps at rate ``q``.
    """
    x_train, y_train = train
    n = len(x_train)
    recipe.check_fits(n)
    rate = recipe.batch_size / n

    def poisson_step(idx: np.ndarray) -> StepResult:
        return trainer.sampled_step(x_train[idx], y_train[idx], recipe.batch_size, run)

    def fixed_step(idx: np.ndarray) -> StepResult:
        return trainer.step(tf.constant(x_train[idx]), tf.constant(y_train[idx]))

    if accounted(trainer.defense):
        steps = recipe.epochs * (n // recipe.batch_size)
        batches = poisson_batches(poisson_generator(seed, run), n, rate, steps)
        step = poisson_step
    else:
        rng = np.random.default_rng(seed)
        batches = shuffled_batches(rng, n, recipe.batch_size, recipe.epochs)
        step = fixed_step
    result: StepResult | None = None
    start = None
    for idx in batches:
        result = step(idx)
        if start is None:
            start = time.perf_counter()  # after the first step, which may trace
    steps_run = int(trainer.step_count.numpy())
    elapsed = time.perf_counter() - start if start is not None else 0.0
    epsilon = trainer.defense.epsilon(rate, steps_run, delta)
    return TrainingReport(
        steps=steps_run,
        skipped_steps=int(trainer.skipped_steps.numpy()),
        traces=trainer.traces,
        seconds_per_step=elapsed / max(steps_run - 1, 1),
        final_loss=float(result.loss) if result is not None else float("nan"),
        epsilon=None if epsilon is None else float(epsilon),
        delta=delta,
    )


def train_text(
    model_name: str,
    vocabulary_size: int,
    sequence_length: int,
    train_ids: np.ndarray,
    test_ids: np.ndarray,
    defense: Defense,
    *,
    seed: int = 0,
    epochs: int = 2,
    batch_size: int = 32,
    learning_rate: float = 3e-3,
    optimizer: str = "adam",
    tie_embeddings: bool = False,
    freeze_embeddings: bool = False,
    delta: float = 1e-5,
) -> dict[str, object]:
    """Builds the text model ``model_name`` (seeded by ``seed``), trains it on the rows
    ``train_ids`` [n, L] under ``defense`` (`run_epochs` of a text `DefendedTrainer`, at the
    one ``learning_rate``) and scores it on the held-out rows ``test_ids``
    (`leakbench.modalities.text.text_utility`). With ``freeze_embeddings`` the input embedding
    keeps its seeded values: it is not trained, and no update carries its gradient.

    Returns:
        The `TrainingReport`'s fields, with ``perplexity``, ``next_token_accuracy`` and
        ``positions`` of the trained model on ``test_ids``, and ``initial_perplexity`` and
        ``initial_next_token_accuracy`` of the untrained one.

    Raises:
        ConfigError: For a bad setting (`leakbench.modalities.text.check_training`,
            `leakbench.client.recipes.make_optimizer`, the model's builder) or a defense that
            cannot act on text (`leakbench.modalities.text.check_text_defense`).
    """
    rows = check_training(train_ids, vocabulary_size, epochs=epochs, batch_size=batch_size)
    model = build_text_model(
        model_name, vocabulary_size, sequence_length, seed, tie_embeddings=tie_embeddings
    )
    if freeze_embeddings:
        model.get_layer(EMBEDDING).trainable = False
    recipe = Recipe("default", epochs, batch_size, optimizer, (learning_rate,))
    trainer = DefendedTrainer(
        model, defense, make_optimizer(optimizer, learning_rate), seed=seed, modality=TEXT
    )
    before = text_utility(model, test_ids)
    report = run_epochs(trainer, recipe, (rows, rows), seed=seed, delta=delta)
    after = text_utility(model, test_ids)
    return {
        **dataclasses.asdict(report),
        **after,
        "initial_perplexity": before["perplexity"],
        "initial_next_token_accuracy": before["next_token_accuracy"],
    }
