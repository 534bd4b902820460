"""The attack contract: reconstruct private inputs (and labels) from an observed gradient.

`Attack.__call__` is final: it validates the target, seeds the attack, times it, retries from a
fresh random start when the loss becomes non-finite, clips the images to [0, 1] and fills in the
status. Subclasses implement `Attack.run`. An attack never mutates the model.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, ClassVar, final

import keras
import numpy as np
import tensorflow as tf

from leakbench.errors import ConfigError
from leakbench.registry import Registry

ATTACKS: Registry[type[Attack]] = Registry("attack")


@dataclasses.dataclass(frozen=True)
class AttackTarget:
    """What the honest-but-curious server observes for one client batch.

    Attributes:
        model: The model at the step that produced the gradient (weights are not changed).
        gradients: The observed (defended) gradient, ordered like ``model.trainable_variables``.
        input_shape: (height, width, channels) of one image.
        batch_size: Number of examples behind the gradient.
        num_classes: Number of classes.
        labels: The private labels when the threat model says the server knows them, else None.
    """

    model: keras.Model
    gradients: tuple[tf.Tensor, ...]
    input_shape: tuple[int, int, int]
    batch_size: int
    num_classes: int
    labels: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class RunOutput:
    """What `Attack.run` returns: unclipped images, labels, and the optimisation trace."""

    images: np.ndarray
    labels: np.ndarray
    loss: float
    loss_history: np.ndarray
    evaluations: int


@dataclasses.dataclass(frozen=True)
class Reconstruction:
    """An attack's result.

    Attributes:
        images: Reconstructed images, float32 in [0, 1], NHWC.
        labels: Reconstructed labels, int64, one per image.
        loss: Final gradient-matching loss (what the attacker can see of its own success).
        loss_history: Loss per iteration of the attempt that was kept.
        status: ``ok``, ``diverged`` (non-finite after every restart) or ``error``.
        evaluations: Loss-and-gradient evaluations over all attempts.
        attempts: Number of attempts run (1 + restarts used).
        seconds: Wall time of the whole attack.
        message: Why the status is not ``ok``, else empty.
    """

    images: np.ndarray
    labels: np.ndarray
    loss: float
    loss_history: np.ndarray
    status: str
    evaluations: int
    attempts: int
    seconds: float
    message: str = ""


def check_int(attack: str, param: str, value: Any, low: int, high: int | None = None) -> int:
    """Validates an integer attack parameter; raises `ConfigError` naming it and the range."""
    allowed = f"an integer >= {low}" if high is None else f"an integer in [{low}, {high}]"
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"attack {attack}: {param} must be {allowed}, got {value!r}")
    if value < low or (high is not None and value > high):
        raise ConfigError(f"attack {attack}: {param} must be {allowed}, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Attack:
    """Base class of all attacks; subclasses are frozen dataclasses of their parameters.

    Attributes:
        restarts: Fresh random starts tried after an attempt ends with a non-finite loss.
    """

    name: ClassVar[str] = ""
    max_batch_size: ClassVar[int | None] = None

    restarts: int = 2

    def __post_init__(self) -> None:
        check_int(self.name, "restarts", self.restarts, 0, 100)

    def params(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def check_batch_size(self, batch_size: int) -> None:
        """Raises `ConfigError` if the attack cannot handle this batch size."""
        if self.max_batch_size is not None and batch_size > self.max_batch_size:
            raise ConfigError(
                f"attack {self.name}: batch_size must be <= {self.max_batch_size}, got {batch_size}"
            )

    def run(self, target: AttackTarget, seed: tf.Tensor) -> RunOutput:
        """One attempt from the random start given by ``seed`` (int64 tensor of shape [2])."""
        raise NotImplementedError

    @final
    def __call__(self, target: AttackTarget, *, seed: int) -> Reconstruction:
        """Attacks ``target``; the same seed gives the same reconstruction."""
        self._check_target(target)
        start = time.perf_counter()
        evaluations = 0
        out: RunOutput | None = None
        status, message = "diverged", "loss was not finite in any attempt"
        attempt = 0
        try:
            for attempt in range(1, self.restarts + 2):
                out = self.run(target, tf.constant([seed, attempt], tf.int64))
                evaluations += out.evaluations
                if np.isfinite(out.loss) and np.all(np.isfinite(out.images)):
                    status, message = "ok", ""
                    break
        except tf.errors.OpError as err:  # a kernel failed (e.g. an XLA op): record, go on
            status, message = "error", f"{type(err).__name__}: {err.message.splitlines()[0]}"
        seconds = time.perf_counter() - start
        shape = (target.batch_size, *target.input_shape)
        if out is None or status != "ok":
            images = np.zeros(shape, np.float32) if out is None else out.images
            labels = np.full(target.batch_size, -1, np.int64) if out is None else out.labels
        else:
            images, labels = out.images, out.labels
        images = np.clip(np.nan_to_num(images, nan=0.0), 0.0, 1.0).astype(np.float32)
        return Reconstruction(
            images=images.reshape(shape),
            labels=np.asarray(labels, np.int64),
            loss=float(out.loss) if out is not None else float("nan"),
            loss_history=out.loss_history if out is not None else np.zeros(0, np.float32),
            status=status,
            evaluations=evaluations,
            attempts=attempt,
            seconds=seconds,
            message=message,
        )

    def _check_target(self, target: AttackTarget) -> None:
        variables = target.model.trainable_variables
        if len(target.gradients) != len(variables):
            raise ValueError(
                f"{len(target.gradients)} gradients for {len(variables)} trainable variables"
            )
        for grad, var in zip(target.gradients, variables, strict=True):
            if tuple(grad.shape) != tuple(var.shape):
                raise ValueError(f"gradient shape {grad.shape} does not match {var.path}")
        self.check_batch_size(target.batch_size)
        if target.labels is not None and len(target.labels) != target.batch_size:
            raise ValueError("target.labels must have one label per example")


def make_attack(name: str, **params: Any) -> Attack:
    """Builds a registered attack from its name and parameters, validating both."""
    cls = ATTACKS.get(name)
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(params) - fields)
    if unknown:
        raise ConfigError(
            f"attack {name}: unknown parameter {unknown[0]!r}; allowed: {', '.join(sorted(fields))}"
        )
    return cls(**params)
