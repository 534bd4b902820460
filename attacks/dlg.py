"""DLG: Zhu, Liu & Han, "Deep Leakage from Gradients", NeurIPS 2019."""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from leakbench.attacks.base import ATTACKS, Attack, AttackTarget, RunOutput, check_int
from leakbench.attacks.matching import lbfgs_matcher


@ATTACKS.register("dlg")
@dataclasses.dataclass(frozen=True)
class DLG(Attack):
    """Deep Leakage from Gradients (Zhu et al., 2019).

    Optimises a dummy image batch and dummy soft labels (logits passed through a softmax)
    jointly so that their gradient matches the observed one in squared L2, with L-BFGS. The
    dummy images and label logits start from N(0, 1), as in the paper's code. When the target
    carries labels (labels-known threat model), only the images are optimised.

    Args:
        iterations: L-BFGS iterations, each with a backtracking line search (the paper's code
            runs 300 optimiser steps).
        history_size: Curvature pairs kept by L-BFGS (PyTorch's default is 100).
        restarts: Fresh random starts after an attempt whose loss became non-finite.
    """

    name = "dlg"

    iterations: int = 300
    history_size: int = 100

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int(self.name, "iterations", self.iterations, 1, 100_000)
        check_int(self.name, "history_size", self.history_size, 1, 1_000)

    def labels_for(self, target: AttackTarget) -> np.ndarray | None:
        """Labels fixed before the image search, or None to learn them jointly."""
        return target.labels

    def run(self, target: AttackTarget, seed: tf.Tensor) -> RunOutput:
        labels = self.labels_for(target)
        learn = labels is None
        batch, classes = target.batch_size, target.num_classes
        pixels = batch * int(np.prod(target.input_shape))
        size = pixels + (batch * classes if learn else 0)
        loop = lbfgs_matcher(
            target.model,
            input_shape=target.input_shape,
            batch_size=batch,
            num_classes=classes,
            learn_labels=learn,
            iterations=self.iterations,
            history_size=self.history_size,
        )
        z0 = tf.random.stateless_normal([size], seed=seed)
        onehot = tf.one_hot(np.zeros(batch) if learn else labels, classes)
        weights = tuple(v.value for v in target.model.trainable_variables)
        result = loop(z0, weights, tuple(target.gradients), onehot)
        z = result.x.numpy()
        images = z[:pixels].reshape(batch, *target.input_shape)
        if learn:
            out_labels = z[pixels:].reshape(batch, classes).argmax(axis=1)
        else:
            out_labels = np.asarray(labels)
        history = result.history.numpy()[: int(result.iterations)]
        return RunOutput(
            images=images,
            labels=out_labels.astype(np.int64),
            loss=float(result.loss),
            loss_history=history,
            evaluations=int(result.evaluations),
        )
