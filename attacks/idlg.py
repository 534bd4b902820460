"""iDLG: Zhao, Mopuri & Bilen, "iDLG: Improved Deep Leakage from Gradients", arXiv 2001.02610."""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from leakbench.attacks.base import ATTACKS, AttackTarget
from leakbench.attacks.dlg import DLG
from leakbench.errors import ConfigError


def label_from_last_layer(gradients: tuple[tf.Tensor, ...], num_classes: int) -> int:
    """The label of a single example from the sign of the last layer's weight gradient.

    With softmax cross-entropy, the gradient of the last dense kernel's column ``c`` is
    ``a * (p_c - y_c)``: for non-negative activations ``a`` only the true class's column sums
    to a negative value. The column with the smallest sum is taken.
    """
    for grad in reversed(gradients):
        if len(grad.shape) == 2 and grad.shape[-1] == num_classes:
            return int(np.argmin(tf.reduce_sum(grad, axis=0).numpy()))
    raise ConfigError("attack idlg: the model needs a dense last layer with one output per class")


@ATTACKS.register("idlg")
@dataclasses.dataclass(frozen=True)
class IDLG(DLG):
    """Improved DLG (Zhao et al., 2020): the label from the gradient, then DLG on the image.

    The label is read off the sign of the last layer's gradient, then the image alone is
    optimised as in `dlg`, with the same parameters. Single examples only (batch_size 1), as in
    the paper.
    """

    name = "idlg"
    max_batch_size = 1

    def labels_for(self, target: AttackTarget) -> np.ndarray | None:
        if target.labels is not None:
            return target.labels
        return np.array([label_from_last_layer(target.gradients, target.num_classes)])
