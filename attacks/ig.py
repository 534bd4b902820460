"""Inverting Gradients: Geiping, Bauermeister, Dröge & Moeller, "Inverting Gradients - How easy
is it to break privacy in federated learning?", NeurIPS 2020."""

from __future__ import annotations

import dataclasses

import numpy as np
import tensorflow as tf

from leakbench.attacks.base import (
    ATTACKS,
    RETRIES,
    AttackTarget,
    RunOutput,
    observed_as,
    simulated,
)
from leakbench.attacks.engine import adam, resume
from leakbench.attacks.engine.lanes import stack_rows
from leakbench.attacks.engine.losses import LOSSES
from leakbench.attacks.engine.matching import (
    adam_pieces,
    box,
    stack_weights,
    supports_batches,
)
from leakbench.attacks.labels import recover_labels
from leakbench.attacks.matching import MatchingAttack
from leakbench.attacks.priors import Prior
from leakbench.attacks.priors.tv import (
    REFERENCE_MEAN,
    REFERENCE_STD,
    TotalVariation,
    reference_channels,
)
from leakbench.core.errors import ConfigError
from leakbench.core.params import Alias, Choice, Flag, Int, Number, Registered, param


@ATTACKS.register("ig")
@dataclasses.dataclass(frozen=True)
class InvertingGradients(MatchingAttack):
    """Inverting Gradients (Geiping et al., 2020).

    Optimises dummy images so that their gradient points the same way as the observed one: the
    loss is one minus the cosine similarity of the two gradients with all layers concatenated
    (another matching loss with ``loss``),
    plus ``tv`` times the images' total variation, minimised by Adam (learning rate ``lr``,
    divided by 10 at 3/8, 5/8 and 7/8 of the iterations), optionally on the sign of the
    gradient, with the images clamped to [0, 1] after every step. The labels are the target's
    when the threat model gives them, else recovered from the last layer's gradient first
    (`leakbench.attacks.labels.recover_labels`), as the paper assumes known labels. Every start
    runs the full budget and the start with the lowest loss is kept (never chosen by the
    private image). Batches of up to 64 examples.

    The defaults are the reference implementation's published configuration (breaching's
    ``config/attack/invertinggradients.yaml``: signed Adam at step 0.1, step decay, the box,
    total variation of scale 0.2 computed with zero padding, Gaussian starts) converted into
    leakbench's pixel units. The reference optimises ``u = (x - mean) / std``, the image
    normalised by the CIFAR-10 channel statistics (`leakbench.attacks.priors.tv.REFERENCE_MEAN`,
    ``REFERENCE_STD``; std 0.2470, 0.2435 and 0.2616, their mean 0.2507); leakbench optimises
    the pixels x in [0, 1]. Then:

    - step: ``d loss / du = std * d loss / dx``, so the sign Adam is fed is the same in both
      units, Adam's recursion is the same, and a step of 0.1 in u is a step of 0.1 * std in x:
      ``lr = 0.1 * 0.2507 = 0.02507``, rounded to 0.025;
    - total variation: a difference of u is the difference of x divided by std, so the
      reference's ``0.2 * TV(u)`` is ``0.2 * TV(x) / std``: ``tv = 0.2 * mean(1 / std) =
      0.7985`` (0.2 / 0.2507 = 0.7978), rounded to 0.8 (both definitions are the mean
      absolute difference of neighbouring pixels, summed over the two directions);
    - the box ``u in [-mean / std, (1 - mean) / std]`` is ``x in [0, 1]``; the cosine term is
      the same number in both units;
    - a start ``u ~ N(0, 1)`` is ``x = mean + std * N(0, 1)`` (``init = "gaussian"``), and the
      zero padding of the reference's total variation is padding with the mean in pixels
      (``tv_padding = "mean"``).

    Channel by channel the conversion is exact; one ``lr`` and one ``tv`` serve all channels
    here, within 5% of the reference's per-channel values (its step is 0.0244 to 0.0262 and
    its weight 0.76 to 0.82 in pixel units, as CIFAR-10's channel stds differ). Images that
    are not RGB use the average of the three channels' statistics. (The original repository's
    later ``DEFAULT_CONFIG``, ``inversefed/reconstruction_algorithms.py``, weighs an unpadded
    total variation by 0.1, about 0.4 here; breaching's config says its 0.2 corresponds to it.)

    The paper runs 4,800 (CIFAR-10; the original repository's ``DEFAULT_CONFIG``) to 24,000
    (ImageNet; breaching's default) iterations with 1 to 8 starts; the default here is a
    CPU-sized 2,000, so raise ``iterations`` for paper-scale runs (a trial records its stop
    as ``schedule``, which the budget warning counts as ended on the budget).
    ``benchmarks/ig_reference.py`` compares these defaults with a PyTorch implementation of the
    reference's algorithm on the same images, weights and starts
    (``results/ig_reference/``).

    Args:
        iterations: Adam steps per start.
        lr: Initial Adam learning rate in pixel units (the reference's 0.1 in normalised units
            times the pixel std 0.2507; see above).
        tv: Weight of the total-variation prior (mean absolute difference of neighbouring
            pixels, images in [0, 1]; the reference's 0.2 divided by the pixel std).
        tv_padding: ``"mean"`` (the reference's zero padding, in pixel units: the bottom and
            right edges are compared with the CIFAR-10 channel means) or ``"none"``
            (differences inside the image only); see
            `leakbench.attacks.priors.tv.total_variation`.
        init: ``"gaussian"`` starts, ``mean + std * N(0, 1)`` per pixel with the reference's
            CIFAR-10 channel statistics (clamped into [0, 1] by the box before the first
            step), or ``"uniform"`` U(0, 1) starts.
        signed: Feed Adam the sign of the gradient (the paper's choice).
        loss: The matching loss, a name in `leakbench.attacks.engine.losses.LOSSES`
            (default ``"cosine"``, the paper's; ``"l2"``, ``"l1"`` or a plugin's). The
            defenses' adaptive ``loss`` settings leave it as configured (`not_adaptive`).
        match: ``"all"``, ``"kept"`` (compare only coordinates non-zero in the observed
            gradient: the adaptive answer to pruning and top-k) or ``"features"`` (only the
            feature extractor's tensors: the answer to Soteria and PRECODE).
        local_training: Under FedAvg, ``"simulate"`` the client's local steps or match
            ``"as_gradient"`` (see `leakbench.attacks.dlg.DLG`).
        priors: More terms of the loss, as tables (`leakbench.attacks.priors`); ``tv`` is the
            total-variation prior's weight, so a prior named ``tv`` here needs ``tv = 0``.
        starts: Random starting points, all run for the full budget; the one with the lowest
            final loss (matching loss plus priors) is kept (default 1). The old
            ``restarts = k`` (extra starts) is still accepted as ``starts = k + 1``, with a
            deprecation notice.
        retries: Fresh sets of starts after an attempt whose kept loss is non-finite (default
            0: the kept loss is non-finite only if every start's was).
    """

    name = "ig"
    max_batch_size = 64
    # The defenses' ``loss`` settings (protocol 1) are for dlg and idlg: ig keeps the loss its
    # config gives it, the paper's cosine unless set.
    not_adaptive = ("loss",)

    # Here ``restarts`` counted the starts beyond the first, which all run: now `starts`.
    aliases = (
        Alias(
            "restarts",
            "starts",
            Int(0, 100),
            convert=lambda extra: extra + 1,
            hint="restarts = k is starts = k + 1",
        ),
    )

    # Every start already runs, so by default a non-finite result is not retried.
    retries: int = param(0, RETRIES, doc="fresh sets of starts after a non-finite loss")
    iterations: int = param(2000, Int(1, 1_000_000), doc="Adam steps per start")
    lr: float = param(
        0.025, Number(1e-8, 10.0), doc="initial Adam learning rate, pixel units (0.1 * 0.2507)"
    )
    tv: float = param(
        0.8, Number(0.0, 1e3), doc="weight of the total-variation prior, pixel units (0.2 / 0.2507)"
    )
    tv_padding: str = param(
        "mean", Choice("mean", "none"), doc="total variation against the mean past the edges"
    )
    init: str = param(
        "gaussian", Choice("gaussian", "uniform"), doc="starts: mean + std * N(0, 1), or U(0, 1)"
    )
    signed: bool = param(True, Flag(), doc="feed Adam the sign of the gradient")
    loss: str = param("cosine", Registered(LOSSES), doc="gradient distance", keyed_when_set=True)
    # Up to 101: the 100 extra starts that ``restarts`` allowed.
    starts: int = param(1, Int(1, 101), doc="starting points, all run; the best is kept")
    local_training: str = param(
        "simulate",
        Choice("simulate", "as_gradient"),
        doc="how a FedAvg update is matched",
        keyed_when_set=True,
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self.objective_priors()  # tv and a prior named tv together are refused now

    def objective_priors(self) -> tuple[Prior, ...]:
        """``tv`` as the total-variation prior (when > 0), then the configured ``priors``."""
        extra = super().objective_priors()
        if not self.tv:
            return extra
        if any(p.name == "tv" for p in extra):
            raise ConfigError(
                f"attack {self.name}: give the total-variation weight once, as tv or as the "
                "prior named tv (set tv = 0 to use the prior)"
            )
        return (TotalVariation(weight=self.tv, padding=self.tv_padding), *extra)

    def batch_width(self, target: AttackTarget, requested: int) -> int:
        if not supports_batches(target.model):
            return 1
        return max(1, requested // self.starts)

    def start_points(self, seeds: list[tf.Tensor], shape: tuple[int, ...]) -> tf.Tensor:
        """The flat starting images of every start of every attempt, before the box: row
        ``n * starts + k`` is start ``k`` of the attempt seeded ``seeds[n]``, of ``shape``
        ([batch, H, W, C]) flattened. ``"uniform"``: U(0, 1); ``"gaussian"``: the reference's
        channel mean plus its channel std times N(0, 1), per pixel."""
        pixels = int(np.prod(shape))
        keys = [
            tf.random.experimental.stateless_fold_in(s, k)
            for s in seeds
            for k in range(self.starts)
        ]
        if self.init == "uniform":
            return tf.stack([tf.random.stateless_uniform([pixels], seed=key) for key in keys])
        channels = int(shape[-1])
        mean = tf.constant(reference_channels(REFERENCE_MEAN, channels), tf.float32)
        std = tf.constant(reference_channels(REFERENCE_STD, channels), tf.float32)
        noise = tf.stack([tf.random.stateless_normal([pixels], seed=key) for key in keys])
        # Flat NHWC order: the channel is the fastest-varying index.
        return tf.reshape(
            tf.reshape(noise, [len(keys), -1, channels]) * std + mean, [len(keys), pixels]
        )

    def run_many(self, targets: list[AttackTarget], seeds: list[tf.Tensor]) -> list[RunOutput]:
        """All starts of all targets as problems of one compiled Adam loop (one problem per
        call for models without a batched copy)."""
        first = targets[0]
        starts = self.starts
        batch, classes = first.batch_size, first.num_classes
        advance, finish = adam_pieces(
            first.model,
            input_shape=first.input_shape,
            batch_size=batch,
            num_classes=classes,
            iterations=self.iterations,
            lr=self.lr,
            signed=self.signed,
            loss=self.loss,
            priors=self.objective_priors(),
            starts=starts,
            match=self.match,
            local=simulated(first, self.local_training),
            clients=first.clients,
        )
        labels = [
            np.asarray(t.labels)
            if t.labels is not None
            else recover_labels(t.model, t.gradients, batch, classes)
            for t in targets
        ]
        # Problem n * starts + k is start k of target n.
        z0 = self.start_points(seeds, (batch, *first.input_shape))
        learned = self.learned_starts(targets)
        if learned is not None:  # start 0 of each target from the learned reconstruction
            rows = [[n * starts] for n in range(len(targets))]
            z0 = tf.tensor_scatter_nd_update(z0, rows, np.stack(learned))
        weights = stack_weights(targets)
        observed = stack_rows([observed_as(t, self.local_training) for t in targets])
        onehot = tf.one_hot(np.stack(labels), classes)

        def problems(t: tf.Tensor) -> tf.Tensor:
            return tf.repeat(t, starts, axis=0)

        weights, observed = tuple(map(problems, weights)), tuple(map(problems, observed))
        onehot = problems(onehot)
        step = len(z0) if supports_batches(first.model) else 1
        parts = []
        for i in range(0, len(z0), step):
            # One loop per part; with an active saver it runs in chunks and resumes
            # (`leakbench.attacks.engine.resume`), tagged by what sets its numbers.
            args = (tuple(w[i : i + step] for w in weights),
                    tuple(o[i : i + step] for o in observed), onehot[i : i + step])  # fmt: skip
            tag = resume.fingerprint(self.name, self.params(), i, z0[i : i + step])

            def chunk(state: adam.AdamState, stop: int, args: tuple = args) -> adam.AdamState:
                return advance((tuple(state), tf.constant(stop)), *args)

            state = resume.run_chunks(
                adam.initial(z0[i : i + step], self.iterations, box), chunk, self.iterations, tag
            )
            parts.append(finish(tuple(state), *args))
        z = np.concatenate([p.x.numpy() for p in parts])
        loss = np.concatenate([p.loss.numpy() for p in parts]).reshape(len(targets), starts)
        history = np.concatenate([p.history.numpy() for p in parts])
        outs = []
        for n, target in enumerate(targets):
            k = int(np.argmin(np.where(np.isfinite(loss[n]), loss[n], np.inf)))
            outs.append(
                RunOutput(
                    images=z[n * starts + k].reshape(batch, *target.input_shape),
                    labels=labels[n].astype(np.int64),
                    loss=float(loss[n, k]),
                    loss_history=history[n * starts + k],
                    evaluations=starts * (self.iterations + 1),
                    # Adam follows its learning-rate schedule to the end; that is not a
                    # search cut short by a cap, and more iterations stretch the schedule.
                    stop_reason="schedule",
                    iterations_used=self.iterations,
                )
            )
        return outs
