"""DLG: Zhu, Liu & Han, "Deep Leakage from Gradients", NeurIPS 2019."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import tensorflow as tf

from leakbench.attacks.base import (
    ATTACKS,
    AttackTarget,
    RunOutput,
    observed_as,
    simulated,
)
from leakbench.attacks.engine import lanes, lbfgs, resume
from leakbench.attacks.engine.losses import LOSSES
from leakbench.attacks.engine.matching import lbfgs_chunker, supports_batches
from leakbench.attacks.matching import MatchingAttack
from leakbench.components.bottleneck import noise_width
from leakbench.core.params import Choice, Int, Number, Registered, param

# The paper's code calls torch.optim.LBFGS(max_iter=20) once per optimiser step.
TORCH_MAX_ITER = 20


@ATTACKS.register("dlg")
@dataclasses.dataclass(frozen=True)
class DLG(MatchingAttack):
    """Deep Leakage from Gradients (Zhu et al., 2019).

    Optimises a dummy image batch and dummy soft labels (logits passed through a softmax)
    jointly so that their gradient matches the observed one in squared L2, with L-BFGS. The
    dummy images and label logits start from N(0, 1), as in the paper's code. When the target
    carries labels (labels-known threat model), only the images are optimised. Batches of up to
    64 examples; their order is not observable, so scoring matches them to the originals.

    Two options make it an adaptive attacker (defaults: the paper's attack): ``match = "kept"``
    compares only the coordinates where the observed gradient is non-zero, so that the entries
    a pruning or top-k defense dropped (sent as zeros) are not forced to zero, and ``match =
    "features"`` only the feature extractor's tensors, which Soteria leaves intact and which
    lie before PRECODE's stochastic layer; ``loss = "cosine"`` is blind to the gradient's
    scale, which norm clipping changes.

    The search runs until its own convergence test: the best loss improves by less than the
    share ``stall_progress`` over ``stall_window`` iterations, the line search fails twice,
    the loss stops changing or the gradient vanishes. It has converged when it ends with the
    matching loss at ``loss_tolerance`` times its starting value or less (or a vanishing
    gradient), and stalled otherwise; ``iterations`` is only a cap, and a trial that reaches
    it is reported (``stop_reason = "budget"``) because it may have been stopped short. On
    CIFAR-10 with the DLG LeNet, the paper's 300 iterations recovered no image; these
    defaults recover most (README, "Attacks").

    Args:
        iterations: Cap on L-BFGS iterations, each with a backtracking line search. With
            ``line_search = "none"``, the cap in iterations of PyTorch's 20-iteration steps:
            6,000 is the paper's 300 steps.
        loss_tolerance: A search that ends with the best matching loss at most this share of
            the loss at the start has converged (1e-10: float32 leaves little below).
        stall_window: Iterations (charged against the cap) over which the best loss must
            improve by ``stall_progress``; 0 turns the test off.
        stall_progress: The relative improvement a window must make.
        local_training: Under FedAvg (the client shares its weight change after several local
            SGD steps): ``"simulate"`` unrolls the client's steps on the dummy batch and
            matches weight changes (Dimitrov et al., 2022); ``"as_gradient"`` treats the change
            divided by ``steps * lr`` as one gradient (the FedSGD attack, a baseline).
        history_size: Curvature pairs kept by L-BFGS (PyTorch's default is 100).
        line_search: ``"armijo"`` (backtracking until the loss decreases enough) or ``"none"``
            (unit steps, shortened only when the loss would be non-finite, as the paper's
            PyTorch code runs ``torch.optim.LBFGS``: its step structure and default
            tolerances, see `leakbench.attacks.engine.lbfgs.Search`'s ``pytorch_steps``);
            with ``"none"`` the best iterate by gradient-matching loss is kept.
        loss: ``"l2"`` (squared L2 distance, the paper's) or ``"cosine"`` (one minus the
            cosine similarity of the concatenated gradients, scale-invariant).
        match: ``"all"`` (every gradient coordinate), ``"kept"`` (only the coordinates that
            are non-zero in the observed gradient) or ``"features"`` (only the tensors of the
            feature extractor, before the output layer or PRECODE's bottleneck: the answer to
            Soteria and PRECODE).
        priors: Terms added to the matching loss, as tables (``[{ name = "tv", weight = 1e-4
            }]``; `leakbench.attacks.priors`); none by default, as in the paper.
        noise: On a model that samples in its forward pass (PRECODE): ``"sample"`` evaluates
            it with the server's own draw (the model as it stands, as the PRECODE paper
            attacks it); ``"learn"`` optimises the client's unknown draw jointly with the
            images, from N(0, 1), so that the true images and draw match exactly (the Bayesian
            attacker's answer, Balunovic et al., ICLR 2022). No effect on other models.
        mixing: ``"none"`` takes the shared gradient to be of the client's own examples;
            ``"learn"`` takes it to be of mixes of them (MixUp) and optimises a row-stochastic
            mixing matrix (softmax of ``batch * batch`` logits) jointly with the unmixed
            images, which are what is scored. With the labels known (``threat_model``
            ``labels_known``) the mixed labels pin the mixing down; with learned labels the
            unmixed batch is not identifiable (the mixes themselves fit).
        retries: Fresh random starts after an attempt whose loss became non-finite (the
            old name ``restarts`` is still accepted, with a deprecation notice).
    """

    name = "dlg"
    max_batch_size = 64
    refills = True

    iterations: int = param(10_000, Int(1, 100_000), doc="L-BFGS iterations (a cap)")
    history_size: int = param(100, Int(1, 1_000), doc="curvature pairs kept by L-BFGS")
    line_search: str = param("armijo", Choice("armijo", "none"), doc="step length rule")
    loss: str = param("l2", Registered(LOSSES), doc="gradient distance")
    loss_tolerance: float = param(
        1e-10, Number(0.0, 1.0), doc="converged at this share of the starting loss"
    )
    stall_window: int = param(500, Int(0, 100_000), doc="iterations that must make progress")
    stall_progress: float = param(1e-3, Number(0.0, 1.0), doc="relative progress per window")
    local_training: str = param(
        "simulate",
        Choice("simulate", "as_gradient"),
        doc="how a FedAvg update is matched",
        keyed_when_set=True,
    )
    noise: str = param(
        "sample",
        Choice("sample", "learn"),
        doc="the client's draw in a stochastic model",
        keyed_when_set=True,
    )
    mixing: str = param(
        "none", Choice("none", "learn"), doc="the client's mixing of its batch", keyed_when_set=True
    )

    def stopping(self) -> tuple[tuple[str, Any], ...]:
        """The L-BFGS convergence and stall tests these parameters ask for."""
        tests: list[tuple[str, Any]] = [("tolerance_loss", self.loss_tolerance)]
        if self.stall_window:
            tests += [("stall_window", self.stall_window), ("stall_progress", self.stall_progress)]
        return tuple(tests)

    def labels_for(self, target: AttackTarget) -> np.ndarray | None:
        """Labels fixed before the image search, or None to learn them jointly."""
        return target.labels

    def run_many(
        self, targets: list[AttackTarget], seeds: list[tf.Tensor], width: int | None = None
    ) -> list[RunOutput]:
        """Every target (compatible ones, as `attack_many` groups them), at most ``width`` at a
        time, through the compiled L-BFGS chunk and `leakbench.attacks.engine.lanes` (slots
        refilled as trials finish): each has its own start, weights, observed gradient and
        optimiser state."""
        first = targets[0]
        labels = [self.labels_for(t) for t in targets]
        unknowns = _Unknowns.of(self, first, learn_labels=labels[0] is None)
        chunk = self._chunk(first, unknowns)
        problems = self._problems(targets, seeds, labels, unknowns)
        width = width or len(targets)
        plan = lanes.default_plan(width)
        if not supports_batches(first.model):  # this model runs one problem per program
            plan = dataclasses.replace(plan, slots=1, tail=0)
        states = lanes.solve(
            chunk,
            problems,
            width=width,
            plan=plan,
            history_size=self.history_size,
            max_iterations=self.iterations,
            # A stopped group resumes without re-solving its finished problems (on a CPU).
            tag=resume.fingerprint(self.name, self.params()),
        )
        return [
            _output(state, target, known, unknowns)
            for state, target, known in zip(states, targets, labels, strict=True)
        ]

    def _chunk(self, first: AttackTarget, unknowns: _Unknowns) -> lanes.Chunk:
        """The compiled L-BFGS chunk for targets like ``first``."""
        return lbfgs_chunker(
            first.model,
            input_shape=first.input_shape,
            batch_size=unknowns.batch,
            num_classes=unknowns.classes,
            learn_labels=unknowns.learn_labels,
            iterations=self.iterations,
            history_size=self.history_size,
            armijo=1e-4 if self.line_search == "armijo" else None,
            pytorch_steps=None if self.line_search == "armijo" else TORCH_MAX_ITER,
            loss=self.loss,
            match=self.match,
            priors=self.objective_priors(),
            stopping=self.stopping(),
            local=simulated(first, self.local_training),
            clients=first.clients,
            learn_noise=unknowns.noise > 0,
            learn_mixing=unknowns.mixing > 0,
        )

    def _problems(
        self,
        targets: list[AttackTarget],
        seeds: list[tf.Tensor],
        labels: list[np.ndarray | None],
        unknowns: _Unknowns,
    ) -> list[lanes.Problem]:
        """One problem per target: its random start (N(0, 1), drawn from its seed), its
        model's weights, its observed update and its labels."""
        weights: dict[int, tuple[tf.Tensor, ...]] = {}
        problems = []
        batch, classes = unknowns.batch, unknowns.classes
        starts = self.learned_starts(targets)
        learned: list[np.ndarray | None] = list(starts) if starts else [None] * len(targets)
        for target, seed, known, images in zip(targets, seeds, labels, learned, strict=True):
            model = target.model
            if id(model) not in weights:  # one tuple per model: lanes broadcasts shared weights
                weights[id(model)] = tuple(v.value for v in model.trainable_variables)
            problems.append(
                lanes.Problem(
                    start=_start(unknowns, seed, images),
                    weights=weights[id(model)],
                    observed=observed_as(target, self.local_training),
                    labels=tf.one_hot(np.zeros(batch) if unknowns.learn_labels else known, classes),
                )
            )
        return problems


def _start(unknowns: _Unknowns, seed: tf.Tensor, images: np.ndarray | None) -> tf.Tensor:
    """A problem's start: N(0, 1) drawn from ``seed``, its images replaced by ``images`` (the
    learned attack's reconstruction) when given."""
    start = tf.random.stateless_normal([unknowns.size], seed=seed)
    if images is None:
        return start
    return tf.concat([tf.constant(images, tf.float32), start[unknowns.pixels :]], 0)


@dataclasses.dataclass(frozen=True)
class _Unknowns:
    """What one DLG problem optimises: the dummy images (``pixels`` values), then the label
    logits when it learns the labels, then the ``mixing`` logits of the client's mixing
    matrix and the ``noise`` values of its noise draw (0 when not learned)."""

    batch: int
    classes: int
    pixels: int
    learn_labels: bool
    mixing: int
    noise: int

    @classmethod
    def of(cls, attack: DLG, first: AttackTarget, *, learn_labels: bool) -> _Unknowns:
        """The unknowns of ``attack`` against targets like ``first``."""
        batch = first.batch_size
        learn_noise = attack.noise == "learn" and noise_width(first.model) > 0
        learn_mixing = attack.mixing == "learn" and batch > 1
        return cls(
            batch=batch,
            classes=first.num_classes,
            pixels=batch * int(np.prod(first.input_shape)),
            learn_labels=learn_labels,
            mixing=batch * batch if learn_mixing else 0,
            noise=batch * noise_width(first.model) if learn_noise else 0,
        )

    @property
    def size(self) -> int:
        """Values of one problem's start point."""
        label_values = self.batch * self.classes if self.learn_labels else 0
        return self.pixels + label_values + self.mixing + self.noise


def _output(
    state: lbfgs.LbfgsState, target: AttackTarget, known: np.ndarray | None, unknowns: _Unknowns
) -> RunOutput:
    """What one finished problem found: its best images and labels, and how the search went."""
    pixels, batch, classes = unknowns.pixels, unknowns.batch, unknowns.classes
    z = state.x_best.numpy()[0]
    iterations = int(state.iterations.numpy()[0])
    if unknowns.learn_labels:
        out_labels = z[pixels : pixels + batch * classes].reshape(batch, classes)
        out_labels = out_labels.argmax(axis=1)
    else:
        out_labels = np.asarray(known)
    return RunOutput(
        images=z[:pixels].reshape(batch, *target.input_shape),
        labels=out_labels.astype(np.int64),
        # A start whose gradient was not finite never moved: a failed attempt,
        # retried from a fresh start like a non-finite loss.
        loss=float(state.f_best.numpy()[0])
        if int(state.reason.numpy()[0]) != lbfgs.NONFINITE
        else float("nan"),
        loss_history=state.history.numpy()[0, :iterations],
        evaluations=int(state.evaluations.numpy()[0]),
        stop_reason=lbfgs.REASONS[int(state.reason.numpy()[0])],
        iterations_used=int(state.spent.numpy()[0]),
    )
