"""The defense contract: a pure, seeded transformation of the gradients a client shares.

A defense is a frozen dataclass registered by name. Calling it maps a list of gradient tensors
(ordered like ``model.trainable_variables``) to the batch gradient the client shares: a list of
the same length and dtypes, with the shapes of the variables. It must be traceable inside a
``tf.function`` without retracing: no Python side effects, no new variables, and randomness only
from stateless random ops keyed by the ``seed`` tensor, so that the same seed always gives the
same output and nothing new is built per step.

Two levels (the class attribute ``level``):

* ``"batch"``: the input is the batch gradient (the gradient of the mean task loss, shaped like
  the variables) and the output has the same shapes.
* ``"example"``: the input is the per-example gradients, each tensor with a leading batch axis
  (shape ``[B, *variable.shape]``), and the output is the batch gradient (shaped like the
  variables). The defense does the reduction over examples itself, because e.g. DP-SGD adds its
  noise once, to the sum of the clipped per-example gradients, before dividing by ``B``.

`leakbench.client.defended_gradients` is the one code path that computes a client's shared
gradient for either level; the attack side and the trainer both use it. This package never
imports a model: a defense sees gradient tensors only.

A new defense is either a `Defense` subclass registered with ``@DEFENSES.register(name)`` or a
plain function ``grads -> grads`` registered with `defense_from_function` (or its decorator form
`function_defense`); both are then usable by name in configs, ``make_defense`` and
``leakbench list``. Installed packages can add defenses through entry points
(`leakbench.core.plugins`).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, TypeVar

import tensorflow as tf

from leakbench.core.params import (
    REQUIRED,
    Flag,
    Int,
    Kind,
    Number,
    Scalar,
    Style,
    Text,
    build,
    validate,
)
from leakbench.core.params import param as declare
from leakbench.core.registry import Registry
from leakbench.defenses.adaptive import AdaptiveSetting, check_settings

Gradients = list[tf.Tensor]

DEFENSES: Registry[type[Defense]] = Registry("defense")

# How defenses word their messages: "defense gaussian: sigma must be in [0, inf), got -1" for a
# number out of range (a wrong type gets "must be a number in [0, inf)"), bounds printed short.
STYLE = Style(number_format="g", range_message=True)


@dataclasses.dataclass(frozen=True)
class Sample:
    """A configuration of a defense that the contract tests (``tests/test_defenses.py``,
    ``tests/test_per_example.py``) build and run.

    Attributes:
        params: The defense's parameters, as a config gives them.
        seeded: Whether the gradient it shares depends on the seed (a draw in the gradient
            itself; a draw in the batch or the model does not count).
    """

    params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    seeded: bool = False


@dataclasses.dataclass(frozen=True)
class Defense:
    """Base class of all defenses.

    Parameters are fields declared with `leakbench.core.params.param`, e.g. ``sigma: float =
    param(REQUIRED, Number(0.0))``; `__post_init__` checks them all (a subclass that adds its
    own ``__post_init__`` calls this one).

    Attributes:
        name: Registry name, set by each subclass.
        level: ``"batch"`` (maps the batch gradient to a defended batch gradient) or
            ``"example"`` (maps per-example gradients, shape ``[B, *variable.shape]``, to the
            defended batch gradient, doing the reduction over examples itself). Use
            `leakbench.client.defended_gradients` to feed a defense the right input for its
            level.
    """

    name: ClassVar[str] = ""
    level: ClassVar[str] = "batch"
    # Whether `apply` needs the client's `ClientView` (the batch and the model's representation
    # function): true for defenses that read more than the gradient (Soteria).
    needs_view: ClassVar[bool] = False
    # What the defense changes in the model before any gradient is computed, as a tuple
    # ``(kind, *parameters)`` the application understands (`leakbench.components.bottleneck`), or
    # None: PRECODE inserts a variational bottleneck before the output layer.
    architecture: ClassVar[tuple[Any, ...] | None] = None
    # The adaptive attacks that target this defense, as attack parameter settings (e.g.
    # ``AdaptiveSetting({"match": "kept"})``, checked against the attacks' parameters when the
    # class is defined): the standard suite (`leakbench.attacks.suite.suite_for`) and, under
    # ``suite = "listed"``, `leakbench.run.config.adaptive_variants` run each attack that takes
    # a setting with it too, and a defense whose settings did not run is ``untested`` on the
    # leaderboard, never ``holds``.
    adaptive: ClassVar[tuple[AdaptiveSetting, ...]] = ()
    # The parameter that makes the defense stronger, and its direction (+1: a larger value
    # protects more, -1: a smaller one), or None. The leaderboard flags a verdict that is not
    # monotone along it (a stronger setting judged to leak more than a weaker one).
    strength: ClassVar[tuple[str, int] | None] = None
    # The configurations the contract tests build and run; a registered defense needs one.
    samples: ClassVar[tuple[Sample, ...]] = ()
    # What the defense does, in one line of the docs' defense table (`leakbench.defenses.table`);
    # empty: the docstring's first line.
    summary: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "adaptive" in cls.__dict__:
            check_settings(f"defense {cls.name or cls.__qualname__}", cls.adaptive)

    def __post_init__(self) -> None:
        # Checks every parameter declared with `leakbench.core.params.param` (numbers are stored as
        # floats, so that sigma=1 and sigma=1.0 give the same canonical params).
        validate(self, f"defense {self.name}", STYLE)

    def __call__(self, grads: Gradients, *, seed: tf.Tensor) -> Gradients:
        """Returns the defended gradients.

        Args:
            grads: Gradient tensors ordered like ``model.trainable_variables``: the batch
                gradient for a batch-level defense, the per-example gradients (leading batch
                axis) for an example-level one.
            seed: int32/int64 tensor of shape [2]; the only source of randomness.

        Returns:
            The defended batch gradient, one tensor per variable, shaped like the variable.
        """
        raise NotImplementedError

    def apply(
        self, grads: Gradients, *, seed: tf.Tensor, view: ClientView | None = None
    ) -> Gradients:
        """What the client shares: the defended gradient, given what the client knows of its
        batch (``view``; `leakbench.client` passes it when `needs_view` is set). A defense
        that reads only the gradient is ``__call__``; one that needs the view overrides this.
        """
        del view
        return self(grads, seed=seed)

    def apply_sampled(
        self,
        grads: Gradients,
        *,
        seed: tf.Tensor,
        expected_size: int | tf.Tensor,
        view: ClientView | None = None,
    ) -> Gradients:
        """What the client shares for a Poisson-sampled batch in DP training: the mechanism the
        defense's accountant (`dp_event`) analyses, normalised by the batch's expected size
        ``expected_size`` rather than by its realised size (which may be 0). A defense with an
        accountant implements it (``dpsgd``; a chain delegates to its private step); the
        trainer calls it for those defenses only (`leakbench.client.training.run_epochs`)."""
        del grads, seed, expected_size, view
        raise NotImplementedError(
            f"defense {self.name} declares no Poisson-sampled release; a defense with dp_event "
            "implements apply_sampled"
        )

    def adaptive_attacks(self) -> tuple[AdaptiveSetting, ...]:
        """The attack parameter settings that target this configuration (`adaptive`)."""
        return tuple(self.adaptive)

    def check_client(self, batch_size: int) -> None:
        """Raises `leakbench.core.errors.ConfigError` if a client with batches of ``batch_size``
        examples cannot use this defense (nothing here)."""
        del batch_size

    def prepare(
        self, images: tf.Tensor, targets: tf.Tensor, *, seed: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """The batch the client computes its gradient on: its own images and label
        distributions here; a defense that changes the batch itself (mixup) overrides this.
        Draws randomness from stateless ops keyed by `prepare_seed` of ``seed``."""
        del seed
        return images, targets

    def epsilon(self, sampling_rate: float, steps: int, delta: float) -> float | None:
        """The ``(epsilon, delta)``-DP guarantee of training with this defense, if it has one.

        Args:
            sampling_rate: Probability that one example is in a batch (Poisson sampling), i.e.
                batch size / training set size.
            steps: Number of training steps (shared gradients).
            delta: The ``delta`` of ``(epsilon, delta)``-DP.

        Returns:
            ``None`` here: a defense gives no differential-privacy guarantee unless it says so
            (e.g. ``dpsgd``, or a chain that contains it).
        """
        del sampling_rate, steps, delta
        return None

    def dp_event(self, sampling_rate: float, steps: int) -> Any | None:
        """The mechanism behind `epsilon` as a dp-accounting ``DpEvent`` (so that any of its
        accountants can read it: the epsilon audit compares against the exact PLD value), or
        ``None`` for a defense without a guarantee."""
        del sampling_rate, steps
        return None

    def gaussian_score(self) -> bool:
        """Whether the update is a deterministic function of the gradients plus noise that is
        Gaussian, of a fixed scale, drawn independently per coordinate: then a Dirac canary's
        coordinate is a shift of one Gaussian in and out of the batch, and the epsilon audit
        also reads it with the Gaussian-DP bound and several canaries per round
        (`leakbench.components.gaussian_dp_bound`). An assumption the defense declares; the
        default is False."""
        return False

    def independent_canaries(self) -> bool:
        """Whether Dirac canaries in distinct coordinates of one update are independent trials
        of the epsilon audit: the defense treats each coordinate (a batch-level defense) or
        each example (an example-level one) on its own, with noise drawn independently per
        coordinate, so one canary's presence moves no other canary's score. Then the audit
        puts ``canaries`` of them in every round (`leakbench.client.canaries`). A clip of the
        whole update couples them (its factor depends on every canary present), so clipping
        before the noise is not independent. An assumption the defense declares; the default
        is False."""
        return False

    def data_independent(self) -> bool:
        """Whether a canary's effect on the update, and the update's randomness, are the same
        whatever else the client's batch holds: the update is the batch's own contribution
        plus the canary's plus a draw that reads neither (no defense, noise of a fixed scale,
        DP-SGD's sum of clipped examples). Then the epsilon audit reads one batch; a defense
        whose output depends on the batch (a scale, mask, clip or mix computed from it:
        relative noise, Soteria, pruning, mixup) has its rounds spread over ``[epsilon_audit]
        batches`` private batches. An assumption the defense declares; the default is False."""
        return False

    def acts_on_data(self) -> bool:
        """Whether the defense changes the batch before any gradient is computed (`prepare`:
        mixup). The epsilon audit then adds an input canary, an example the preparation acts
        on, instead of a gradient canary that would pass around it."""
        return type(self).prepare is not Defense.prepare

    def unclipped_noise_std(self) -> float | None:
        """The standard deviation of the noise the defense adds to every coordinate of an
        update whose examples nothing clips (gaussian, laplace), None for any other defense.
        Where it is set, the epsilon audit's bound describes the canary, not the defense: a
        canary's shift over this std (``canary_mu``) decides it, and a larger canary raises it
        without limit."""
        return None

    def params(self) -> dict[str, Any]:
        """The defense's parameters as plain JSON-able values (used for canonical keys)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_params(cls, **params: Any) -> Defense:
        """Builds the defense from config values, refusing an unknown or missing parameter in
        one line (`leakbench.core.params.build`); a defense whose config is not its fields as
        they are (a chain's ``steps`` tables) overrides this."""
        return build(cls, f"defense {cls.name}", params)


@dataclasses.dataclass(frozen=True)
class PerTensor(Defense):
    """A deterministic batch-level defense that maps each gradient tensor on its own
    (quantisation, pruning): subclasses define `transform`."""

    def __call__(self, grads: Gradients, *, seed: tf.Tensor) -> Gradients:
        del seed  # Deterministic; the seed is part of the common signature only.
        return [self.transform(tf.convert_to_tensor(g)) for g in grads]

    def transform(self, g: tf.Tensor) -> tf.Tensor:
        """The defended version of one gradient tensor."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class AdditiveNoise(Defense):
    """A batch-level defense that adds independent noise to every gradient entry: subclasses
    define `scale` (zero: the identity) and `noise`. Each tensor draws from its own seed
    (`tensor_seed`), in float32 (float64 for float64 tensors), cast back to the tensor's dtype."""

    @property
    def scale(self) -> float:
        """The noise's scale parameter; ``0`` shares the gradient unchanged."""
        raise NotImplementedError

    def noise(self, shape: tf.Tensor, seed: tf.Tensor, dtype: tf.DType) -> tf.Tensor:
        """A draw of the noise of ``shape`` from ``seed``."""
        raise NotImplementedError

    def data_independent(self) -> bool:
        # The same noise law added to whatever the batch holds.
        return True

    def __call__(self, grads: Gradients, *, seed: tf.Tensor) -> Gradients:
        if self.scale == 0.0:
            return list(grads)
        out = []
        for i, g in enumerate(grads):
            g = tf.convert_to_tensor(g)
            work = tf.float64 if g.dtype == tf.float64 else tf.float32
            noise = self.noise(tf.shape(g), tensor_seed(seed, i), work)
            out.append(g + tf.cast(noise, g.dtype))
        return out


class ClientView(NamedTuple):
    """What the client knows of its batch beyond the gradient, for defenses that read it.

    Attributes:
        images: The batch the gradient was computed on, shape ``[B, ...]``.
        representation: ``images -> [B, F]``, the input of the model's output layer (its
            learned representation) at the weights the gradient was taken at, differentiable
            with respect to the images.
        head_kernel: Index, in the gradient list, of the output layer's kernel (shape
            ``[F, classes]``: row ``f`` holds the weights of representation unit ``f``).
    """

    images: tf.Tensor
    representation: Callable[[tf.Tensor], tf.Tensor]
    head_kernel: int


def prepare_seed(seed: tf.Tensor | tuple[int, int] | list[int]) -> tf.Tensor:
    """The seed of a defense's `Defense.prepare` draws: its own stream, apart from the draws
    ``tensor_seed(seed, i)`` that the gradient transformation makes."""
    return tensor_seed(seed, -1)


def tensor_seed(seed: tf.Tensor | tuple[int, int] | list[int], index: int) -> tf.Tensor:
    """Derives an independent stateless seed for the ``index``-th random draw of one call."""
    seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
    return tf.random.experimental.stateless_fold_in(seed, index)


# A function defense's parameter accepts what its default's type says. The values must be JSON
# scalars so that `Defense.params` stays canonical; a float parameter also takes an int (kept
# as given) and, having no range, also NaN and infinities.
_KIND_OF_DEFAULT: dict[type, Kind] = {
    bool: Flag(),
    int: Int(),
    float: Number(finite=False, as_float=False),
    str: Text(),
}
_RESERVED = frozenset({"name", "level", "function"})

F = TypeVar("F", bound=Callable[..., Sequence[tf.Tensor]])


def defense_from_function(
    name: str,
    fn: Callable[..., Sequence[tf.Tensor]],
    *,
    level: str = "batch",
    reference: str | None = None,
) -> type[Defense]:
    """Registers a plain function ``grads -> grads`` as the defense ``name``.

    The function receives the gradient list as its first argument (per-example gradients with
    a leading batch axis if ``level`` is ``"example"``) and returns the defended batch
    gradient: one tensor per input tensor, shaped like the variable, with the input's dtype.
    It must follow the defense contract of this module: traceable in a ``tf.function``, no
    Python side effects, no variables. A parameter named ``seed`` receives the seed (an int
    tensor of shape [2]); draw all randomness from stateless ops keyed by it, e.g.
    ``tf.random.stateless_normal(tf.shape(g), seed=tensor_seed(seed, i), dtype=g.dtype)``.

    Every other parameter becomes a parameter of the defense, set in ``[[defense]]`` tables
    and swept by lists like any built-in one. Its default, if it has one, must be None, a bool,
    an int, a float or a string, and a given value must then be of the same kind (an int
    passes for a float); values must be such JSON scalars in any case.

    Example::

        @function_defense("scale")
        def scale(grads, factor: float = 0.5):
            return [g * tf.cast(factor, g.dtype) for g in grads]

    Args:
        name: The registry name, used in configs and result tables.
        fn: The function; its docstring's first line is what ``leakbench list`` shows.
        level: ``"batch"`` or ``"example"`` (see `Defense`).
        reference: The paper the defense comes from, appended to the docstring as its
            ``Reference:`` section.

    Returns:
        The registered defense class: a frozen dataclass subclass of `Defense` with one field
        per parameter and the function as its ``function`` attribute.

    Raises:
        ValueError: If ``name`` is taken or empty, or ``level`` is not allowed.
        TypeError: If ``fn`` is not a function of the form described above.
    """
    _check_function(name, fn, level)
    label = getattr(fn, "__qualname__", repr(fn))
    fields, takes_seed = _function_fields(name, fn, label)
    doc = inspect.cleandoc(fn.__doc__ or f"The function defense {name} ({label}).")
    if reference:
        doc += "\n\nReference:\n    " + reference
    class_name = "".join(part.capitalize() for part in _words(name)) + "Defense"
    cls = dataclasses.make_dataclass(
        class_name,
        fields,
        bases=(Defense,),
        namespace={
            "name": name,
            "level": level,
            "function": staticmethod(fn),
            "__call__": _function_call(name, fn, label, [f[0] for f in fields], takes_seed),
            "__doc__": doc,
        },
        frozen=True,
        # Keyword-only, so that a required parameter may follow one with a default.
        kw_only=True,
    )
    cls.__module__ = getattr(fn, "__module__", __name__)
    DEFENSES.register(name)(cls)
    return cls


def _check_function(name: str, fn: Callable[..., Sequence[tf.Tensor]], level: str) -> None:
    """Refuses an empty name, an unknown level and an ``fn`` that is not a function
    (`defense_from_function`'s ValueError and TypeError)."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"a defense name must be a non-empty string, got {name!r}")
    if level not in ("batch", "example"):
        raise ValueError(f"defense {name}: level must be 'batch' or 'example', got {level!r}")
    if isinstance(fn, type) or not callable(fn):
        raise TypeError(f"defense {name}: expected a function grads -> grads, got {fn!r}")


def _function_fields(
    name: str, fn: Callable[..., Sequence[tf.Tensor]], label: str
) -> tuple[list[tuple[str, Any, Any]], bool]:
    """The dataclass fields of a function defense, one per parameter of ``fn`` after the
    gradients (but ``seed``), each declared with the kind its default asks for; and whether
    ``fn`` takes the seed.

    Raises:
        TypeError: ``fn`` does not take the gradients first, a parameter cannot be passed by
            keyword, has a reserved name or a default that is not a JSON scalar or None.
    """
    params = list(inspect.signature(fn).parameters.values())
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    by_keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if not params or params[0].kind not in positional:
        raise TypeError(
            f"defense {name}: {label} must take the gradient list as its first argument"
        )
    takes_seed = False
    fields: list[tuple[str, Any, Any]] = []
    for param in params[1:]:
        if param.kind not in by_keyword:
            raise TypeError(
                f"defense {name}: {label} parameter {param.name!r} must be passable by keyword "
                "(no *args, **kwargs or positional-only parameters after the gradients)"
            )
        if param.name == "seed":
            takes_seed = True
            continue
        if param.name in _RESERVED:
            raise TypeError(f"defense {name}: parameter name {param.name!r} is reserved; rename it")
        if param.default is inspect.Parameter.empty:
            fields.append((param.name, Any, declare(REQUIRED, Scalar())))
            continue
        if param.default is not None and type(param.default) not in _KIND_OF_DEFAULT:
            raise TypeError(
                f"defense {name}: {label} parameter {param.name!r} has the default "
                f"{param.default!r}; defaults must be None, a bool, an int, a float or a string"
            )
        kind = Scalar() if param.default is None else _KIND_OF_DEFAULT[type(param.default)]
        fields.append((param.name, Any, declare(param.default, kind)))
    return fields, takes_seed


def _function_call(
    name: str,
    fn: Callable[..., Sequence[tf.Tensor]],
    label: str,
    field_names: list[str],
    takes_seed: bool,
) -> Callable[..., Gradients]:
    """The ``__call__`` of a function defense: ``fn`` with the defense's parameters (and the
    seed, when it takes it), refusing a result of the wrong length."""

    def call(self: Defense, grads: Gradients, *, seed: tf.Tensor) -> Gradients:
        kwargs = {field_name: getattr(self, field_name) for field_name in field_names}
        if takes_seed:
            kwargs["seed"] = seed
        grads = list(grads)
        out = list(fn(grads, **kwargs))
        if len(out) != len(grads):
            raise ValueError(
                f"defense {name}: {label} returned {len(out)} tensors for {len(grads)} "
                "gradients; return one tensor per gradient tensor"
            )
        return out

    return call


def function_defense(
    name: str, *, level: str = "batch", reference: str | None = None
) -> Callable[[F], F]:
    """Decorator form of `defense_from_function`; returns the function unchanged.

    Args:
        name: The defense's registered name (in configs, `make_defense` and ``leakbench list``).
        level: ``"batch"`` (the batch gradient) or ``"example"`` (per-example gradients).
        reference: The paper or source the defense follows, if any.

    Returns:
        The decorator, which registers the function and gives it back unchanged.

    Example:
        >>> @function_defense("halve")  # doctest: +SKIP
        ... def halve(grads):
        ...     return [g * 0.5 for g in grads]
    """

    def decorate(fn: F) -> F:
        defense_from_function(name, fn, level=level, reference=reference)
        return fn

    return decorate


def _words(name: str) -> list[str]:
    # A valid class name from any registry name ("top-k 2" -> "TopK2"), for reprs only.
    word = "".join(ch if ch.isalnum() else " " for ch in name).split()
    return word or ["Function"]


def make_defense(name: str, **params: Any) -> Defense:
    """Builds a registered defense from its name and parameters, validating both.

    Args:
        name: A registered defense name (``leakbench list`` shows them).
        **params: The defense's parameters, as in a ``[[defense]]`` table.

    Returns:
        The frozen `Defense`, called as ``defense(grads, seed=...)``.

    Example:
        >>> make_defense("gaussian", sigma=0.01)  # doctest: +SKIP
    """
    return DEFENSES.get(name).from_params(**params)
