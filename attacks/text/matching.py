"""TAG: gradient matching on soft token distributions (the TAG / LAMP family of text attacks).

Deng et al., "TAG: Gradient Attack on Transformer-based Language Models" (EMNLP Findings 2021)
optimise dummy inputs so that their gradient matches the observed one under an L2 + alpha * L1
distance; Balunovic et al., "LAMP: Extracting Text from Gradients with Language Model Priors"
(NeurIPS 2022) match under a cosine distance, add a language-model prior, and alternate the
continuous search with discrete moves of tokens. This module is one attack, ``tag``, with
those parts as its parameters (`TAG`).

What it optimises. Logits ``Z [B, L-1, K]`` over K candidate ids at every position after the
first: position 0 is ``<bos>`` for every sequence (the client's encoding rule,
`leakbench.datasets.text_base`, which every attacker knows), so it is fixed. With ``restrict =
"bag"`` (the default) the candidates are the ids the observed gradient shows
(`candidate_ids`): the bag of words of the input embedding, the ids whose output bias
gradient is negative (the targets), and the four special ids; ``"full"`` uses the whole
vocabulary. The softmax of ``Z`` gives distributions ``P``; the model reads the expected
embeddings ``P @ E`` (`leakbench.attacks.text.forward`) and is scored against the soft
targets ``P`` of the next position. We chose the attacker's own next-position distributions
as its targets, not their argmax and not a separate label variable: the client's target is
its next input token, so one distribution per position plays both parts (as in the truth),
and the gradient reaches it through both; an argmax would cut the second path and freeze
targets that are still wrong. The gradient of that loss with respect to the model's weights
is compared with the observed gradient (`matching_distance`), and Adam moves ``Z``.

Prior and swaps. ``prior_weight`` adds the expected negative log-likelihood of the
sequences under a bigram model counted on the public pool only (`bigram_nll`, add-0.1
smoothing). ``swaps`` then runs LAMP-style discrete moves on the argmax answer: swap two
tokens, move one token, or move a span, within a sequence; a move is kept when the objective
of the one-hot answer (matching distance plus the weighted prior) decreases.

Stopping and restarts. The loop runs in chunks of ``window`` Adam steps, each a call of one
traced ``tf.function`` (the trace is made once per attack). After each chunk: the search has
converged when the matching distance of the best iterate is at most ``tolerance``; it has
stalled when the best objective improved by less than ``stall_progress`` of itself over the
chunk; otherwise it goes on until ``iterations`` (``budget``). ``restarts`` independent starts
run in turn; the answer kept is the one whose argmax has the lowest objective, a quantity the
attacker computes from what it observed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf

from leakbench.attacks.base import ATTACKS
from leakbench.attacks.engine.losses import cosine_distance
from leakbench.attacks.text.bag_of_words import bag_of_words, embedding_trained
from leakbench.attacks.text.base import TextAttack, TextResult, TextTarget
from leakbench.attacks.text.forward import (
    embedding_forward,
    embedding_table,
    soft_next_token_loss,
)
from leakbench.components.text_models import check_input_length
from leakbench.core.errors import ConfigError
from leakbench.core.params import Choice, Int, Number, param
from leakbench.datasets.text_base import BOS, EOS, PAD, UNK

SPECIALS = (PAD, UNK, BOS, EOS)
# The layers whose bias is the output bias (`leakbench.components.text_models._head`).
OUTPUT_HEADS = ("head", "tied_head")
BIGRAM_SMOOTHING = 0.1
BETA1, BETA2, ADAM_EPSILON = 0.9, 0.999, 1e-8


def output_targets(model: keras.Model, gradients: Sequence[tf.Tensor]) -> np.ndarray:
    """The ids whose output-bias gradient is negative, or an empty array without such a bias.

    The bias gradient of id v is the mean over counted positions of ``p(v) - [target = v]``:
    below zero only if v is a target somewhere (and the model gives it less probability there
    than its count), so these are target ids; every input but ``<bos>`` is also a target.
    """
    for name in OUTPUT_HEADS:
        try:
            bias = model.get_layer(name).bias
        except (ValueError, AttributeError):
            continue
        for var, grad in zip(model.trainable_variables, gradients, strict=True):
            if var is bias:
                return np.flatnonzero(np.asarray(grad) < 0.0)
    return np.zeros((0,), np.int64)


def candidate_ids(
    model: keras.Model, gradients: Sequence[tf.Tensor], vocabulary_size: int, restrict: str
) -> np.ndarray:
    """The sorted ids the attack's distributions range over (module docstring).

    With ``restrict = "bag"``: the special ids, the output-bias targets, and the input
    embedding's bag of words unless that bag is the whole vocabulary (tied embeddings) or the
    embedding is frozen (no gradient to read it from).
    """
    if restrict == "full":
        return np.arange(vocabulary_size)
    bag = bag_of_words(model, gradients) if embedding_trained(model) else np.zeros((0,), np.int64)
    if len(bag) >= vocabulary_size:
        bag = bag[:0]
    found = np.concatenate([np.asarray(SPECIALS), bag, output_targets(model, gradients)])
    return np.unique(found.astype(np.int64))


def bigram_nll(public_ids: np.ndarray, vocabulary_size: int) -> np.ndarray:
    """``-log P(b | a)`` [V, V] of a bigram model counted on the public pool's consecutive
    ids (padding included), add-`BIGRAM_SMOOTHING` smoothed."""
    ids = np.asarray(public_ids, np.int64)
    counts = np.zeros((vocabulary_size, vocabulary_size))
    if ids.size and ids.shape[1] > 1:
        np.add.at(counts, (ids[:, :-1].ravel(), ids[:, 1:].ravel()), 1.0)
    smoothed = counts + BIGRAM_SMOOTHING
    return -np.log(smoothed / smoothed.sum(axis=1, keepdims=True))


def matching_distance(
    grads: Sequence[tf.Tensor], observed: Sequence[tf.Tensor], loss: str, alpha: float
) -> tf.Tensor:
    """The distance of a dummy gradient from the observed one.

    ``"tag"``: ``||g - o||_2 / ||o||_2 + alpha * ||g - o||_1 / ||o||_1`` over all tensors at
    once (TAG's L2 + alpha * L1, each divided by the observed gradient's norm so that the
    distance does not depend on the gradient's scale and a prior weight means the same on
    every model). ``"cosine"``: one minus the cosine similarity of the two gradients, all tensors
    concatenated (LAMP's distance; per tensor, a tensor whose gradient is zero in exact
    arithmetic, such as attention's key bias, would contribute the cosine of rounding noise),
    computed as the image attacks compute it (`leakbench.attacks.engine.losses.cosine_distance`:
    precise at small angles, where ``1 - dot / norms`` is float32 rounding noise).
    """
    if loss == "cosine":
        # The image attacks' cosine distance, one problem: precise where the angle is small.
        return cosine_distance([g[None] for g in grads], [o[None] for o in observed])[0]
    diff = tf.concat([tf.reshape(g - o, [-1]) for g, o in zip(grads, observed, strict=True)], 0)
    flat = tf.concat([tf.reshape(o, [-1]) for o in observed], 0)
    l2 = tf.sqrt(tf.reduce_sum(diff * diff) + 1e-30) / (tf.norm(flat) + 1e-20)
    l1 = tf.reduce_sum(tf.abs(diff)) / (tf.reduce_sum(tf.abs(flat)) + 1e-20)
    return l2 + alpha * l1


class Problem:
    """One observed update as the attack sees it: the candidates, the model from its
    embeddings, the observed gradient and the prior, restricted to the candidates."""

    def __init__(self, attack: TAG, target: TextTarget) -> None:
        model = target.model
        self.model = model
        self.forward = embedding_forward(model)
        self.table = embedding_table(model)
        found = candidate_ids(model, target.gradients, target.vocabulary_size, attack.restrict)
        self.ids = found
        self.candidates = tf.constant(found, tf.int32)
        self.bos = int(np.flatnonzero(found == BOS)[0])
        self.shape = (target.batch_size, target.sequence_length - 1, len(found))
        self.observed = [tf.convert_to_tensor(g, tf.float32) for g in target.gradients]
        nll = bigram_nll(target.public_ids, target.vocabulary_size)[np.ix_(found, found)]
        self.nll = tf.constant(nll, tf.float32)
        self.loss, self.alpha, self.weight = attack.loss, attack.alpha, attack.prior_weight

    def probs(self, z: tf.Tensor) -> tf.Tensor:
        """``<bos>`` at position 0, then the softmax of the logits: [B, L, K]."""
        first = tf.one_hot(tf.fill([self.shape[0], 1], self.bos), self.shape[2])
        return tf.concat([first, tf.nn.softmax(z, axis=-1)], axis=1)

    def objective(self, probs: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        """The attacker's objective of distributions [B, L, K] and its matching part."""
        variables = self.model.trainable_variables
        with tf.GradientTape() as tape:
            inner = soft_next_token_loss(self.forward, self.table, probs, self.candidates)
        grads = [tf.convert_to_tensor(g) for g in tape.gradient(inner, variables)]
        match = matching_distance(grads, self.observed, self.loss, self.alpha)
        if self.weight == 0.0:
            return match, match
        steps = float(self.shape[0] * self.shape[1])
        prior = tf.einsum("btk,kj,btj->", probs[:, :-1], self.nll, probs[:, 1:]) / steps
        return match + self.weight * prior, match

    def answer_probs(self, choice: tf.Tensor) -> tf.Tensor:
        """One-hot distributions [B, L, K] of candidate indices [B, L-1] after ``<bos>``."""
        first = tf.fill([self.shape[0], 1], self.bos)
        return tf.one_hot(tf.concat([first, choice], axis=1), self.shape[2])


class Search(NamedTuple):
    """The Adam state carried between chunks (tensors) and the best iterate seen."""

    z: tf.Tensor
    m: tf.Tensor
    v: tf.Tensor
    t: tf.Tensor
    best_z: tf.Tensor
    best_loss: tf.Tensor
    best_match: tf.Tensor


def adam_chunk(problem: Problem, lr: float) -> Callable[[Search, tf.Tensor], Search]:
    """A traced function running ``steps`` Adam steps on the objective (Kingma & Ba, 2015),
    keeping the iterate with the lowest finite objective; one trace serves every chunk."""

    @tf.function(reduce_retracing=True)
    def chunk(state: Search, steps: tf.Tensor) -> Search:
        z, m, v, t, best_z, best_loss, best_match = state
        for _ in tf.range(steps):
            with tf.GradientTape() as tape:
                tape.watch(z)
                total, match = problem.objective(problem.probs(z))
            grad = tape.gradient(total, z)
            better = tf.math.is_finite(total) & (total < best_loss)
            best_z = tf.where(better, z, best_z)
            best_loss = tf.where(better, total, best_loss)
            best_match = tf.where(better, match, best_match)
            grad = tf.where(tf.math.is_finite(grad), grad, tf.zeros_like(grad))
            t = t + 1.0
            m = BETA1 * m + (1.0 - BETA1) * grad
            v = BETA2 * v + (1.0 - BETA2) * grad * grad
            step = (m / (1.0 - BETA1**t)) / (tf.sqrt(v / (1.0 - BETA2**t)) + ADAM_EPSILON)
            z = z - lr * step
        return Search(z, m, v, t, best_z, best_loss, best_match)

    return chunk


Evaluate = Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]


def answer_loss(problem: Problem) -> Evaluate:
    """A traced function: the objective of a discrete answer (candidate indices [B, L-1])
    and its matching part."""

    @tf.function(reduce_retracing=True)
    def loss(choice: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return problem.objective(problem.answer_probs(choice))

    return loss


class Answer(NamedTuple):
    """One start's answer: its objective, candidate indices [B, L-1], why it stopped, steps."""

    loss: float
    choice: np.ndarray
    reason: str
    steps: int


def propose(choice: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One LAMP-style move on candidate indices [B, T]: in one sequence, swap two tokens,
    move one token elsewhere, or move a span of two to four tokens elsewhere."""
    out = choice.copy()
    row, length = int(rng.integers(out.shape[0])), out.shape[1]
    tokens = list(out[row])
    kind = int(rng.integers(3))
    if kind == 0:
        i, j = rng.choice(length, size=2, replace=False)
        tokens[i], tokens[j] = tokens[j], tokens[i]
    else:
        span = 1 if kind == 1 else int(rng.integers(2, min(4, length - 1) + 1))
        start = int(rng.integers(length - span + 1))
        piece = tokens[start : start + span]
        rest = tokens[:start] + tokens[start + span :]
        where = int(rng.integers(len(rest) + 1))
        tokens = rest[:where] + piece + rest[where:]
    out[row] = tokens
    return out


@ATTACKS.register("tag")
@dataclasses.dataclass(frozen=True)
class TAG(TextAttack):
    """Gradient matching on soft token distributions (module docstring).

    Args:
        iterations: Cap on Adam steps per start.
        lr: Adam's learning rate on the logits.
        loss: ``"tag"`` (L2 + alpha * L1, each relative to the observed norm) or ``"cosine"``.
        alpha: The L1 term's weight under ``loss = "tag"``.
        restrict: ``"bag"`` (the ids the gradient shows, plus the special ids) or ``"full"``.
        restarts: Independent starts; the attacker keeps the answer of lowest objective.
        init_scale: Standard deviation of the starting logits.
        prior_weight: Weight of the public bigram prior's mean negative log-likelihood.
        swaps: Discrete moves tried on the answer after the continuous search (0: none).
        window: Adam steps between two stopping tests.
        stall_progress: The share of the best objective a window must improve it by.
        tolerance: Matching distance at or below which the search has converged.
    """

    name = "tag"

    iterations: int = param(1000, Int(1, 100000), doc="Cap on Adam steps per start.")
    lr: float = param(0.05, Number(0.0, 10.0, low_open=True), doc="Adam's learning rate.")
    loss: str = param("tag", Choice("tag", "cosine"), doc="TAG's L2 + alpha L1, or cosine.")
    alpha: float = param(0.01, Number(0.0, 100.0), doc="The L1 weight of loss = 'tag'.")
    restrict: str = param("bag", Choice("bag", "full"), doc="Candidate ids: bag or all.")
    restarts: int = param(1, Int(1, 64), doc="Independent starts, best by own objective.")
    init_scale: float = param(1.0, Number(0.0, 100.0), doc="Std of the starting logits.")
    prior_weight: float = param(0.0, Number(0.0, 100.0), doc="Weight of the bigram prior.")
    swaps: int = param(0, Int(0, 100000), doc="Discrete moves tried after the search.")
    window: int = param(100, Int(1, 100000), doc="Adam steps between stopping tests.")
    stall_progress: float = param(1e-3, Number(0.0, 1.0), doc="Least progress per window.")
    tolerance: float = param(1e-3, Number(0.0, 10.0), doc="Matching distance to converge.")

    def check_model(self, model: keras.Model) -> None:
        embedding_forward(model)

    def run(self, target: TextTarget, seed: tf.Tensor) -> TextResult:
        check_target(target)
        problem = Problem(self, target)
        chunk, evaluate = adam_chunk(problem, self.lr), answer_loss(problem)
        seed = tf.convert_to_tensor(seed, tf.int64)
        best: Answer | None = None
        used = 0
        for start in range(self.restarts):
            key = tf.random.experimental.stateless_fold_in(seed, start)
            z0 = self.init_scale * tf.random.stateless_normal(problem.shape, key)
            answer = self._search(chunk, evaluate, z0)
            used += answer.steps
            if best is None or answer.loss < best.loss or not math.isfinite(best.loss):
                best = answer
        assert best is not None
        loss, choice = best.loss, best.choice
        if self.swaps:
            rng = np.random.default_rng([int(s) % 2**63 for s in seed.numpy()])
            loss, choice = self._swap(evaluate, choice, loss, rng)
        ids = np.concatenate([np.full((choice.shape[0], 1), BOS), problem.ids[choice]], axis=1)
        note = f"{len(problem.ids)} candidate ids"
        budget = self.iterations * self.restarts + self.swaps
        return TextResult(ids.astype(np.int64), loss, best.reason, used + self.swaps, budget, note)

    def _search(
        self, chunk: Callable[[Search, tf.Tensor], Search], evaluate: Evaluate, z0: tf.Tensor
    ) -> Answer:
        """Adam from ``z0`` in windows until converged, stalled or out of budget; the answer
        is the argmax of the best iterate, with its own objective."""
        zeros, inf = tf.zeros_like(z0), tf.constant(np.inf, tf.float32)
        state = Search(z0, zeros, zeros, tf.constant(0.0), z0, inf, inf)
        used, previous, reason = 0, math.inf, "budget"
        while used < self.iterations:
            steps = min(self.window, self.iterations - used)
            state = chunk(state, tf.constant(steps, tf.int32))
            used += steps
            choice = tf.argmax(state.best_z, axis=-1, output_type=tf.int32)
            total, match = (float(x) for x in evaluate(choice))
            best = float(state.best_loss)
            if match <= self.tolerance:
                reason = "converged"
                break
            if used < self.iterations and previous - best <= self.stall_progress * abs(best):
                reason = "stalled"
                break
            previous = best
        return Answer(total, choice.numpy(), reason, used)

    def _swap(
        self,
        evaluate: Evaluate,
        choice: np.ndarray,
        loss: float,
        rng: np.random.Generator,
    ) -> tuple[float, np.ndarray]:
        """``swaps`` moves (`propose`) on the answer, each kept when the objective drops."""
        if choice.shape[1] < 2:
            return loss, choice
        for _ in range(self.swaps):
            candidate = propose(choice, rng)
            value = float(evaluate(tf.constant(candidate, tf.int32))[0])
            if value < loss:
                loss, choice = value, candidate
        return loss, choice


def check_target(target: TextTarget) -> None:
    """Raises `ConfigError` on a target the attack cannot read (one line naming the field)."""
    if target.batch_size < 1:
        raise ConfigError(f"text attack tag: batch_size must be >= 1, got {target.batch_size}")
    if target.sequence_length < 2:
        raise ConfigError(
            f"text attack tag: sequence_length must be >= 2, got {target.sequence_length}"
        )
    if len(target.gradients) != len(target.model.trainable_variables):
        raise ConfigError(
            f"text attack tag: gradients must hold {len(target.model.trainable_variables)} "
            f"tensors (the model's trainable variables), got {len(target.gradients)}"
        )
    check_input_length(target.model, target.sequence_length - 1)
