"""The client's local training in a federated round (FedAvg), as both sides compute it.

In FedSGD a client shares the gradient of its batch. In FedAvg (McMahan et al., 2017) it first
trains locally: several SGD steps on its private examples, then shares the change of its
weights. `LocalTraining` says how; the client (`leakbench.client.defended_update`) and the
attacker who simulates it inside the matching objective (`leakbench.attacks.engine.matching`)
read the same definition, so they cannot drift apart.

The threat model's assumption, as in Dimitrov et al., "Data Leakage in Federated Averaging"
(TMLR 2022): the server knows the local learning rate, the number of steps and the mini-batch
size, and the order of the mini-batches. Here that order is fixed: each epoch walks the
client's examples in order, mini-batch ``k`` holding examples ``[k * b, (k + 1) * b)``.

A core module: plain values, no TensorFlow, no other leakbench module.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class LocalTraining:
    """How a client trains before it shares its update.

    Attributes:
        steps: SGD steps of the client. 1 is FedSGD: the client shares its gradient itself
            (the code path of every earlier run); more share the weight change.
        lr: The local learning rate of plain SGD.
        batch_size: Examples per local mini-batch; 0 means the client's whole batch.
    """

    steps: int = 1
    lr: float = 0.1
    batch_size: int = 0

    @property
    def fedsgd(self) -> bool:
        """Whether the client shares its gradient (one step) rather than a weight change."""
        return self.steps == 1

    def batches(self, examples: int) -> int:
        """Mini-batches in one pass over ``examples`` (one epoch)."""
        return -(-examples // (self.batch_size or examples))

    def minibatches(self, examples: int) -> list[tuple[int, int]]:
        """The ``(start, stop)`` of the examples behind each local step, in order."""
        size = self.batch_size or examples
        starts = list(range(0, examples, size))
        return [(s, min(s + size, examples)) for s in (starts * self.steps)[: self.steps]]

    @property
    def scale(self) -> float:
        """What the weight change of the steps is, in units of one gradient: ``steps * lr``
        (an attacker that treats the change as a gradient divides by it)."""
        return self.steps * self.lr
