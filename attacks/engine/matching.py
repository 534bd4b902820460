"""Gradient matching: the compiled optimisation loops shared by the optimisation attacks.

A loop (model forward, parameter gradient, matching loss, its gradient with respect to the
dummy inputs, and the L-BFGS or Adam iterations) is one compiled ``tf.function`` per
(architecture, attack parameters, input shape, batch size, label mode), traced once per number
of problems N (XLA-compiled or a plain graph: `uses_xla`). It attacks N independent trials at
once: each problem has its own weights, observed gradient, labels and optimiser state
(`leakbench.attacks.engine.lbfgs`, `leakbench.attacks.engine.adam`), and no op mixes problems.
Models that `leakbench.attacks.engine.functional.batched_forward` can copy run that batched
copy; any other model runs through Keras' ``stateless_call`` one problem at a time (N = 1).
Either way the weights are tensor arguments, so the compiled loop is shared by every model of
the same architecture (other seeds, other training states) and attacking many trials traces it
once.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any, TypedDict

import keras
import numpy as np
import tensorflow as tf

from leakbench.attacks.engine import adam, lbfgs
from leakbench.attacks.engine.functional import batched_forward
from leakbench.attacks.engine.lanes import stack_rows

# The two built-in losses lived here before the registry, and still import from here.
from leakbench.attacks.engine.losses import LOSSES, cosine_distance, squared_l2  # noqa: F401
from leakbench.attacks.priors import Prior, PriorContext
from leakbench.components.bottleneck import given_noise, noise_width
from leakbench.components.forward import (
    architecture_key,
    examples_interact,
    head_start,
    stateless_forward_and_penalty,
)
from leakbench.core.federated import LocalTraining


class Tolerances(TypedDict, total=False):
    """Tolerances of `lbfgs.Search` that replace its defaults."""

    tolerance_grad: float
    tolerance_change: float


_CACHE: dict[Any, Callable[..., Any]] = {}
# torch.optim.LBFGS's defaults, used with its step structure (`lbfgs.Search`'s pytorch_steps).
TORCH_TOLERANCES: Tolerances = {"tolerance_grad": 1e-7, "tolerance_change": 1e-9}
# Keys whose XLA compilation failed once: they run as plain graphs from then on.
_NO_XLA: set[Any] = set()


def supports_batches(model: keras.Model) -> bool:
    """Whether the compiled loop can attack several problems of this model in one program."""
    return batched_forward(model) is not None


def stack_weights(targets: list[Any]) -> tuple[tf.Tensor, ...]:
    """Each trainable variable of the targets' models, stacked along a new problem axis (each
    model's variables are read once; one model shared by all targets is broadcast)."""
    values: dict[int, tuple[tf.Tensor, ...]] = {}
    for t in targets:
        if id(t.model) not in values:
            values[id(t.model)] = tuple(v.value for v in t.model.trainable_variables)
    return stack_rows([values[id(t.model)] for t in targets])


def stack_gradients(targets: list[Any]) -> tuple[tf.Tensor, ...]:
    """Each observed gradient tensor of the targets, stacked along a new problem axis."""
    return stack_rows([tuple(t.gradients) for t in targets])


def matching_objective(
    model: keras.Model,
    weights: tuple[tf.Tensor, ...],
    observed: tuple[tf.Tensor, ...],
    labels: tf.Tensor,
    *,
    input_shape: tuple[int, int, int],
    batch_size: int,
    num_classes: int,
    learn_labels: bool,
    loss: str = "l2",
    match: str = "all",
    priors: tuple[Prior, ...] = (),
    starts: int = 1,
    local: LocalTraining | None = None,
    clients: int = 1,
    learn_noise: bool = False,
    learn_mixing: bool = False,
) -> Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]]:
    """The matching objective for N problems: ``z -> (loss [N], d loss / d z [N, size])``.

    Row ``n`` of ``z`` holds problem n's dummy images, then (when ``learn_labels``) its dummy
    label logits, whose softmax is the soft label; otherwise the one-hot ``labels`` [N, batch,
    classes] are used. The loss compares the dummy batch's parameter gradient with ``observed``
    by ``loss`` (a name in `leakbench.attacks.engine.losses.LOSSES`); ``match`` says what is
    compared: ``"all"`` coordinates, only those where ``observed`` is non-zero (``"kept"``: an
    adaptive attacker's answer to pruning and top-k, which send zeros in place of the entries they
    drop), or only the feature extractor's tensors, those before
    `leakbench.components.forward.head_start` (``"features"``: the answer to defenses that perturb
    the output layer's gradient, Soteria, or make the head stochastic, PRECODE); each of ``priors``
    adds its weight times its penalty of the dummy images (`leakbench.attacks.priors`), with
    ``starts`` consecutive problems being the starts of one trial. With ``local`` (FedAvg)
    ``observed`` is a client's weight change after its local SGD steps, and the dummy batch's change
    is simulated the same way (the steps unrolled in the graph); None compares gradients (FedSGD).
    ``weights`` and ``observed`` are ordered like ``model.trainable_variables`` with a leading
    problem axis; the model is evaluated at ``weights``, not its own variables. ``observed`` may
    continue past the update with what else the server knows of the batch (its BatchNorm statistics,
    `AttackTarget.statistics`), which the priors read as `PriorContext.known`. With ``clients`` K >
    1 the update is the mean of K clients' updates, each of ``batch_size / K`` consecutive dummy
    examples; when the model's examples interact (BatchNorm in training mode) each client's update
    is simulated on its own share, otherwise the mean is the whole dummy batch's update (the same
    value). With ``learn_mixing`` the client is taken to have shared the gradient of mixes of its
    examples (MixUp): after the label logits come ``batch * batch`` logits of a row-stochastic
    mixing matrix (softmax per row), and the dummy examples and their labels are mixed by it
    before the gradient; the dummy images stay the unmixed ones (one client only). With
    ``learn_noise`` the model's stochastic layer (PRECODE's bottleneck) takes its noise from
    the end of ``z`` (``batch * noise_width`` values) instead of drawing it: the client's draw
    is an unknown the attack optimises with the images (one client only). Models without a
    batched copy accept N = 1 only.
    """
    distance = LOSSES.get(loss)
    observed, known = tuple(observed[: len(weights)]), tuple(observed[len(weights) :])
    masks = [tf.cast(o != 0, o.dtype) for o in observed] if match == "kept" else None
    # The tensors compared: all, or with "features" the feature extractor's alone.
    compared = head_start(model) if match == "features" else len(observed)
    layout = _Layout.of(
        model, input_shape, batch_size, num_classes, learn_labels, clients, learn_noise,
        learn_mixing,
    )  # fmt: skip
    shares = clients if clients > 1 and examples_interact(model) else 1
    forward, forward_and_penalty = _forwards(model)

    def update(images: tf.Tensor, targets: tf.Tensor) -> list[tf.Tensor]:
        return _client_update(forward_and_penalty, weights, local, images, targets)

    def value_and_grad(z: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        with tf.GradientTape() as outer:
            outer.watch(z)
            images = layout.images(z)
            targets = layout.targets(z, labels)
            dummy = _observed_update(update, layout, z, images, targets, shares)
            if masks is not None:
                dummy = [d * m for d, m in zip(dummy, masks, strict=True)]
            value = distance(dummy[:compared], list(observed[:compared]))
            if priors:
                context = PriorContext(model, weights, observed, targets, forward, starts, known)
                value = _with_priors(value, priors, images, context)
        return value, outer.gradient(value, z)

    return value_and_grad


# A forward pass at given weights: (weights, images [N, batch, ...]) -> logits [N, batch, classes].
Forward = Callable[[list[tf.Tensor], tf.Tensor], tf.Tensor]
# The same with the loss terms the model's layers add: -> (logits, penalty).
ForwardAndPenalty = Callable[[list[tf.Tensor], tf.Tensor], tuple[tf.Tensor, tf.Tensor]]


@dataclasses.dataclass(frozen=True)
class _Layout:
    """Where a problem's unknowns lie in its row of ``z``, and what they stand for.

    A row holds the dummy images (``pixels`` values), then the label logits when
    ``learn_labels``, then the ``mixing_values`` logits of the mixing matrix; the
    ``noise_values`` values of the client's noise draw are at its end.
    """

    input_shape: tuple[int, int, int]
    batch_size: int
    num_classes: int
    learn_labels: bool
    mixing_values: int
    noise_values: int

    @classmethod
    def of(
        cls,
        model: keras.Model,
        input_shape: tuple[int, int, int],
        batch_size: int,
        num_classes: int,
        learn_labels: bool,
        clients: int,
        learn_noise: bool,
        learn_mixing: bool,
    ) -> _Layout:
        """The layout of `matching_objective`'s arguments; the client's noise and mixing
        are learned for one client only."""
        noise_values = batch_size * noise_width(model) if learn_noise else 0
        if noise_values and clients > 1:
            raise ValueError(
                "learning the client's noise needs one client (threat_model.clients = 1)"
            )
        mixing_values = batch_size * batch_size if learn_mixing and batch_size > 1 else 0
        if mixing_values and clients > 1:
            raise ValueError(
                "learning the client's mixing needs one client (threat_model.clients = 1)"
            )
        return cls(input_shape, batch_size, num_classes, learn_labels, mixing_values, noise_values)

    @property
    def pixels(self) -> int:
        """Values of one problem's dummy images."""
        return self.batch_size * int(np.prod(self.input_shape))

    def images(self, z: tf.Tensor) -> tf.Tensor:
        """The dummy images, [N, batch, *input_shape]."""
        return tf.reshape(z[:, : self.pixels], (-1, self.batch_size, *self.input_shape))

    def targets(self, z: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        """The dummy label distributions: the softmax of the label logits when they are
        learned, else the given one-hot ``labels``."""
        if not self.learn_labels:
            return labels
        pixels, batch_size, num_classes = self.pixels, self.batch_size, self.num_classes
        logits = z[:, pixels : pixels + batch_size * num_classes]
        return tf.nn.softmax(tf.reshape(logits, (-1, batch_size, num_classes)))

    def noise(self, z: tf.Tensor) -> tf.Tensor | None:
        """The client's noise draw [batch, width], or None: the model draws its own noise (or
        has none)."""
        if not self.noise_values:
            return None
        return tf.reshape(z[0, -self.noise_values :], (self.batch_size, -1))

    def mixed(
        self, z: tf.Tensor, images: tf.Tensor, targets: tf.Tensor
    ) -> tuple[tf.Tensor, tf.Tensor]:
        """The mixes of the dummy examples and of their labels that the client shared: row b
        of the (row-stochastic) mixing matrix gives mixed example b's weights on the dummy
        examples."""
        pixels, batch_size = self.pixels, self.batch_size
        start = pixels + (batch_size * self.num_classes if self.learn_labels else 0)
        mix = tf.nn.softmax(
            tf.reshape(z[:, start : start + self.mixing_values], (-1, batch_size, batch_size))
        )
        flat = tf.reshape(images, (-1, batch_size, pixels // batch_size))
        return tf.reshape(mix @ flat, tf.shape(images)), mix @ targets


def _forwards(model: keras.Model) -> tuple[Forward, ForwardAndPenalty]:
    """The model's forward pass at given weights, alone and with its layers' loss terms: its
    batched copy (`leakbench.attacks.engine.functional.batched_forward`, N problems at once),
    else Keras' ``stateless_call`` on one problem."""
    batched = batched_forward(model)
    if batched is not None:

        def with_zero_penalty(
            ws: list[tf.Tensor], images: tf.Tensor
        ) -> tuple[tf.Tensor, tf.Tensor]:
            logits = batched(ws, images)
            return logits, tf.zeros([], logits.dtype)  # no layer of a batched copy adds a loss

        return batched, with_zero_penalty

    # In training mode BatchNorm normalises with the batch's own statistics, so the
    # moving statistics (these first values) do not enter the logits.
    frozen = [v.value for v in model.non_trainable_variables]

    def forward_and_penalty(ws: list[tf.Tensor], images: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        if images.shape[0] != 1:
            raise ValueError(f"model {model.name} can only be attacked one problem at a time")
        logits, _, penalty = stateless_forward_and_penalty(
            model, images[0], [w[0] for w in ws], frozen
        )
        return logits[None], penalty

    def forward(ws: list[tf.Tensor], images: tf.Tensor) -> tf.Tensor:
        return forward_and_penalty(ws, images)[0]

    return forward, forward_and_penalty


def _task_gradient(
    forward_and_penalty: ForwardAndPenalty,
    ws: list[tf.Tensor],
    images: tf.Tensor,
    targets: tf.Tensor,
) -> list[tf.Tensor]:
    """Each problem's parameter gradient of its training loss on ``images`` and ``targets``."""
    with tf.GradientTape() as inner:
        inner.watch(ws)
        logits, penalty = forward_and_penalty(ws, images)
        # Each problem's training loss (the task loss, a mean over its examples, plus
        # what the model's layers add: PRECODE's KL term); the sum's gradient with respect
        # to ws[i][n] is problem n's own parameter gradient.
        task = penalty + tf.reduce_sum(
            tf.reduce_mean(
                -tf.reduce_sum(targets * tf.nn.log_softmax(logits, axis=-1), axis=-1),
                axis=-1,
            )
        )
    return inner.gradient(task, ws)


def _client_update(
    forward_and_penalty: ForwardAndPenalty,
    weights: tuple[tf.Tensor, ...],
    local: LocalTraining | None,
    images: tf.Tensor,
    targets: tf.Tensor,
) -> list[tf.Tensor]:
    """One client's update of its dummy examples: its gradient (FedSGD), or its weight
    change after its local SGD steps, unrolled so that the outer tape differentiates
    through every step (FedAvg)."""
    if local is None:
        return _task_gradient(forward_and_penalty, list(weights), images, targets)
    current = list(weights)
    for first, last in local.minibatches(int(images.shape[1])):
        step = _task_gradient(
            forward_and_penalty, current, images[:, first:last], targets[:, first:last]
        )
        current = [w - local.lr * g for w, g in zip(current, step, strict=True)]
    return [w0 - w for w0, w in zip(weights, current, strict=True)]


def _observed_update(
    update: Callable[[tf.Tensor, tf.Tensor], list[tf.Tensor]],
    layout: _Layout,
    z: tf.Tensor,
    images: tf.Tensor,
    targets: tf.Tensor,
    shares: int,
) -> list[tf.Tensor]:
    """The update the server would see from the dummy batch: the client's ``update`` of its
    (with learned mixing, mixed) examples, with its noise draw when it is learned; with
    ``shares`` > 1 the mean of the updates of that many consecutive parts of the batch."""
    noise = layout.noise(z)
    shared, shared_targets = images, targets
    if layout.mixing_values:
        shared, shared_targets = layout.mixed(z, images, targets)
    size = layout.batch_size // shares
    with given_noise(noise) if noise is not None else contextlib.nullcontext():
        parts = [
            update(shared[:, k * size : (k + 1) * size],
                   shared_targets[:, k * size : (k + 1) * size])
            for k in range(shares)
        ]  # fmt: skip
    if shares == 1:
        return parts[0]
    return [tf.add_n(list(p)) / shares for p in zip(*parts, strict=True)]


def _with_priors(
    value: tf.Tensor, priors: tuple[Prior, ...], images: tf.Tensor, context: PriorContext
) -> tf.Tensor:
    """``value`` plus each prior's weight times its penalty of the dummy images, in order."""
    for prior in priors:
        value = value + prior.weight * prior.penalty(images, context)
    return value


class _ProblemShape(TypedDict):
    """The arguments of `matching_objective` that every compiled loop gives."""

    input_shape: tuple[int, int, int]
    batch_size: int
    num_classes: int
    learn_labels: bool


class _Problem(_ProblemShape, total=False):
    """The keyword arguments of `matching_objective` that a compiled loop fixes (and that
    are part of its cache key)."""

    loss: str
    match: str
    priors: tuple[Prior, ...]
    starts: int
    local: LocalTraining | None
    clients: int
    learn_noise: bool
    learn_mixing: bool


def lbfgs_chunker(
    model: keras.Model,
    *,
    input_shape: tuple[int, int, int],
    batch_size: int,
    num_classes: int,
    learn_labels: bool,
    iterations: int,
    history_size: int,
    armijo: float | None = 1e-4,
    pytorch_steps: int | None = None,
    loss: str = "l2",
    match: str = "all",
    priors: tuple[Prior, ...] = (),
    stopping: tuple[tuple[str, Any], ...] = (),
    local: LocalTraining | None = None,
    clients: int = 1,
    learn_noise: bool = False,
    learn_mixing: bool = False,
) -> Callable[..., lbfgs.LbfgsState]:
    """Returns the cached compiled L-BFGS chunk (DLG and its variants), for
    `leakbench.attacks.engine.lanes`: ``chunk(state, z0, fresh, weights, observed, labels, steps,
    until) -> state`` starts the rows where ``fresh`` [N] is set from ``z0`` [N, size] and then runs
    every row at most ``steps`` more iterations (of ``iterations`` in all), stopping once at most
    ``until`` rows are still running.

    ``z0`` holds one flat start point per problem: the dummy images, followed by the dummy label
    logits when ``learn_labels`` (DLG); otherwise ``labels`` (one-hot, [N, batch, classes]) is used
    as given. ``weights`` and ``observed`` carry a leading problem axis. ``loss``, ``match``,
    ``priors``, ``local``, ``clients``, ``learn_noise`` and ``learn_mixing`` are as in
    `matching_objective`.
    ``history_size`` and ``iterations`` fix the state's shape (`lbfgs.empty_state`). With
    ``pytorch_steps`` the loop follows ``torch.optim.LBFGS`` with that ``max_iter`` and
    PyTorch's default tolerances (see
    `lbfgs.Search`); otherwise `lbfgs.Search`'s defaults. ``stopping`` adds
    `lbfgs.Search`'s convergence and stall tests (``tolerance_loss``, ``stall_window``,
    ``stall_progress``) as (name, value) pairs.
    """
    tolerances: Tolerances = {} if pytorch_steps is None else TORCH_TOLERANCES
    search = lbfgs.Search(
        armijo=armijo, pytorch_steps=pytorch_steps, **tolerances, **dict(stopping)
    )
    problem: _Problem = dict(input_shape=input_shape, batch_size=batch_size,
                             num_classes=num_classes, learn_labels=learn_labels, loss=loss,
                             match=match, priors=priors, local=local, clients=clients,
                             learn_noise=learn_noise, learn_mixing=learn_mixing)  # fmt: skip
    key = ("lbfgs", architecture_key(model), tuple(sorted(problem.items())), iterations,
           history_size, armijo, pytorch_steps, stopping)  # fmt: skip
    if key not in _CACHE:

        def chunk(
            state: lbfgs.LbfgsState,
            z0: tf.Tensor,
            fresh: tf.Tensor,
            weights: tuple[tf.Tensor, ...],
            observed: tuple[tf.Tensor, ...],
            labels: tf.Tensor,
            steps: tf.Tensor,
            until: tf.Tensor,
        ) -> lbfgs.LbfgsState:
            objective = matching_objective(model, weights, observed, labels, **problem)
            state = lbfgs.LbfgsState(*state)
            state = lbfgs.restart(objective, state, fresh, z0, tolerance_grad=search.tolerance_grad)
            return lbfgs.advance(objective, state, steps, until=until, search=search)

        _CACHE[key] = _compile(chunk, key, xla=uses_xla(model))
    return _CACHE[key]


def adam_matcher(
    model: keras.Model,
    *,
    input_shape: tuple[int, int, int],
    batch_size: int,
    num_classes: int,
    iterations: int,
    lr: float,
    signed: bool,
    priors: tuple[Prior, ...] = (),
    starts: int = 1,
    loss: str = "cosine",
    match: str = "all",
    local: LocalTraining | None = None,
    clients: int = 1,
) -> Callable[[tf.Tensor, tuple[tf.Tensor, ...], tuple[tf.Tensor, ...], tf.Tensor], Any]:
    """Returns the cached compiled Adam loop ``loop(z0, weights, observed, labels) ->
    adam.AdamResult`` (Inverting Gradients): the images alone are optimised, with the given
    one-hot ``labels`` [N, batch, classes], and clamped to [0, 1] after every step."""
    problem: _Problem = dict(input_shape=input_shape, batch_size=batch_size,
                             num_classes=num_classes, learn_labels=False, loss=loss,
                             match=match, priors=priors, starts=starts, local=local,
                             clients=clients)  # fmt: skip
    key = ("adam", architecture_key(model), tuple(sorted(problem.items())), iterations, lr, signed)

    def optimise(objective: adam.ValueAndGrad, z0: tf.Tensor) -> adam.AdamResult:
        return adam.minimize(
            objective,
            z0,
            iterations=iterations,
            lr=lr,
            signed=signed,
            project=box,
        )

    return _cached_loop(model, problem, key, optimise)


def adam_pieces(
    model: keras.Model,
    *,
    input_shape: tuple[int, int, int],
    batch_size: int,
    num_classes: int,
    iterations: int,
    lr: float,
    signed: bool,
    priors: tuple[Prior, ...] = (),
    starts: int = 1,
    loss: str = "cosine",
    match: str = "all",
    local: LocalTraining | None = None,
    clients: int = 1,
) -> tuple[Callable[..., adam.AdamState], Callable[..., adam.AdamResult]]:
    """`adam_matcher`'s loop cut into pieces, for a resumable attack
    (`leakbench.attacks.engine.resume`): the cached compiled ``advance((state, stop), weights,
    observed, labels) -> adam.AdamState`` runs the iterations from ``state.step`` up to
    ``stop``, and ``finish(state, weights, observed, labels) -> adam.AdamResult`` evaluates
    the final iterate; the start is ``adam.initial(z0, iterations, clip)``
    (`box`). Run in any cut, they compute the numbers of `adam_matcher`'s loop."""
    problem: _Problem = dict(input_shape=input_shape, batch_size=batch_size,
                             num_classes=num_classes, learn_labels=False, loss=loss,
                             match=match, priors=priors, starts=starts, local=local,
                             clients=clients)  # fmt: skip
    key = ("adam", architecture_key(model), tuple(sorted(problem.items())), iterations, lr, signed)

    def advance(objective: adam.ValueAndGrad, packed: Any) -> adam.AdamState:
        state, stop = packed
        return adam.advance(
            objective, adam.AdamState(*state), stop, iterations=iterations, lr=lr,
            signed=signed, project=box,
        )  # fmt: skip

    def finish(objective: adam.ValueAndGrad, state: Any) -> adam.AdamResult:
        return adam.finish(objective, adam.AdamState(*state))

    return (
        _cached_loop(model, problem, ("advance", *key), advance),
        _cached_loop(model, problem, ("finish", *key), finish),
    )


def box(z: tf.Tensor) -> tf.Tensor:
    """The pixel box [0, 1] that Adam's images are clamped to after every step."""
    return tf.clip_by_value(z, 0.0, 1.0)


def objective_values(
    model: keras.Model,
    *,
    input_shape: tuple[int, int, int],
    batch_size: int,
    num_classes: int,
    loss: str = "l2",
    match: str = "all",
    local: LocalTraining | None = None,
    clients: int = 1,
) -> Callable[[tf.Tensor, tuple[tf.Tensor, ...], tuple[tf.Tensor, ...], tf.Tensor], tf.Tensor]:
    """Returns the cached compiled ``values(z, weights, observed, labels) -> [N]``: the
    `matching_objective` of N given points, without priors, with the images of ``z`` [N,
    pixels] and the one-hot ``labels`` [N, batch, classes] as given (nothing is learned). What
    the judge (`leakbench.run.judge`) reads of the true input and of a reconstruction."""
    problem: _Problem = dict(input_shape=input_shape, batch_size=batch_size,
                             num_classes=num_classes, learn_labels=False, loss=loss,
                             match=match, local=local, clients=clients)  # fmt: skip
    key = ("values", architecture_key(model), tuple(sorted(problem.items())))
    return _cached_loop(model, problem, key, lambda objective, z: objective(z)[0])


def _cached_loop(
    model: keras.Model,
    problem: _Problem,
    key: Any,
    optimise: Callable[[Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor]], tf.Tensor], Any],
) -> Callable[..., Any]:
    """The compiled ``loop(z0, weights, observed, labels)`` for ``key``, built once: the
    `matching_objective` of ``problem`` minimised by ``optimise(objective, z0)``."""
    if key not in _CACHE:

        def loop(
            z0: tf.Tensor,
            weights: tuple[tf.Tensor, ...],
            observed: tuple[tf.Tensor, ...],
            labels: tf.Tensor,
        ) -> Any:
            objective = matching_objective(model, weights, observed, labels, **problem)
            return optimise(objective, z0)

        _CACHE[key] = _compile(loop, key, xla=uses_xla(model))
    return _CACHE[key]


def uses_xla(model: keras.Model) -> bool:
    """Whether the attack loops of this model are XLA-compiled: yes for models with a batched
    functional copy (LeNet, the MLP), no for models that run through Keras (convolutional
    models with BatchNorm), whose loops run as plain TensorFlow graphs.

    On CPU, TensorFlow's own convolution kernels (oneDNN) beat XLA's by far for the
    convolution gradients these loops differentiate twice. ``ig`` per iteration on one CIFAR-10
    image, 2 cores (2026-12-01, ``benchmarks/ig_speed.py``): ``convnet`` 54 ms with XLA, 13 ms
    as a graph; ``convnet64`` 2,043 ms and 134 ms; ``resnet18`` 439 ms and 124 ms; while the
    LeNet's batched copy takes 0.6 ms with XLA and 2.0 ms as a graph.
    """
    return supports_batches(model)


def _compile(loop: Callable[..., Any], key: Any, *, xla: bool = True) -> Callable[..., Any]:
    """Compiles with XLA (``xla``), falling back to a plain graph if XLA cannot compile an op;
    without ``xla``, a plain graph."""
    xla_loop = tf.function(loop, jit_compile=True)
    graph = tf.function(loop)
    if not xla:
        _NO_XLA.add(key)

    def run(*args: Any) -> Any:
        if key not in _NO_XLA:
            try:
                return xla_loop(*args)
            except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as err:
                if "XLA" not in str(err) and "compil" not in str(err).lower():
                    raise
                _NO_XLA.add(key)
        return graph(*args)

    run.xla = xla_loop  # type: ignore[attr-defined]
    run.graph = graph  # type: ignore[attr-defined]
    return run
