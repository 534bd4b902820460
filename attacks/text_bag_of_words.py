"""Bag of words: the set of tokens a text batch holds, read from its embedding gradient.

An embedding lookup ``E[id]`` passes gradient only to the rows of the ids it looked up, so the
rows of the input embedding's (dense) gradient that are not zero are the batch's tokens. The
observation is Melis et al.'s ("Exploiting Unintended Feature Leakage in Collaborative
Learning", IEEE S&P 2019: the embedding gradient reveals which words a client's batch used);
FILM (Gupta et al., "Recovering Private Text in Federated Learning of Language Models", NeurIPS
2022) starts from this bag of words before it orders the words into sentences.

It is exact when the input embedding is untied and trainable: a row is non-zero if and only if
its token is an input the loss reads (barring an exact cancellation of floating-point sums).
With tied embeddings the output layer ``h @ E^T`` sends gradient to every row through the
softmax, and the rule returns the whole vocabulary (docs/text.md shows both).

A plain function of this slice: not a registered `Attack`, and the run does not call it yet.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import keras
import numpy as np
import tensorflow as tf

from leakbench.components.text_models import embedding_index


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
    grad = gradients[embedding_index(model)]
    if isinstance(grad, tf.IndexedSlices):
        raise TypeError("the embedding gradient is tf.IndexedSlices; the wire is dense")
    rows = np.max(np.abs(np.asarray(grad)), axis=1)
    return np.flatnonzero(rows > float(tolerance))


def bag_scores(recovered: Iterable[int], truth: Iterable[int]) -> tuple[float, float]:
    """Precision and recall of a recovered token set against the true one (each 1.0 for an
    empty set with nothing to find or nothing claimed)."""
    found, true = {int(i) for i in recovered}, {int(i) for i in truth}
    hits = len(found & true)
    precision = hits / len(found) if found else 1.0
    recall = hits / len(true) if true else 1.0
    return precision, recall
