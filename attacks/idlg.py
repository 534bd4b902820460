"""iDLG: Zhao, Mopuri & Bilen, "iDLG: Improved Deep Leakage from Gradients", arXiv 2001.02610."""

from __future__ import annotations

import dataclasses

import numpy as np

from leakbench.attacks.base import ATTACKS, AttackTarget
from leakbench.attacks.dlg import DLG
from leakbench.attacks.labels import label_from_last_layer


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
