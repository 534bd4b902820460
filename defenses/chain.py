"""Composition of defenses, e.g. clipping followed by noise."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import tensorflow as tf

from leakbench.core.errors import ConfigError, LeakbenchError
from leakbench.core.params import PLAIN, REQUIRED, Kind, Style, param
from leakbench.defenses.base import (
    DEFENSES,
    AdaptiveSetting,
    ClientView,
    Defense,
    Gradients,
    Sample,
    make_defense,
    tensor_seed,
)


@dataclasses.dataclass(frozen=True)
class Steps(Kind):
    """A chain's steps: a non-empty sequence of `Defense` instances that are not chains, of
    which only the first may be example-level; stored as a tuple."""

    def describe(self, style: Style = PLAIN) -> str:
        return "a non-empty list of defenses"

    def check(self, value: Any, label: str, style: Style = PLAIN) -> Any:
        if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence):
            raise ConfigError(f"{label} must be {self.describe(style)}, got {value!r}")
        if not value:
            raise ConfigError(f"{label} must be {self.describe(style)}, got []")
        for i, step in enumerate(value):
            if isinstance(step, Chain):
                raise ConfigError(
                    f"{label}[{i}] is a chain; chains do not nest, list its steps directly"
                )
            if not isinstance(step, Defense):
                raise ConfigError(
                    f"{label}[{i}] must be a Defense instance, got {step!r} "
                    "(build chains from config tables with make_defense('chain', steps=[...]))"
                )
        for i, step in enumerate(value[1:], start=1):
            if step.level == "example":
                # Its input would be the batch gradient the earlier steps return, not the
                # per-example gradients it needs.
                raise ConfigError(
                    f"{label}[{i}] ({step.name}) is example-level; an example-level step must "
                    "be the first step (steps[0])"
                )
        # A tuple keeps the frozen dataclass hashable even when a list was passed.
        return tuple(value)


@DEFENSES.register("chain")
@dataclasses.dataclass(frozen=True)
class Chain(Defense):
    """Applies several defenses in order, each to the previous one's output.

    Step ``k`` (from 0) is called with its own stateless seed ``tensor_seed(seed, k)``, so two
    random steps never share noise and a step's randomness does not depend on the other steps.
    An example-level step (e.g. ``dpsgd``) may only be the first step: it maps the per-example
    gradients to the batch gradient, and every later step is batch-level and acts on that
    reduced batch gradient (e.g. DP-SGD then extra noise or pruning on the released gradient).
    A chain's ``level`` is therefore its first step's level. Chains do not nest:
    a chain inside a chain would be the same defense as the flat chain up to its seeds, and
    refusing it keeps one canonical form per defense; list the steps directly instead.

    In a config, a chain is written with tables that name each step::

        [[defense.steps]]
        name = "clip"
        norm = 1.0
        [[defense.steps]]
        name = "gaussian"
        sigma = 0.01

    A chain whose first step gives a differential-privacy guarantee keeps it (the later steps
    are post-processing of the released gradient with independent randomness), so `epsilon`
    returns that step's epsilon.

    Attributes:
        steps: Non-empty tuple of `Defense` instances (not chains), applied first to last; only
            ``steps[0]`` may be example-level.

    Reference:
        Abadi, Chu, Goodfellow, McMahan, Mironov, Talwar and Zhang. "Deep Learning with
        Differential Privacy". CCS 2016 (the clip-then-noise composition).
    """

    name: ClassVar[str] = "chain"
    level: ClassVar[str] = "batch"
    summary: ClassVar[str] = (
        "several defenses applied in order; an example-level step (`dpsgd`) may only come first"
    )
    # A batch-level chain, and one whose first step is example-level (a chain's level is its
    # first step's).
    samples: ClassVar[tuple[Sample, ...]] = (
        Sample(
            {"steps": [{"name": "clip", "norm": 1.0}, {"name": "gaussian", "sigma": 0.01}]},
            seeded=True,
        ),
        Sample(
            {
                "steps": [
                    {"name": "dpsgd", "norm": 1.0, "noise_multiplier": 0.5},
                    {"name": "gaussian", "sigma": 0.01},
                ]
            },
            seeded=True,
        ),
    )

    steps: tuple[Defense, ...] = param(REQUIRED, Steps(), doc="defenses applied in order")

    def __post_init__(self) -> None:
        super().__post_init__()
        # level is a ClassVar on the base; a chain's level is its first step's, so it is set
        # per instance here (the class attribute stays "batch" for code that reads the class).
        object.__setattr__(self, "level", self.steps[0].level)
        object.__setattr__(self, "needs_view", any(step.needs_view for step in self.steps))
        changes = [step.architecture for step in self.steps if step.architecture is not None]
        if len(changes) > 1:
            raise ConfigError("defense chain: at most one step may change the model (precode)")
        object.__setattr__(self, "architecture", changes[0] if changes else None)
        if changes and self.level == "example":
            raise ConfigError(
                "defense chain: a step that changes the model (precode) cannot follow an "
                "example-level step"
            )

    def adaptive_attacks(self) -> tuple[AdaptiveSetting, ...]:
        """One setting that answers every step at once (the steps' settings merged; where two
        steps set one parameter differently, the earlier step's value is kept)."""
        merged: dict[str, Any] = {}
        for step in self.steps:
            for setting in step.adaptive_attacks():
                for key, value in setting.items():
                    merged.setdefault(key, value)
        return (AdaptiveSetting(merged),) if merged else ()

    def check_client(self, batch_size: int) -> None:
        for step in self.steps:
            step.check_client(batch_size)

    @classmethod
    def from_params(cls, **params: Any) -> Chain:
        """Builds a chain from config values: ``steps`` is a list of tables with a ``name``.

        Raises:
            ConfigError: naming ``steps[i]`` and the problem, for a malformed or invalid step.
        """
        unknown = sorted(set(params) - {"steps"})
        if unknown:
            raise ConfigError(f"defense chain: unknown parameter {unknown[0]!r}; allowed: steps")
        if "steps" not in params:
            raise ConfigError("defense chain: parameter 'steps' is required")
        steps = params["steps"]
        if not isinstance(steps, (list, tuple)) or not steps:
            raise ConfigError(
                "defense chain: steps must be a non-empty list of tables such as "
                f'{{name = "clip", norm = 1.0}}, got {steps!r}'
            )
        built = []
        for i, table in enumerate(steps):
            if not isinstance(table, Mapping):
                raise ConfigError(
                    f"defense chain: steps[{i}] must be a table with a 'name', got {table!r}"
                )
            step_name = table.get("name")
            if not isinstance(step_name, str):
                raise ConfigError(
                    f"defense chain: steps[{i}] needs a string 'name', got {step_name!r}"
                )
            if step_name == cls.name:
                raise ConfigError(
                    f"defense chain: steps[{i}] is a chain; chains do not nest, "
                    "list its steps directly"
                )
            step_params = {key: value for key, value in table.items() if key != "name"}
            try:
                built.append(make_defense(step_name, **step_params))
            except LeakbenchError as err:
                # Unknown names and bad values both become one ConfigError that points at the
                # offending table, which is what a user editing the config needs.
                raise ConfigError(f"defense chain: steps[{i}]: {err}") from err
        return cls(steps=tuple(built))

    def params(self) -> dict[str, Any]:
        """``{"steps": [{"name": ..., **step.params()}, ...]}``; feeds back into `from_params`."""
        return {"steps": [{"name": step.name, **step.params()} for step in self.steps]}

    def epsilon(self, sampling_rate: float, steps: int, delta: float) -> float | None:
        """The epsilon of the chain's differentially private step, or ``None`` if it has none.

        Steps after it only post-process its output, which keeps its guarantee; see
        `Defense.epsilon` for the arguments.
        """
        for step in self.steps:
            eps = step.epsilon(sampling_rate, steps, delta)
            if eps is not None:
                return eps
        return None

    def dp_event(self, sampling_rate: float, steps: int) -> Any | None:
        """The mechanism of the chain's differentially private step (as `epsilon`)."""
        for step in self.steps:
            event = step.dp_event(sampling_rate, steps)
            if event is not None:
                return event
        return None

    def gaussian_score(self) -> bool:
        """The last step's: Gaussian noise added last, after deterministic steps (clipping)
        or other Gaussian noise, leaves a Gaussian shift; any later step may not."""
        return self.steps[-1].gaussian_score()

    def independent_canaries(self) -> bool:
        """Only when every step keeps them apart: a clip of the whole update before the noise
        scales each canary by a factor that depends on the others."""
        return all(step.independent_canaries() for step in self.steps)

    def data_independent(self) -> bool:
        """Only when every step is: a clip of the whole update after the batch is summed
        scales the canary by a factor the batch decides."""
        return all(step.data_independent() for step in self.steps)

    def acts_on_data(self) -> bool:
        return any(step.acts_on_data() for step in self.steps)

    def __call__(self, grads: Gradients, *, seed: tf.Tensor) -> Gradients:
        return self.apply(grads, seed=seed)

    def apply(
        self, grads: Gradients, *, seed: tf.Tensor, view: ClientView | None = None
    ) -> Gradients:
        out = list(grads)
        for k, step in enumerate(self.steps):
            out = step.apply(out, seed=tensor_seed(seed, k), view=view)
        return out

    def apply_sampled(
        self,
        grads: Gradients,
        *,
        seed: tf.Tensor,
        expected_size: int | tf.Tensor,
        view: ClientView | None = None,
    ) -> Gradients:
        """`apply` with the private step (the first whose `dp_event` is not None) releasing its
        Poisson-sampled form (`Defense.apply_sampled`); the later steps post-process it as in
        `apply`, with the same seeds."""
        private = next(
            (k for k, step in enumerate(self.steps) if step.dp_event(1.0, 1) is not None), None
        )
        if private is None:
            return super().apply_sampled(grads, seed=seed, expected_size=expected_size, view=view)
        out = list(grads)
        for k, step in enumerate(self.steps):
            key = tensor_seed(seed, k)
            if k == private:
                out = step.apply_sampled(out, seed=key, expected_size=expected_size, view=view)
            else:
                out = step.apply(out, seed=key, view=view)
        return out

    def prepare(
        self, images: tf.Tensor, targets: tf.Tensor, *, seed: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """Every step's `Defense.prepare` in order, step ``k`` with ``tensor_seed(seed, k)``."""
        for k, step in enumerate(self.steps):
            images, targets = step.prepare(images, targets, seed=tensor_seed(seed, k))
        return images, targets
