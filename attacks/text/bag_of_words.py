"""Bag of words: the set of tokens a text batch holds, read from its gradient.

An embedding lookup ``E[id]`` passes gradient only to the rows of the ids it looked up, so the
rows of the input embedding's (dense) gradient that are not zero are the batch's tokens. The
observation is Melis et al.'s ("Exploiting Unintended Feature Leakage in Collaborative
Learning", IEEE S&P 2019: the embedding gradient reveals which words a client's batch used);
FILM (Gupta et al., "Recovering Private Text in Federated Learning of Language Models", NeurIPS
2022) starts from this bag of words before it orders the words into sentences.

It is exact when the input embedding is untied and trainable: a row is non-zero if and only if
its token is an input the loss reads (barring an exact cancellation of floating-point sums).
With tied embeddings the output layer ``h @ E^T`` sends gradient to every row through the
softmax, and the rule returns the whole vocabulary (docs/text.md shows both). There, and when
the embedding is frozen, the output bias tells the targets instead (`target_tokens`): the
cross-entropy's gradient in the logits is ``softmax - onehot(target)`` per counted position, so
the bias's gradient is negative exactly where a token was a target often enough to outweigh the
probability the model gave it (at initialisation, about 1/V per position: every target).

`BagOfWords` is the registered text attack (``bag_of_words``); `bag_of_words` and `target_tokens`
are the plain functions it reads the bag with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import ClassVar

import keras
import numpy as np
import tensorflow as tf

from leakbench.attacks.base import ATTACKS, RETRIES
from leakbench.attacks.text.base import TextAttack, TextResult, TextTarget
from leakbench.components.text_models import embedding_index
from leakbench.core.errors import ConfigError
from leakbench.core.params import Choice, Number, param
from leakbench.datasets.text_base import BOS, EOS, PAD

# The ids no sentence spells as a word: padding and the sentence marks (the attacker knows that
# every sequence opens with <bos> and a whole one ends with <eos>).
MARKS = (PAD, BOS, EOS)
# The output layers whose bias `target_tokens` reads: the untied head, the tied one.
HEADS = ("head", "tied_head")


def bag_of_words(
    model: keras.Model, gradients: Sequence[tf.Tensor], *, tolerance: float = 0.0
) -> np.ndarray:
    """The sorted token ids whose row of the input-embedding gradient has an entry above
    ``tolerance`` in absolute value (0: any non-zero entry).

    Args:
        model: The text model the gradient is of (the server's own; it names the embedding).
        gradients: The shared dense gradient, ordered like ``model.trainable_variables``.
        tolerance: The largest absolute entry a row may have and still count as empty.
    """
    return np.sort(_embedding_rows(model, gradients, tolerance)[0])


def _embedding_rows(
    model: keras.Model, gradients: Sequence[tf.Tensor], tolerance: float
) -> tuple[np.ndarray, np.ndarray]:
    """The ids of the non-empty embedding-gradient rows and their L2 norms."""
    grad = gradients[embedding_index(model)]
    if isinstance(grad, tf.IndexedSlices):
        raise TypeError("the embedding gradient is tf.IndexedSlices; the wire is dense")
    table = np.asarray(grad)
    found = np.flatnonzero(np.max(np.abs(table), axis=1) > float(tolerance))
    return found, np.linalg.norm(table[found], axis=1)


def bias_index(model: keras.Model) -> int:
    """The position of the output layer's bias in ``model.trainable_variables``.

    Raises:
        ConfigError: If the model has no trainable output bias (a layer ``head`` or
            ``tied_head`` with a ``bias``).
    """
    for name in HEADS:
        try:
            bias = getattr(model.get_layer(name), "bias", None)
        except ValueError:
            continue
        for i, var in enumerate(model.trainable_variables):
            if bias is not None and var is bias:
                return i
    raise ConfigError(f"model {model.name}: no trainable output bias (a layer {HEADS[0]!r})")


def target_tokens(
    model: keras.Model, gradients: Sequence[tf.Tensor], *, tolerance: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """The ids whose output-bias gradient is below ``-tolerance`` (the batch's targets, see the
    module), and how far below (the evidence, larger for a token that was a target more often)."""
    grad = np.asarray(gradients[bias_index(model)])
    found = np.flatnonzero(grad < -float(tolerance))
    return found, -grad[found]


def bag_scores(recovered: Iterable[int], truth: Iterable[int]) -> tuple[float, float]:
    """Precision and recall of a recovered token set against the true one (each 1.0 for an
    empty set with nothing to find or nothing claimed)."""
    found, true = {int(i) for i in recovered}, {int(i) for i in truth}
    hits = len(found & true)
    precision = hits / len(found) if found else 1.0
    recall = hits / len(true) if true else 1.0
    return precision, recall


def embedding_trained(model: keras.Model) -> bool:
    """Whether the input embedding is trainable, so that the update carries its gradient."""
    try:
        embedding_index(model)
    except ConfigError:
        return False
    return True


def _embedding_readable(model: keras.Model) -> bool:
    """Whether the input embedding is trainable and untied (its gradient rows are the inputs)."""
    return embedding_trained(model) and not any(layer.name == "tied_head" for layer in model.layers)


def deal_rows(
    tokens: Sequence[int] | np.ndarray, batch_size: int, sequence_length: int
) -> np.ndarray:
    """The bag as ids [B, L]: ``tokens`` (strongest evidence first) dealt in turn to the B rows
    (token k to row k mod B), each row ``<bos>``, its tokens, ``<eos>``, cut to L and padded.
    A bag has no order: the rows are a stated layout for the sentence metrics, so that ROUGE-1
    measures the words found and ROUGE-2 and exact recovery measure nothing the bag claims."""
    rows = np.full((batch_size, sequence_length), PAD, np.int32)
    for r in range(batch_size):
        row = [BOS, *(int(t) for t in tokens[r::batch_size]), EOS][:sequence_length]
        rows[r, : len(row)] = row
    return rows


@ATTACKS.register("bag_of_words")
@dataclasses.dataclass(frozen=True)
class BagOfWords(TextAttack):
    """The batch's words from the gradient, without order (Melis et al. 2019; FILM, 2022).

    ``source = "auto"`` reads the input embedding's non-zero rows where it is trainable and
    untied (exact), and the output bias's negative entries otherwise (tied or frozen
    embeddings: the targets, `target_tokens`). The words found are dealt into B rows by
    `deal_rows`, strongest evidence first (a row's norm, or the bias entry's size)."""

    name: ClassVar[str] = "bag_of_words"
    has_loss: ClassVar[bool] = False  # its loss is NaN: it matches nothing

    retries: int = param(0, RETRIES, doc="fresh starts (it draws nothing)", keyed_when_set=True)
    source: str = param(
        "auto",
        Choice("auto", "embedding", "bias"),
        doc="where the bag is read: auto (the embedding when it is trainable and untied, "
        "else the output bias), embedding or bias",
    )
    tolerance: float = param(
        0.0, Number(0.0, None), doc="the largest gradient entry that still counts as empty"
    )

    def check_model(self, model: keras.Model) -> None:
        if self.source == "embedding":
            embedding_index(model)
        elif self.source == "bias" or not _embedding_readable(model):
            bias_index(model)

    def bag(self, target: TextTarget) -> tuple[np.ndarray, np.ndarray]:
        """The words found (marks left out) and their evidence, strongest first."""
        use_embedding = self.source == "embedding" or (
            self.source == "auto" and _embedding_readable(target.model)
        )
        read = _embedding_rows if use_embedding else _targets
        found, evidence = read(target.model, target.gradients, self.tolerance)
        words = ~np.isin(found, MARKS)
        found, evidence = found[words], evidence[words]
        order = np.argsort(-evidence, kind="stable")
        return found[order], evidence[order]

    def run(self, target: TextTarget, seed: tf.Tensor) -> TextResult:
        del seed  # nothing is drawn
        found, _ = self.bag(target)
        ids = deal_rows(found, target.batch_size, target.sequence_length)
        return TextResult(
            ids=ids,
            loss=float("nan"),
            stop_reason="exact",
            iterations_used=1,
            budget=1,
            note=f"bag of {len(found)} words",
        )


def _targets(
    model: keras.Model, gradients: Sequence[tf.Tensor], tolerance: float
) -> tuple[np.ndarray, np.ndarray]:
    return target_tokens(model, gradients, tolerance=tolerance)
