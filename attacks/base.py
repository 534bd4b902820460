"""The attack contract: reconstruct private inputs (and labels) from an observed update.

Every attack, of every modality, is an `AttackContract`: a frozen dataclass of its parameters,
registered in the one registry `ATTACKS`, with a ``modality`` (``"image"``, ``"text"``) that
says which runs it belongs to (`attacks_of`). `AttackContract.attack_many` (and ``__call__``,
its one-target form) is final and shared: it validates the targets, seeds attempt k of each
target with `leakbench.core.seeds.attempt_draw` (seed, k), times it, retries from a fresh start
an attempt whose answer is not finite, records a failing TensorFlow kernel as ``error`` and
fills in the status. A modality's base class implements four small hooks: how to check a target
(`AttackContract._check_target`), whether an attempt's answer is finite (`_finite`), how to
build the result (`_result`) and which targets run together (`_groups`).

`Attack` is the image attacks' base: subclasses implement `Attack.run` (one attempt on one
target) or `Attack.run_many` (one attempt on several targets at once, which the batched attacks
do in one compiled program); the images are clipped to [0, 1]. The text attacks' base is
`leakbench.attacks.text.base.TextAttack`. An attack never mutates the model.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar, cast, final

import keras
import numpy as np
import tensorflow as tf

from leakbench.attacks.priors import Prior
from leakbench.components.forward import architecture_key
from leakbench.core.errors import ConfigError
from leakbench.core.federated import LocalTraining
from leakbench.core.params import (
    PLAIN,
    Alias,
    Int,
    aliases_of,
    build,
    keyed_params,
    param,
    resolve_aliases,
    validate,
)
from leakbench.core.registry import Registry
from leakbench.core.seeds import attempt_draw

# Every attack of every modality, by name (`attacks_of` gives one modality's).
ATTACKS: Registry[type[AttackContract[Any, Any, Any]]] = Registry("attack")

# Retries after a non-finite loss: what `Attack.retries` and its old name ``restarts`` accept.
RETRIES = Int(0, 100)


@dataclasses.dataclass(frozen=True, eq=False)
class Simulator:
    """What an attacker can compute for itself: the update a client would share of examples the
    attacker chooses, through the client's own update code and the same defense, threat model
    and model, with defense draws of the attacker's own (never the private ones).

    The run builds one per (model, defense configuration) from the public split only (the split
    the private examples are not drawn from); an attack that learns from it (`learned`) never
    sees a private example. It also keeps what such an attack trains, in this process and, when
    the run gives it a ``folder``, in the run directory.

    Attributes:
        images: The public examples, NHWC in [0, 1].
        labels: Their labels.
        share: ``share(images, labels, draw)``: the observed update of a batch of public
            examples (as many as the target's ``batch_size``) under defense draw number
            ``draw`` (a non-negative integer, a stream apart from every private draw).
        key: What the shared update depends on (model and its state, defense configuration,
            threat model), for naming what is trained from it.
        folder: Where trained attack state is kept between processes and runs, or None.
        progress: Show progress bars while training.
        kept: What was trained in this process, by name.
    """

    images: np.ndarray
    labels: np.ndarray
    share: Callable[[np.ndarray, np.ndarray, int], tuple[tf.Tensor, ...]]
    key: str
    folder: Path | None = None
    progress: bool = False
    kept: dict[str, Any] = dataclasses.field(default_factory=dict)


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
        local: The client's local training when it shares a weight change after several SGD
            steps (FedAvg; the server knows these settings), else None: ``gradients`` is
            then the client's gradient (FedSGD).
        clients: Clients behind the update (secure aggregation): ``gradients`` is the mean of
            their updates, each of ``batch_size / clients`` examples.
        statistics: The batch's BatchNorm statistics when the threat model grants them
            (``bn_statistics_known``): per BatchNorm layer, the per-channel mean and variance of
            its input (`leakbench.components.forward.batch_statistics_fn`), else None.
        simulator: What the attacker can compute of public examples under the same defense
            (`Simulator`), for an attack that learns (`Attack.simulates`); None where the run
            gives none.
    """

    model: keras.Model
    gradients: tuple[tf.Tensor, ...]
    input_shape: tuple[int, int, int]
    batch_size: int
    num_classes: int
    labels: np.ndarray | None = None
    local: LocalTraining | None = None
    clients: int = 1
    statistics: tuple[tf.Tensor, ...] | None = None
    simulator: Simulator | None = None


@dataclasses.dataclass(frozen=True)
class RunOutput:
    """What `Attack.run` returns: unclipped images, labels, and the optimisation trace.

    Attributes:
        stop_reason: Why the optimisation ended: ``"converged"`` (its convergence test),
            ``"stalled"`` (no progress), ``"budget"`` (the iteration cap ended a search that
            was still going), ``"schedule"`` (a fixed schedule ran to its end, as `ig`'s), or
            ``""`` for an attack that does not say (not an optimisation, or a plugin).
        iterations_used: Iterations charged against the budget, or -1 for the length of
            ``loss_history``.
    """

    images: np.ndarray
    labels: np.ndarray
    loss: float
    loss_history: np.ndarray
    evaluations: int
    stop_reason: str = ""
    iterations_used: int = -1


@dataclasses.dataclass(frozen=True)
class Reconstruction:
    """An attack's result.

    Attributes:
        images: Reconstructed images, float32 in [0, 1], NHWC.
        labels: Reconstructed labels, int64, one per image.
        loss: Final gradient-matching loss (what the attacker can see of its own success).
        loss_history: Loss per iteration of the attempt that was kept.
        status: ``ok``, ``diverged`` (non-finite after every retry) or ``error``.
        evaluations: Loss-and-gradient evaluations over all attempts.
        attempts: Number of attempts run (1 + retries used).
        seconds: Wall time of the whole attack; for attacks run together, each attempt's wall
            time divided by the number of trials in it.
        message: Why the status is not ``ok``, else empty.
        stop_reason: Why the kept attempt's optimisation ended (`RunOutput.stop_reason`);
            ``"diverged"`` when no attempt had a finite loss, ``"error"`` when a kernel failed.
        iterations_used: Iterations the kept attempt charged against its budget.
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
    stop_reason: str = ""
    iterations_used: int = 0


TargetT = TypeVar("TargetT")
OutputT = TypeVar("OutputT")
ResultT = TypeVar("ResultT")
AttackT = TypeVar("AttackT", bound="AttackContract[Any, Any, Any]")


@dataclasses.dataclass
class Tally(Generic[OutputT]):
    """One target's attempts as `AttackContract.attack_many` ran them.

    Attributes:
        outputs: What each attempt that returned gave, in order (the last one is kept).
        status: ``ok``, ``diverged`` (no attempt was finite) or ``error`` (a kernel failed).
        message: Why the status is not ``ok``, else empty.
        attempts: Attempts run (1 + retries used).
        seconds: Wall time of the attempts (an attempt run for a group: its share).
    """

    outputs: list[OutputT]
    status: str
    message: str
    attempts: int = 0
    seconds: float = 0.0

    @property
    def kept(self) -> OutputT | None:
        """The last attempt's output, or None when no attempt returned."""
        return self.outputs[-1] if self.outputs else None


@dataclasses.dataclass(frozen=True)
class AttackContract(Generic[TargetT, OutputT, ResultT]):
    """The root of every attack, of every modality: its parameters and the final driver.

    A modality's base class (`Attack` for images, `leakbench.attacks.text.base.TextAttack`)
    sets ``modality``, implements ``run_many`` (one attempt on each of several targets) and the
    hooks `_check_target`, `_finite`, `_result` and `_groups`; `attack_many` and ``__call__``
    are final. Parameters are fields declared with `leakbench.core.params.param`;
    ``__post_init__`` checks them all (a subclass that adds its own calls this one).

    Attributes:
        retries: Attempts from a fresh random start after an attempt whose answer was not
            finite (for an image attack: its loss or images; see `_finite`).
    """

    name: ClassVar[str] = ""
    # The kind of data the attack reconstructs, which is the kind of run it belongs to:
    # "image" (`Attack`) or "text" (`TextAttack`); `attacks_of` lists one modality's.
    modality: ClassVar[str] = ""
    # True when `run_many` takes a ``width`` keyword and keeps at most that many targets in
    # flight itself (refilling as they finish): `attack_many` then hands it every compatible
    # target at once instead of cutting them into padded groups.
    refills: ClassVar[bool] = False
    # Old parameter names that `make_attack` and config files still accept, with a notice.
    aliases: ClassVar[tuple[Alias, ...]] = ()
    # The threat model the attack belongs to (`[threat_model] server`): "honest" attacks the
    # model as trained; "malicious" ships a model of its own (`Attack.malicious_model`) first.
    server: ClassVar[str] = "honest"
    # Parameters that a defense's adaptive settings leave as configured (`with_setting`).
    not_adaptive: ClassVar[tuple[str, ...]] = ()
    # The message of a target whose every attempt's answer was not finite.
    not_finite: ClassVar[str] = "loss was not finite in any attempt"

    retries: int = param(2, RETRIES, doc="fresh random starts after a non-finite loss")

    def __post_init__(self) -> None:
        validate(self, f"attack {self.name}", PLAIN)

    def params(self) -> dict[str, Any]:
        """The parameters as trial keys, tables and resolved configs hold them (a parameter
        declared ``keyed_when_set`` only when it is not at its default)."""
        return keyed_params(self)

    @classmethod
    def adaptive_parameters(cls) -> frozenset[str]:
        """The parameters a defense's adaptive setting may set: every field but `not_adaptive`."""
        return frozenset(f.name for f in dataclasses.fields(cls)) - set(cls.not_adaptive)

    def with_setting(self: AttackT, setting: Mapping[str, Any]) -> AttackT | None:
        """This attack with a defense's adaptive ``setting`` (`leakbench.defenses.AdaptiveSetting`)
        applied, keeping its other parameters; None when it lacks one of the setting's
        parameters (`adaptive_parameters`) or refuses a value."""
        if not set(setting) <= self.adaptive_parameters():
            return None
        try:
            return dataclasses.replace(self, **setting)
        except ConfigError:
            return None

    def uses_simulator(self) -> bool:
        """Whether the attack learns from what the attacker can compute itself (`Simulator`):
        the run then gives its targets one, built from the public split, and attacks each of
        its defense configurations in one group (one process trains what it learns)."""
        return False

    def run_many(self, targets: list[TargetT], seeds: list[tf.Tensor]) -> list[OutputT]:
        """One attempt on each target, target ``i`` from the start given by ``seeds[i]``
        (int64 tensors of shape [2]); results must not depend on which other targets are in
        the list."""
        raise NotImplementedError(f"attack {self.name} implements no attempt")

    @final
    def __call__(self, target: TargetT, *, seed: int) -> ResultT:
        """Attacks ``target``; the same seed gives the same reconstruction."""
        return self.attack_many([target], [seed])[0]

    @final
    def attack_many(
        self, targets: list[TargetT], seeds: list[int], *, width: int | None = None
    ) -> list[ResultT]:
        """Attacks every target; ``seeds[i]`` seeds target ``i`` exactly as ``__call__`` would.

        Targets are passed to `run_many` in the groups `_groups` cuts: an image attack's of
        ``width`` (default: all of them; fewer when `Attack.batch_width` says so), a short
        last group padded with copies of its last target, whose results are dropped, so every
        call has the same shape and a compiled attack is traced once; an attack that
        `refills` gets all compatible targets in one call, with ``width`` as the most it may
        run at once. Attempt k of target ``i`` starts from ``attempt_draw(seeds[i], k)``.
        Attempts whose answer is not finite (`_finite`) are retried from a fresh start, up to
        ``retries`` times, again in groups; a failing kernel marks its group ``error``.
        """
        if len(seeds) != len(targets):
            raise ValueError(f"{len(seeds)} seeds for {len(targets)} targets")
        for target in targets:
            self._check_target(target)
        tallies = [Tally[OutputT]([], "diverged", self.not_finite) for _ in targets]
        pending = list(range(len(targets)))
        for attempt in range(1, self.retries + 2):
            for group, size in self._groups(pending, targets, width):
                self._attempt(attempt, group, size, targets, seeds, tallies, width)
            pending = [i for i in pending if tallies[i].status == "diverged"]
            if not pending:
                break
        return [self._result(t, tally) for t, tally in zip(targets, tallies, strict=True)]

    def _attempt(
        self,
        attempt: int,
        group: list[int],
        size: int,
        targets: list[TargetT],
        seeds: list[int],
        tallies: list[Tally[OutputT]],
        width: int | None,
    ) -> None:
        """Attempt number ``attempt`` on the targets of ``group`` (padded to ``size``), in
        one `run_many` call, recorded in their tallies."""
        padded = group + [group[-1]] * (size - len(group))
        start = time.perf_counter()
        extra = {"width": width or len(group)} if self.refills else {}
        try:
            results = self.run_many(
                [targets[i] for i in padded],
                [attempt_draw(seeds[i], attempt) for i in padded],
                **extra,
            )
        except tf.errors.OpError as err:  # a kernel failed (e.g. an XLA op): record
            text = f"{type(err).__name__}: {err.message.splitlines()[0]}"
            results = None
        share = (time.perf_counter() - start) / len(group)
        for pos, i in enumerate(group):
            tally = tallies[i]
            tally.seconds += share
            tally.attempts = attempt
            if results is None:
                tally.status, tally.message = "error", text
                continue
            tally.outputs.append(results[pos])
            if self._finite(targets[i], results[pos]):
                tally.status, tally.message = "ok", ""

    def _check_target(self, target: TargetT) -> None:
        """Raises ValueError (or `ConfigError`) on a target the attack cannot read."""
        raise NotImplementedError

    def _finite(self, target: TargetT, output: OutputT) -> bool:
        """Whether an attempt's answer is finite (else it is retried)."""
        raise NotImplementedError

    def _result(self, target: TargetT, tally: Tally[OutputT]) -> ResultT:
        """The result of ``target`` from its attempts."""
        raise NotImplementedError

    def _groups(
        self, indices: list[int], targets: list[TargetT], width: int | None
    ) -> list[tuple[list[int], int]]:
        """The targets of ``indices`` cut into the groups one `run_many` call gets, each with
        the size it is padded to. Default: one target at a time."""
        del targets, width
        return [([i], 1) for i in indices]


@dataclasses.dataclass(frozen=True)
class Attack(AttackContract[AttackTarget, RunOutput, Reconstruction]):
    """Base class of the image attacks; subclasses are frozen dataclasses of their parameters.

    Parameters are fields declared with `leakbench.core.params.param`; `__post_init__` checks them
    all (a subclass that adds its own ``__post_init__`` calls this one).

    Attributes:
        retries: Attempts from a fresh random start after an attempt whose loss became
            non-finite (formerly ``restarts``, still accepted; see `aliases`).
    """

    modality: ClassVar[str] = "image"
    max_batch_size: ClassVar[int | None] = None
    aliases: ClassVar[tuple[Alias, ...]] = (Alias("restarts", "retries", RETRIES),)

    def objective_priors(self) -> tuple[Prior, ...]:
        """The priors added to the attack's matching loss (`leakbench.attacks.priors`); none
        unless the attack optimises one (`MatchingAttack`)."""
        return ()

    def check_batch_size(self, batch_size: int) -> None:
        """Raises `ConfigError` if the attack cannot handle this batch size."""
        if self.max_batch_size is not None and batch_size > self.max_batch_size:
            raise ConfigError(
                f"attack {self.name}: batch_size must be <= {self.max_batch_size}, got {batch_size}"
            )

    def check_model(self, model: keras.Model, input_shape: tuple[int, ...]) -> None:
        """Raises `ConfigError` if the attack cannot attack this model (default: any model)."""
        del model, input_shape

    def malicious_model(self, model: keras.Model, public: np.ndarray, seed: int) -> keras.Model:
        """The model a malicious server sends the client instead of ``model`` (a malicious
        attack's only change to the round): built from ``model`` and ``public`` images (the
        dataset's other split, never the private examples), seeded by ``seed``. The client
        computes, defends and shares its update on it, and the attack reads that update."""
        del model, public, seed
        raise NotImplementedError(f"attack {self.name} assumes an honest server")

    def run(self, target: AttackTarget, seed: tf.Tensor) -> RunOutput:
        """One attempt from the random start given by ``seed`` (int64 tensor of shape [2])."""
        if type(self).run_many is Attack.run_many:
            raise NotImplementedError(f"attack {self.name} implements neither run nor run_many")
        return self.run_many([target], [seed])[0]

    def run_many(self, targets: list[AttackTarget], seeds: list[tf.Tensor]) -> list[RunOutput]:
        """One attempt on each target, target ``i`` from the start given by ``seeds[i]``.

        Results must not depend on which other targets are in the list. The default runs the
        targets one after the other; batched attacks override it.
        """
        if type(self).run is Attack.run:
            raise NotImplementedError(f"attack {self.name} implements neither run nor run_many")
        return [self.run(t, s) for t, s in zip(targets, seeds, strict=True)]

    def batch_width(self, target: AttackTarget, requested: int) -> int:
        """How many targets like this one `run_many` should get at once (at most ``requested``)."""
        return requested

    def _finite(self, target: AttackTarget, output: RunOutput) -> bool:
        return bool(np.isfinite(output.loss) and np.all(np.isfinite(output.images)))

    def _result(self, target: AttackTarget, tally: Tally[RunOutput]) -> Reconstruction:
        evaluations = sum(out.evaluations for out in tally.outputs)
        return _reconstruction(
            target,
            tally.kept,
            tally.status,
            tally.message,
            evaluations,
            tally.attempts,
            tally.seconds,
        )

    def _groups(
        self, indices: list[int], targets: list[AttackTarget], width: int | None
    ) -> list[tuple[list[int], int]]:
        """Splits ``indices`` into groups of compatible targets (same model architecture,
        shapes and label knowledge) of at most the allowed width; returns each group with the
        size it is padded to (the width, or the group's own size when no width was given)."""
        keys: dict[int, str] = {}
        by_key: dict[Any, list[int]] = {}
        for i in indices:
            t = targets[i]
            if id(t.model) not in keys:
                keys[id(t.model)] = architecture_key(t.model)
            model_key = keys[id(t.model)]
            key = (model_key, t.input_shape, t.batch_size, t.num_classes, t.labels is None,
                   t.local, t.clients, t.statistics is None)  # fmt: skip
            by_key.setdefault(key, []).append(i)
        out = []
        for members in by_key.values():
            if self.refills:
                out.append((members, len(members)))
                continue
            step = max(1, self.batch_width(targets[members[0]], width or len(members)))
            for k in range(0, len(members), step):
                group = members[k : k + step]
                out.append((group, step if width else len(group)))
        return out

    def _check_target(self, target: AttackTarget) -> None:
        check_gradients(target.model, target.gradients)
        self.check_batch_size(target.batch_size)
        self.check_model(target.model, target.input_shape)
        if target.labels is not None and len(target.labels) != target.batch_size:
            raise ValueError("target.labels must have one label per example")
        if target.clients < 1 or target.batch_size % target.clients:
            raise ValueError(
                f"target.clients ({target.clients}) must divide batch_size ({target.batch_size})"
            )
        if self.uses_simulator() and target.simulator is None:
            raise ConfigError(
                f"attack {self.name} learns from public examples through the defense; its "
                "target needs a simulator (leakbench.attacks.Simulator)"
            )
        needs = [p.name for p in self.objective_priors() if p.needs_statistics]
        if needs and target.statistics is None:
            raise ConfigError(
                f"attack {self.name}: prior {needs[0]} needs the batch's BatchNorm statistics; "
                "set threat_model.bn_statistics_known = true"
            )


def _reconstruction(
    target: AttackTarget,
    out: RunOutput | None,
    status: str,
    message: str,
    evaluations: int,
    attempts: int,
    seconds: float,
) -> Reconstruction:
    shape = (target.batch_size, *target.input_shape)
    if out is None:
        images = np.zeros(shape, np.float32)
        labels = np.full(target.batch_size, -1, np.int64)
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
        attempts=attempts,
        seconds=seconds,
        message=message,
        stop_reason=status if status != "ok" else out.stop_reason if out is not None else "",
        iterations_used=(
            0
            if out is None
            else len(out.loss_history)
            if out.iterations_used < 0
            else out.iterations_used
        ),
    )


def simulated(target: AttackTarget, mode: str) -> LocalTraining | None:
    """The local training an attack simulates for ``target``: the target's under FedAvg when
    ``mode`` is ``"simulate"``, else None (gradients are matched)."""
    return target.local if mode == "simulate" else None


def observed_as(target: AttackTarget, mode: str) -> tuple[tf.Tensor, ...]:
    """What the attack's objective reads of the target: the observed update as the attack
    matches it (as it is, or under FedAvg with ``"as_gradient"`` divided by ``steps * lr``,
    one gradient's worth), followed by the batch's BatchNorm statistics when the server knows
    them (`leakbench.attacks.engine.matching.matching_objective` splits the two)."""
    if target.local is None or mode == "simulate":
        update = tuple(target.gradients)
    else:
        update = tuple(g / target.local.scale for g in target.gradients)
    return update + tuple(target.statistics or ())


def attacks_of(modality: str) -> Registry[type[AttackContract[Any, Any, Any]]]:
    """The registered attacks of ``modality`` (``"image"``, ``"text"``): a live, read-only view
    of `ATTACKS`. Its ``get`` refuses an attack of another modality in one line that names the
    attacks of this one."""
    if modality not in _VIEWS:
        _VIEWS[modality] = ATTACKS.view(
            lambda cls: cls.modality == modality,
            lambda name, cls: (
                f"attack {name!r} is {_a(cls.modality)} attack; this run's dataset is "
                f"{_a(modality)} dataset; {modality} attacks: "
                f"{', '.join(attacks_of(modality).names())}"
            ),
        )
    return _VIEWS[modality]


_VIEWS: dict[str, Registry[type[AttackContract[Any, Any, Any]]]] = {}


def _a(modality: str) -> str:
    return f"{'an' if modality[:1] in 'aeiou' else 'a'} {modality}"


def build_attack(
    modality: str, name: str, params: Mapping[str, Any], *, stacklevel: int = 1
) -> AttackContract[Any, Any, Any]:
    """A registered attack of ``modality`` from its name and parameters, both checked; an old
    parameter name's notice points at the frame ``stacklevel`` (1: the caller)."""
    cls = attacks_of(modality).get(name)
    where = f"attack {name}"
    params = resolve_aliases(dict(params), aliases_of(cls), where, PLAIN, stacklevel=stacklevel + 1)
    return build(cls, where, params)


def check_gradients(model: keras.Model, gradients: Sequence[Any]) -> None:
    """Raises ``ValueError`` unless ``gradients`` holds one tensor per trainable variable of
    ``model``, each of its variable's shape: the first check of every attack's target."""
    variables = model.trainable_variables
    if len(gradients) != len(variables):
        raise ValueError(f"{len(gradients)} gradients for {len(variables)} trainable variables")
    for grad, var in zip(gradients, variables, strict=True):
        if tuple(grad.shape) != tuple(var.shape):
            raise ValueError(f"gradient shape {grad.shape} does not match {var.path}")


def make_attack(name: str, **params: Any) -> Attack:
    """Builds a registered image attack from its name and parameters, validating both (a text
    attack: `leakbench.attacks.text.suite.make_text_attack`).

    An old parameter name (`Attack.aliases`, e.g. ``restarts``) is translated to its new
    name, with one ``FutureWarning`` that points at the caller.

    Args:
        name: A registered image attack name (``leakbench list`` shows them).
        **params: The attack's parameters, as in an ``[[attack]]`` table.

    Returns:
        The frozen `Attack`.

    Example:
        >>> make_attack("idlg")  # doctest: +SKIP
    """
    return cast(Attack, build_attack("image", name, params, stacklevel=2))
