"""A network that maps a shared update to the batch behind it, trained on pairs an attacker made.

The learned attack (`leakbench.attacks.learned`) computes, on public examples, the update a
client would share under the defense, and fits this network from (update) to (examples). Its
parts, each seeded and each a plain function of its inputs:

* `CountSketch`: a fixed-size view of an update of any size. Coordinate ``i`` of the flattened
  update is added, with a sign ``s(i)``, into bucket ``h(i)`` of ``dim`` buckets (Charikar,
  Chen and Farach-Colton's count sketch, the compression of Wu et al.), so the memory of a
  pair does not grow with the model. An update no larger than ``dim`` is kept whole.
* `fit`: a two-hidden-layer ReLU network (Wu et al.'s MLP) from the standardised sketch to
  the batch's pixels (a sigmoid, so in [0, 1]) and labels (a softmax per example), trained
  with Adam on mean squared error plus `LABEL_WEIGHT` times the labels' cross-entropy. For a
  batch of B > 1 examples the loss takes the best of the B! orders of the prediction
  (exact for the B <= `MAX_BATCH` it accepts, where Wu et al. solve an assignment), so the
  network need not guess the client's order. A share of the pairs is held out and the
  weights of the epoch with the lowest held-out loss are kept.

Reference: Wu, Chen, Guo and Weinberger, "Learning to Invert: Simple Adaptive Attacks for
Gradient Inversion in Federated Learning", UAI 2023.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import tensorflow as tf

# The largest batch `fit` orders exactly (4! = 24 orders per pair).
MAX_BATCH = 4
# Weight of the labels' cross-entropy beside the pixels' mean squared error.
LABEL_WEIGHT = 0.1
# Standard deviations below this are treated as this (a coordinate the defense zeroes).
_STD_FLOOR = 1e-12
_BETA1, _BETA2, _EPS = 0.9, 0.999, 1e-8


@dataclasses.dataclass(frozen=True)
class CountSketch:
    """A seeded count sketch of updates of ``size`` coordinates into ``dim`` buckets (the
    identity when ``size <= dim``)."""

    size: int
    dim: int
    seed: int

    @property
    def width(self) -> int:
        """The length of a sketched update."""
        return min(self.size, self.dim)

    def __call__(self, updates: Sequence[tf.Tensor]) -> np.ndarray:
        """The sketch of one update (its tensors in order), float32 of length `width`."""
        flat = tf.concat([tf.reshape(tf.cast(u, tf.float32), [-1]) for u in updates], 0)
        if int(flat.shape[0]) != self.size:
            raise ValueError(f"an update of {flat.shape[0]} values; the sketch takes {self.size}")
        if self.size <= self.dim:
            return flat.numpy()
        buckets, signs = self._hash()
        return tf.math.unsorted_segment_sum(flat * signs, buckets, self.dim).numpy()

    def _hash(self) -> tuple[tf.Tensor, tf.Tensor]:
        rng = np.random.default_rng([self.seed, self.size, self.dim])
        buckets = rng.integers(0, self.dim, self.size)
        signs = rng.choice(np.array([-1.0, 1.0], np.float32), self.size)
        return tf.constant(buckets, tf.int32), tf.constant(signs)


@dataclasses.dataclass(frozen=True)
class Budget:
    """How an inverter is trained.

    Attributes:
        hidden: Width of each of the two hidden layers.
        epochs: Passes over the training pairs.
        lr: Adam's learning rate (divided by 10 for the last quarter of the epochs).
        batch: Pairs per Adam step.
        held_out: Share of the pairs held out to choose the epoch kept.
    """

    hidden: int
    epochs: int
    lr: float
    batch: int
    held_out: float = 0.1


@dataclasses.dataclass
class Inverter:
    """A trained inverter: its weights, the features' standardisation, and its record.

    Attributes:
        weights: The network's weights and biases, in layer order (numpy float32).
        mean: The training features' per-coordinate mean.
        std: Their standard deviation (floored).
        batch: Examples per update (B).
        pixels: Values per example.
        classes: Classes.
        history: Held-out loss after each epoch.
    """

    weights: list[np.ndarray]
    mean: np.ndarray
    std: np.ndarray
    batch: int
    pixels: int
    classes: int
    history: np.ndarray

    def predict(self, features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Images ``[N, B, pixels]`` in [0, 1] and labels ``[N, B]`` of sketched updates
        ``[N, width]``."""
        x = (np.asarray(features, np.float32) - self.mean) / self.std
        images, logits = _forward([tf.constant(w) for w in self.weights], tf.constant(x),
                                  self.batch, self.pixels, self.classes)  # fmt: skip
        return images.numpy(), np.argmax(logits.numpy(), axis=-1).astype(np.int64)

    def arrays(self) -> dict[str, np.ndarray]:
        """The inverter as named arrays (what `from_arrays` reads back)."""
        out = {f"w{i}": w for i, w in enumerate(self.weights)}
        shape = np.array([self.batch, self.pixels, self.classes], np.int64)
        return {**out, "mean": self.mean, "std": self.std, "shape": shape,
                "history": self.history}  # fmt: skip

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> Inverter:
        """The inverter `arrays` wrote."""
        count = sum(1 for k in arrays if k.startswith("w"))
        batch, pixels, classes = (int(v) for v in arrays["shape"])
        return cls([np.asarray(arrays[f"w{i}"], np.float32) for i in range(count)],
                   np.asarray(arrays["mean"], np.float32), np.asarray(arrays["std"], np.float32),
                   batch, pixels, classes, np.asarray(arrays["history"], np.float32))  # fmt: skip


def _forward(
    weights: list[tf.Tensor], x: tf.Tensor, batch: int, pixels: int, classes: int
) -> tuple[tf.Tensor, tf.Tensor]:
    w1, b1, w2, b2, wi, bi, wl, bl = weights
    h = tf.nn.relu(tf.nn.relu(x @ w1 + b1) @ w2 + b2)
    images = tf.sigmoid(tf.reshape(h @ wi + bi, [-1, batch, pixels]))
    logits = tf.reshape(h @ wl + bl, [-1, batch, classes])
    return images, logits


def _initial(width: int, hidden: int, outputs: tuple[int, int], seed: int) -> list[tf.Variable]:
    """He-uniform weights and zero biases, drawn from ``seed``."""
    shapes = [(width, hidden), (hidden, hidden), (hidden, outputs[0]), (hidden, outputs[1])]
    out = []
    for k, (fan_in, fan_out) in enumerate(shapes):
        limit = float(np.sqrt(6.0 / fan_in))
        w = tf.random.stateless_uniform([fan_in, fan_out], [seed, k], -limit, limit)
        out += [tf.Variable(w), tf.Variable(tf.zeros([fan_out]))]
    return out


def _orders(batch: int) -> tf.Tensor:
    return tf.constant(list(itertools.permutations(range(batch))), tf.int32)


def _loss_fn(batch: int, pixels: int, classes: int) -> Callable[..., tf.Tensor]:
    orders = _orders(batch)

    def loss(weights: list[tf.Tensor], x: tf.Tensor, images: tf.Tensor, labels: tf.Tensor):
        pred, logits = _forward(weights, x, batch, pixels, classes)
        # [N, orders, B]: each order's per-example error, prediction k matched to truth order[k]
        truth = tf.gather(images, orders, axis=1)
        mse = tf.reduce_mean(tf.square(pred[:, None] - truth), axis=-1)
        true_labels = tf.gather(labels, orders, axis=1)
        ce = tf.nn.sparse_softmax_cross_entropy_with_logits(
            true_labels,
            tf.broadcast_to(logits[:, None], tf.concat([tf.shape(true_labels), [classes]], 0)),
        )
        per_order = tf.reduce_mean(mse + LABEL_WEIGHT * ce, axis=-1)
        return tf.reduce_mean(tf.reduce_min(per_order, axis=1))

    return loss


@dataclasses.dataclass
class Progress:
    """Where `fit` is: what it needs to continue after ``epoch`` epochs, bit for bit.

    Attributes:
        epoch: Epochs done.
        weights: The current weights.
        moments: Adam's first and second moments of each weight.
        steps: Adam steps done.
        best: The weights of the epoch with the lowest held-out loss so far.
        history: Held-out loss after each epoch done.
    """

    epoch: int
    weights: list[np.ndarray]
    moments: list[np.ndarray]
    steps: int
    best: list[np.ndarray]
    history: list[float]

    def arrays(self) -> dict[str, np.ndarray]:
        """The state as named arrays (`from_arrays` reads them back)."""
        out = {"epoch": np.int64(self.epoch), "steps": np.int64(self.steps),
               "history": np.array(self.history, np.float64)}  # fmt: skip
        for name, group in (("w", self.weights), ("m", self.moments), ("b", self.best)):
            out.update({f"{name}{i}": a for i, a in enumerate(group)})
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray]) -> Progress:
        """The state `arrays` wrote."""

        def group(name: str) -> list[np.ndarray]:
            count = sum(1 for k in arrays if k[:1] == name and k[1:].isdigit())
            return [np.asarray(arrays[f"{name}{i}"]) for i in range(count)]

        return cls(int(arrays["epoch"]), group("w"), group("m"), int(arrays["steps"]),
                   group("b"), [float(v) for v in arrays["history"]])  # fmt: skip


def fit(
    features: np.ndarray,
    images: np.ndarray,
    labels: np.ndarray,
    classes: int,
    budget: Budget,
    seed: int,
    *,
    start: Progress | None = None,
    on_epoch: Callable[[Progress], None] | None = None,
) -> Inverter:
    """Trains an inverter from pairs: ``features`` [N, width] (sketched updates), ``images``
    [N, B, pixels] in [0, 1] and ``labels`` [N, B]. Deterministic in its inputs and ``seed``
    on one machine. ``on_epoch(progress)`` is called after each epoch; a fit given that
    ``start`` continues where it stopped and returns what the uninterrupted fit returns."""
    n, batch, pixels = images.shape
    if batch > MAX_BATCH:
        raise ValueError(f"an inverter takes batches of at most {MAX_BATCH}, got {batch}")
    if n < 2:
        raise ValueError(f"an inverter needs at least 2 pairs, got {n}")
    order = np.random.default_rng([seed, n]).permutation(n)
    held = order[: max(1, int(round(n * budget.held_out)))]
    train = order[len(held) :]
    mean = features[train].mean(axis=0).astype(np.float32)
    std = np.maximum(features[train].std(axis=0), _STD_FLOOR).astype(np.float32)
    x = tf.constant((features - mean) / std, tf.float32)
    y, t = tf.constant(images, tf.float32), tf.constant(labels, tf.int32)
    weights = _initial(x.shape[1], budget.hidden, (batch * pixels, batch * classes), seed)
    state = start or Progress(
        0, [w.numpy() for w in weights], [], 0, [w.numpy() for w in weights], []
    )
    for w, value in zip(weights, state.weights, strict=True):
        w.assign(value)
    moments = [(tf.constant(state.moments[2 * i]), tf.constant(state.moments[2 * i + 1]))
               for i in range(len(weights))] if state.moments else [
                   (tf.zeros_like(w), tf.zeros_like(w)) for w in weights]  # fmt: skip
    step = _adam_step(weights, _loss_fn(batch, pixels, classes))
    evaluate = tf.function(_loss_fn(batch, pixels, classes))
    held_data = (tf.gather(x, held), tf.gather(y, held), tf.gather(t, held))
    for epoch in range(state.epoch, budget.epochs):
        lr = tf.constant(budget.lr * (0.1 if epoch >= int(0.75 * budget.epochs) else 1.0))
        shuffled = np.random.default_rng([seed, n, epoch]).permutation(train)
        for k in range(0, len(shuffled), budget.batch):
            idx = tf.constant(shuffled[k : k + budget.batch])
            state.steps += 1
            moments = step(tf.gather(x, idx), tf.gather(y, idx), tf.gather(t, idx),
                           moments, tf.constant(state.steps, tf.float32), lr)  # fmt: skip
        loss = float(evaluate(weights, *held_data))
        if np.isfinite(loss) and loss < min(state.history, default=np.inf):
            state.best = [w.numpy() for w in weights]
        state.history.append(loss)
        state.epoch = epoch + 1
        state.weights = [w.numpy() for w in weights]
        state.moments = [a.numpy() for pair in moments for a in pair]
        if on_epoch is not None:
            on_epoch(state)
    history = np.array(state.history, np.float32)
    return Inverter(state.best, mean, std, batch, pixels, classes, history)


def _adam_step(weights: list[tf.Variable], loss: Callable[..., tf.Tensor]) -> Any:
    @tf.function(reduce_retracing=True)
    def step(
        x: tf.Tensor,
        images: tf.Tensor,
        labels: tf.Tensor,
        moments: list[tuple[tf.Tensor, tf.Tensor]],
        count: tf.Tensor,
        lr: tf.Tensor,
    ) -> list[tuple[tf.Tensor, tf.Tensor]]:
        with tf.GradientTape() as tape:
            value = loss(weights, x, images, labels)
        grads = tape.gradient(value, weights)
        out = []
        for w, g, (m, v) in zip(weights, grads, moments, strict=True):
            m = _BETA1 * m + (1 - _BETA1) * g
            v = _BETA2 * v + (1 - _BETA2) * tf.square(g)
            m_hat = m / (1 - _BETA1**count)
            v_hat = v / (1 - _BETA2**count)
            w.assign_sub(lr * m_hat / (tf.sqrt(v_hat) + _EPS))
            out.append((m, v))
        return out

    return step
