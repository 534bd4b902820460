"""Training a text model under a defense, and what it costs: perplexity on held-out sentences.

The text client's counterpart of `leakbench.client.training`. Each step is one FedSGD round of one
client: the defended update of its batch (`leakbench.client.update.defended_step` of the text
modality, the very update an attacker observes) applied by the optimizer (Adam or SGD). The step is
one ``tf.function`` traced once (`TextTrainer.traces`): the defense's draw of step ``t`` is the
stateless key `leakbench.core.seeds.training_draw` of the trainer's seed and ``t``, both variables,
so no step builds new ops. A step whose defended update holds a NaN or infinity is skipped (weights
and optimizer untouched; ``skipped_steps`` counts it).

Batches are the image trainer's (`leakbench.client.training.shuffled_batches`, `poisson_batches`): a
defense without an accountant trains on shuffled fixed-size batches of the training rows (the last
incomplete batch of an epoch dropped); one with an accountant
(`leakbench.client.training.accounted`: ``dpsgd``, a chain holding it) trains as its accountant
assumes, each row in each step's batch independently with probability ``q = batch_size / n``, the
release normalised by the expected batch size (`leakbench.client.update.sampled_step`; one trace
serves every batch size, 0 included), and ``epsilon`` is its accountant's for those steps.

Utility (`text_utility`): on held-out rows, the **perplexity** ``exp(mean next-token
cross-entropy)`` over every counted position (a target that is not ``<pad>``, as the client's loss
counts them; ``<eos>`` included, ``<unk>`` a token like any other) and the **next-token accuracy**,
the share of those positions whose most likely token is the target. A model that ignores context can
do no better than the unigram distribution of the targets, whose perplexity `unigram_perplexity`
computes by hand; the tests train below it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

import keras
import numpy as np
import tensorflow as tf

from leakbench.client.training import accounted, poisson_batches, shuffled_batches
from leakbench.client.update import defended_step, sampled_step
from leakbench.components.text_models import EMBEDDING, build_text_model
from leakbench.core.errors import ConfigError
from leakbench.core.seeds import poisson_generator, sampled_draw, training_client, training_draw
from leakbench.datasets.text_base import PAD, check_sequence_length
from leakbench.defenses import Defense
from leakbench.modalities.text import TEXT, check_text_defense, masked_loss

OPTIMIZERS = ("adam", "sgd")


class TextTrainer:
    """Trains ``model`` in place with its text client's defended updates (the module's rule).

    ``step(ids)`` runs one step on a fixed-size batch; ``sampled_step(ids, expected_size)`` one
    on a Poisson-sampled batch of any size (DP training). Each is one ``tf.function``, traced
    on its first call.
    """

    def __init__(
        self,
        model: keras.Model,
        defense: Defense,
        optimizer: keras.optimizers.Optimizer,
        *,
        seed: int,
        run: int = 0,
    ) -> None:
        check_text_defense(defense)
        self.model = model
        self.defense = defense
        self.optimizer = optimizer
        optimizer.build(model.trainable_variables)
        counter = {"dtype": tf.int64, "trainable": False}
        self.seed = tf.Variable(seed, name="seed", **counter)
        self.run = tf.Variable(run, name="run", **counter)
        self.step_count = tf.Variable(0, name="steps", **counter)
        self.skipped_steps = tf.Variable(0, name="skipped_steps", **counter)
        self.traces = 0
        # Compiled on their first call, when the rows' length is known.
        self._fixed: Callable[..., tuple[tf.Tensor, tf.Tensor]] | None = None
        self._sampled: Callable[..., tuple[tf.Tensor, tf.Tensor]] | None = None

    def step(self, ids: np.ndarray | tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """One step on a batch of rows ``[B, L]``: (its undefended loss, whether it was
        skipped). Traced once for batches of this shape."""
        ids = tf.convert_to_tensor(ids, tf.int32)
        if self._fixed is None:
            self._fixed = tf.function(
                self._step, input_signature=[tf.TensorSpec(ids.shape, tf.int32)]
            )
        return self._fixed(ids)

    def sampled_step(
        self, ids: np.ndarray | tf.Tensor, expected_size: int
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """One step on a Poisson-sampled batch ``[B, L]`` of any size B (0 included; the loss is
        then NaN), the release normalised by ``expected_size``. One trace for every B."""
        ids = tf.convert_to_tensor(ids, tf.int32)
        if self._sampled is None:
            signature = [tf.TensorSpec([None, ids.shape[1]], tf.int32), tf.TensorSpec([], tf.int64)]
            self._sampled = tf.function(self._step, input_signature=signature)
        return self._sampled(ids, tf.constant(expected_size, tf.int64))

    def _step(
        self, ids: tf.Tensor, expected_size: tf.Tensor | None = None
    ) -> tuple[tf.Tensor, tf.Tensor]:
        self.traces += 1  # a Python side effect: runs once per trace, never per step
        key = training_draw(training_client(self.seed), self.step_count.read_value())
        if expected_size is None:
            loss, grads, _ = defended_step(self.defense, self.model, ids, ids, key, None, TEXT)
        else:
            key = sampled_draw(key, self.run.read_value())
            loss, grads, _ = sampled_step(
                self.defense, self.model, ids, ids, key, expected_size, TEXT
            )
        bad = tf.add_n([tf.reduce_sum(tf.cast(~tf.math.is_finite(g), tf.int64)) for g in grads])
        variables = self.model.trainable_variables

        def apply() -> tf.Tensor:
            self.optimizer.apply_gradients(zip(grads, variables, strict=True))
            return tf.constant(False)

        skipped = tf.cond(tf.equal(bad, 0), apply, lambda: tf.constant(True))
        self.skipped_steps.assign_add(tf.cast(skipped, tf.int64))
        self.step_count.assign_add(1)
        return tf.cast(loss, tf.float32), skipped


def make_optimizer(name: str, learning_rate: float) -> keras.optimizers.Optimizer:
    """``adam`` or ``sgd`` at ``learning_rate``.

    Raises:
        ConfigError: For another name or a learning rate that is not a positive number.
    """
    if name not in OPTIMIZERS:
        raise ConfigError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")
    if not isinstance(learning_rate, (int, float)) or not 0.0 < learning_rate < math.inf:
        raise ConfigError(f"learning_rate must be a number in (0, inf), got {learning_rate!r}")
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate)
    return keras.optimizers.Adam(learning_rate)


def text_batches(
    trainer: TextTrainer, n: int, *, epochs: int, batch_size: int, seed: int
) -> Iterator[tuple[np.ndarray, bool]]:
    """The row indices of each step, and whether the batch is Poisson-sampled (the module's
    rule): ``epochs * (n // batch_size)`` steps either way."""
    if accounted(trainer.defense):
        steps = epochs * (n // batch_size)
        generator = poisson_generator(seed, int(trainer.run.numpy()))
        for idx in poisson_batches(generator, n, batch_size / n, steps):
            yield idx, True
    else:
        for idx in shuffled_batches(np.random.default_rng(seed), n, batch_size, epochs):
            yield idx, False


def fit_text(
    trainer: TextTrainer,
    train_ids: np.ndarray,
    *,
    epochs: int,
    batch_size: int,
    seed: int,
    delta: float = 1e-5,
) -> dict[str, object]:
    """Trains ``trainer``'s model on the rows ``train_ids`` [n, L] (the module's batches) and
    reports the run: ``steps``, ``skipped_steps``, ``traces``, ``seconds_per_step`` (the first,
    tracing step excluded), ``final_loss`` (the last step's; NaN for an empty Poisson batch),
    ``epsilon`` (the accountant's at rate ``batch_size / n``, or None) and ``delta``."""
    train_ids = np.asarray(train_ids, np.int32)
    n = len(train_ids)
    loss, start = float("nan"), None
    for idx, sampled in text_batches(trainer, n, epochs=epochs, batch_size=batch_size, seed=seed):
        if sampled:
            result = trainer.sampled_step(train_ids[idx], batch_size)
        else:
            result = trainer.step(train_ids[idx])
        loss = float(result[0])
        if start is None:
            start = time.perf_counter()
    steps = int(trainer.step_count.numpy())
    elapsed = time.perf_counter() - start if start is not None else 0.0
    epsilon = trainer.defense.epsilon(batch_size / n, steps, delta)
    return {
        "steps": steps,
        "skipped_steps": int(trainer.skipped_steps.numpy()),
        "traces": trainer.traces,
        "seconds_per_step": elapsed / max(steps - 1, 1),
        "final_loss": loss,
        "epsilon": None if epsilon is None else float(epsilon),
        "delta": delta,
    }


def text_utility(model: keras.Model, ids: np.ndarray, batch_size: int = 256) -> dict[str, float]:
    """``perplexity`` and ``next_token_accuracy`` of ``model`` on the rows ``ids`` [N, L] (the
    module's rule), with ``positions``, the counted positions; NaN scores when none is
    counted."""
    ids = np.asarray(ids, np.int32)
    total = hits = count = 0.0
    for start in range(0, len(ids), batch_size):
        batch = tf.constant(ids[start : start + batch_size])
        logits = model(batch[:, :-1], training=False)
        targets = batch[:, 1:]
        counted = tf.cast(tf.not_equal(targets, PAD), tf.float64)
        positions = float(tf.reduce_sum(counted))
        total += float(masked_loss(logits, targets)) * positions
        right = tf.equal(tf.argmax(logits, -1, output_type=tf.int32), targets)
        hits += float(tf.reduce_sum(tf.cast(right, tf.float64) * counted))
        count += positions
    if count == 0:
        return {"perplexity": math.nan, "next_token_accuracy": math.nan, "positions": 0}
    return {
        "perplexity": math.exp(total / count),
        "next_token_accuracy": hits / count,
        "positions": int(count),
    }


def unigram_perplexity(train_ids: np.ndarray, ids: np.ndarray | None = None) -> float:
    """The perplexity of the unigram distribution of ``train_ids``' counted targets (each
    token's share of them) on the counted targets of ``ids`` (default: ``train_ids``
    themselves, the distribution's own ``exp(entropy)``); infinite if ``ids`` holds a target
    that ``train_ids`` never does. What a model that ignores the context can reach."""
    train = np.asarray(train_ids)[:, 1:]
    targets = train[train != PAD]
    tokens, counts = np.unique(targets, return_counts=True)
    share = dict(zip(tokens.tolist(), (counts / counts.sum()).tolist(), strict=True))
    scored = train if ids is None else np.asarray(ids)[:, 1:]
    seen = scored[scored != PAD]
    if any(t not in share for t in seen.tolist()):
        return math.inf
    return math.exp(-float(np.mean([math.log(share[t]) for t in seen.tolist()])))


def check_training(
    train_ids: np.ndarray, vocabulary_size: int, *, epochs: int, batch_size: int
) -> np.ndarray:
    """The training rows as int32 [n, L], or a one-line `ConfigError` naming the field: epochs
    and batch_size integers of at least 1, a batch no larger than the rows, every id below
    ``vocabulary_size``."""
    rows = np.asarray(train_ids, np.int32)
    for field, value in (("epochs", epochs), ("batch_size", batch_size)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ConfigError(f"{field} must be an integer >= 1, got {value!r}")
    if rows.ndim != 2 or len(rows) < batch_size:
        raise ConfigError(
            f"batch_size must be at most the training rows ({len(rows)}), got {batch_size}"
        )
    check_sequence_length(rows.shape[1])
    if rows.size and (rows.min() < 0 or rows.max() >= vocabulary_size):
        raise ConfigError(
            f"train_ids hold ids in [{rows.min()}, {rows.max()}], beyond vocabulary_size "
            f"{vocabulary_size}"
        )
    return rows


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
    ``train_ids`` [n, L] under ``defense`` (`fit_text`) and scores it on the held-out rows
    ``test_ids`` (`text_utility`). With ``freeze_embeddings`` the input embedding keeps its
    seeded values: it is not trained, and no update carries its gradient.

    Returns:
        `fit_text`'s report, with ``perplexity``, ``next_token_accuracy`` and ``positions`` of
        the trained model on ``test_ids``, and ``initial_perplexity`` and
        ``initial_next_token_accuracy`` of the untrained one.

    Raises:
        ConfigError: For a bad setting (`check_training`, `make_optimizer`, the model's
            builder) or a defense that cannot act on text
            (`leakbench.modalities.text.check_text_defense`).
    """
    rows = check_training(train_ids, vocabulary_size, epochs=epochs, batch_size=batch_size)
    model = build_text_model(
        model_name, vocabulary_size, sequence_length, seed, tie_embeddings=tie_embeddings
    )
    if freeze_embeddings:
        model.get_layer(EMBEDDING).trainable = False
    trainer = TextTrainer(model, defense, make_optimizer(optimizer, learning_rate), seed=seed)
    before = text_utility(model, test_ids)
    report = fit_text(trainer, rows, epochs=epochs, batch_size=batch_size, seed=seed, delta=delta)
    after = text_utility(model, test_ids)
    return {
        **report,
        **after,
        "initial_perplexity": before["perplexity"],
        "initial_next_token_accuracy": before["next_token_accuracy"],
    }
