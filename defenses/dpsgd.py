"""DP-SGD: per-example clipping, then Gaussian noise on the sum (an example-level defense)."""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import ClassVar

import tensorflow as tf

from leakbench.core.params import REQUIRED, Int, Number, check, param
from leakbench.defenses.base import (
    DEFENSES,
    STYLE,
    AdaptiveSetting,
    ClientView,
    Defense,
    Gradients,
    Sample,
    tensor_seed,
)

# What `DPSGD.epsilon` accepts besides the steps.
_SAMPLING_RATE = Number(0.0, 1.0, low_open=True)
_DELTA = Number(0.0, 1.0, low_open=True, high_open=True)


@DEFENSES.register("dpsgd")
@dataclasses.dataclass(frozen=True)
class DPSGD(Defense):
    """Clips each example's gradient, sums, adds Gaussian noise once and divides by the batch size.

    The input is the per-example gradients (``level = "example"``): tensor ``j`` has shape
    ``[B, *variable_j.shape]``. With ``g_i`` the gradient of example ``i`` over *all* tensors and
    ``||g_i||`` its L2 norm over all of them, the output is the batch gradient::

        (sum_i g_i * min(1, norm / ||g_i||) + N(0, (noise_multiplier * norm)**2 I)) / B

    with ``B`` the batch size read from the input at run time. The clip factor is computed as
    ``norm / max(||g_i||, norm)``, which is the same value and needs no guard for a zero
    gradient. Clipping is per example, so one outlier example cannot dominate the sum (batch
    clipping, ``clip``, would scale all examples down together). Tensor ``j`` draws its noise
    with the stateless seed ``tensor_seed(seed, j)``; noise is drawn and the arithmetic done in
    float32 (float64 if any tensor is float64) and cast back to each tensor's dtype. A
    non-finite per-example gradient makes the output non-finite (the trainer skips such updates).
    Tensors without a common leading batch axis (i.e. batch gradients passed by mistake) raise
    ``ValueError`` where the static shapes show it; `defended_gradients` feeds the right input.
    The multiplication by ``1 / B`` is done as such rather than as a division, so that results
    are bit-identical eagerly and inside a ``tf.function`` (see the comment in the code).

    On the attack side, the observed gradient of a batch is the output above. The mechanism
    whose privacy `epsilon` accounts for samples each batch by Poisson sampling and divides by
    the *expected* batch size instead, a constant (the realised ``B`` would reveal who is in the
    batch, and may be 0): `apply_sampled`, which DP training releases
    (`leakbench.client.training.run_epochs`).

    Attributes:
        norm: Per-example clip bound ``C``, ``> 0``: the largest L2 norm, over all tensors of
            one example, that an example's gradient keeps; in gradient units.
        noise_multiplier: ``z >= 0``. The noise added to the *sum* of the clipped gradients has
            absolute standard deviation ``z * C`` per entry, so the noise on the returned mean
            has standard deviation ``z * C / B``. ``0`` gives clipping without noise (and no
            privacy guarantee: `epsilon` is infinite).

    Reference:
        Abadi, Chu, Goodfellow, McMahan, Mironov, Talwar and Zhang. "Deep Learning with
        Differential Privacy". CCS 2016 (Algorithm 1; privacy accounting by the moments
        accountant, here its Renyi-DP form: Mironov, "Renyi Differential Privacy", CSF 2017).
    """

    name: ClassVar[str] = "dpsgd"
    level: ClassVar[str] = "example"
    summary: ClassVar[str] = (
        "DP-SGD (Abadi et al. 2016): each example's gradient clipped to L2 `norm`, summed, "
        "Gaussian noise of std `noise_multiplier * norm` added, divided by the batch size"
    )
    samples: ClassVar[tuple[Sample, ...]] = (
        Sample({"norm": 1.0, "noise_multiplier": 1.1}, seeded=True),
    )
    strength: ClassVar[tuple[str, int] | None] = ("noise_multiplier", 1)
    # The clipping half of DP-SGD rescales each example's gradient (the noise half no attack
    # can undo): the attack that targets clipping is the scale-blind loss.
    adaptive: ClassVar[tuple[AdaptiveSetting, ...]] = (AdaptiveSetting({"loss": "cosine"}),)

    norm: float = param(REQUIRED, Number(0.0, low_open=True), doc="per-example clip bound")
    noise_multiplier: float = param(
        REQUIRED, Number(0.0), doc="noise standard deviation over the clip bound"
    )

    def __call__(self, grads: Gradients, *, seed: tf.Tensor) -> Gradients:
        return self._release(grads, seed, None)

    def apply_sampled(
        self,
        grads: Gradients,
        *,
        seed: tf.Tensor,
        expected_size: int | tf.Tensor,
        view: ClientView | None = None,
    ) -> Gradients:
        """The mechanism `epsilon` analyses, for a Poisson-sampled batch: the noisy sum of the
        clipped per-example gradients divided by ``expected_size`` (the sampling rate times the
        examples trained on) instead of by the batch's own size, which is private under Poisson
        sampling and may be 0 (then the sum is zero and the release is the noise alone). The
        noise is `__call__`'s for the same seed."""
        del view
        return self._release(grads, seed, expected_size)

    def _release(
        self, grads: Gradients, seed: tf.Tensor, expected_size: int | tf.Tensor | None
    ) -> Gradients:
        """`__call__` (``expected_size`` None: divided by the realised batch size) or
        `apply_sampled`."""
        grads = [tf.convert_to_tensor(g) for g in grads]
        if not grads:
            return []
        leading = {g.shape[0] if g.shape.rank else None for g in grads}
        if any(g.shape.rank == 0 for g in grads) or len(leading - {None}) > 1:
            # A programming error, not a config one: batch gradients were passed where the
            # per-example gradients belong. Caught statically where the shapes allow it.
            shapes = [g.shape.as_list() if g.shape.rank is not None else None for g in grads]
            raise ValueError(
                "dpsgd is example-level: every tensor needs the same leading batch axis, got "
                f"shapes {shapes}; compute the shared gradient with defended_gradients"
            )
        work = tf.float64 if any(g.dtype == tf.float64 for g in grads) else tf.float32
        batch = tf.shape(grads[0])[0]
        # [B, n_j] views; a reshape (not a reduction over listed axes) also works when the rank
        # is unknown at trace time. n_j is given where the shape shows it, so that an empty
        # batch (B = 0, which `apply_sampled` meets) has views too.
        flats = [tf.reshape(tf.cast(g, work), _flat_shape(g, batch)) for g in grads]
        sq_norms = tf.add_n([tf.reduce_sum(tf.square(f), axis=1) for f in flats])
        factor = self.norm / tf.maximum(tf.sqrt(sq_norms), tf.constant(self.norm, work))
        std = self.noise_multiplier * self.norm
        # Multiplying by 1 / B rather than dividing by B: with a static batch size, Grappler's
        # constant folding rewrites the division into exactly this product inside a tf.function,
        # and writing it so in both modes keeps graph and eager results bit-identical.
        count = batch if expected_size is None else expected_size
        inverse_count = 1.0 / tf.cast(count, work)
        out = []
        for j, (g, flat) in enumerate(zip(grads, flats, strict=True)):
            total = tf.reduce_sum(flat * factor[:, None], axis=0)
            shape = g.shape[1:] if g.shape[1:].is_fully_defined() else tf.shape(g)[1:]
            total = tf.reshape(total, shape)
            if std > 0.0:
                total += tf.random.stateless_normal(
                    tf.shape(total), seed=tensor_seed(seed, j), stddev=std, dtype=work
                )
            out.append(tf.cast(total * inverse_count, g.dtype))
        return out

    def epsilon(self, sampling_rate: float, steps: int, delta: float) -> float:
        """The ``epsilon`` of ``(epsilon, delta)``-DP after ``steps`` steps of DP-SGD.

        Computed with Google's ``dp-accounting`` Renyi-DP accountant for the Poisson-subsampled
        Gaussian mechanism composed ``steps`` times (Mironov, Talwar and Zhang, "Renyi
        Differential Privacy of the Sampled Gaussian Mechanism", 2019). The bound assumes
        Poisson sampling with rate ``sampling_rate`` and the noisy sum over the expected batch
        size (`apply_sampled`), which is how the trainer trains a defense with an accountant;
        shuffled fixed-size batches can be less private than this figure (Chua et al., ICML
        2024). Add/remove-one-example adjacency, as in Abadi et al.

        Args:
            sampling_rate: Probability that an example is in a batch, in ``(0, 1]`` (batch
                size / training set size).
            steps: Number of noisy steps, an integer ``>= 0``.
            delta: Target ``delta``, in ``(0, 1)``.

        Returns:
            ``epsilon`` (``0`` after no steps); ``inf`` when ``noise_multiplier`` is ``0``.

        Raises:
            ConfigError: An argument is out of range.
        """
        where = f"defense {self.name}"
        check(sampling_rate, _SAMPLING_RATE, where, "sampling_rate", STYLE)
        check(delta, _DELTA, where, "delta", STYLE)
        check(steps, Int(0), where, "steps", STYLE)
        if steps == 0:
            return 0.0
        if self.noise_multiplier == 0.0:
            return math.inf
        from dp_accounting import rdp

        accountant = rdp.RdpAccountant()
        absl = logging.getLogger("absl")
        absl.addFilter(_unconverged_orders)
        try:
            accountant.compose(self.dp_event(sampling_rate, steps))
            return float(accountant.get_epsilon(delta))
        finally:
            absl.removeFilter(_unconverged_orders)

    def dp_event(self, sampling_rate: float, steps: int) -> object:
        """``steps`` compositions of the Poisson-subsampled Gaussian mechanism (rate
        ``sampling_rate``, noise multiplier ``z``), as a dp-accounting event."""
        # Imported here so that the benchmark works without dp-accounting when no one asks for
        # an epsilon.
        import dp_accounting

        sampled = dp_accounting.PoissonSampledDpEvent(
            sampling_rate, dp_accounting.GaussianDpEvent(self.noise_multiplier)
        )
        return dp_accounting.SelfComposedDpEvent(sampled, steps)

    def gaussian_score(self) -> bool:
        return self.noise_multiplier > 0.0

    def independent_canaries(self) -> bool:
        # Each canary is its own example, clipped alone; the noise is drawn per coordinate.
        return self.noise_multiplier > 0.0

    def data_independent(self) -> bool:
        # Each example is clipped alone and the noise reads no example.
        return True

    def reconstruction_bound(self, kappa: float, clients: int = 1, releases: int = 1) -> float:
        """The largest chance that any attacker reconstructs a given example from one update.

        One update is one release of the Gaussian mechanism: the sum of the clipped gradients
        (sensitivity ``C`` under adding or removing the example) plus noise of standard
        deviation ``z * C``; under secure aggregation of ``clients`` DP-SGD clients, each adding
        its own noise, the server sees the sum, whose noise has standard deviation
        ``z * C * sqrt(clients)``. If the mechanism is ``(epsilon, delta(epsilon))``-DP for every
        ``epsilon``, an attacker whose reconstruction succeeds with chance ``kappa`` without the
        example succeeds with chance at most ``exp(epsilon) * kappa + delta(epsilon)`` with it
        (reconstruction robustness: Balle, Cherubin and Hayes, "Reconstructing Training Data
        with Informed Adversaries", S&P 2022; Hayes, Mahloujifar and Balle, "Bounding Training
        Data Reconstruction in DP-SGD", NeurIPS 2023). The bound returned is the minimum of that
        over a grid of ``epsilon`` in ``[0, ln(1 / kappa)]`` (beyond it the bound exceeds 1),
        with ``delta(epsilon)`` from ``dp-accounting``'s privacy-loss distribution of the
        Gaussian mechanism, rounded pessimistically: a grid minimum is never below the
        infimum, so the value is a valid upper bound. For one Gaussian release it equals
        ``Phi(Phi^-1(kappa) + 1 / (z * sqrt(clients)))`` to within the grid. A client that
        takes several noisy local steps releases its example up to ``releases`` times: the
        composition of ``k`` such releases is one release at noise ``z / sqrt(k)`` (Gaussian
        DP composes as ``mu * sqrt(k)``).

        Args:
            kappa: The attacker's chance of success without the example (its prior), in
                ``(0, 1)``.
            clients: The DP-SGD clients whose noisy sums the server sees added, ``>= 1``.
            releases: The noisy steps an example takes part in before the server sees the
                update (a client's local steps; 1 under FedSGD), ``>= 1``.

        Returns:
            The bound, in ``[kappa, 1]``; ``1`` when ``noise_multiplier`` is ``0``.

        Raises:
            ConfigError: An argument is out of range.
        """
        where = f"defense {self.name}"
        check(kappa, _DELTA, where, "kappa", STYLE)
        check(clients, Int(1), where, "clients", STYLE)
        check(releases, Int(1), where, "releases", STYLE)
        if self.noise_multiplier == 0.0:
            return 1.0
        import numpy as np
        from dp_accounting.pld import privacy_loss_mechanism

        loss = privacy_loss_mechanism.GaussianPrivacyLoss(
            self.noise_multiplier * math.sqrt(clients / releases), sensitivity=1.0
        )
        grid = np.linspace(0.0, math.log(1.0 / kappa), 2001)
        bounds = [math.exp(e) * kappa + loss.get_delta_for_epsilon(float(e)) for e in grid]
        return float(min(1.0, max(kappa, min(bounds))))


def _flat_shape(g: tf.Tensor, batch: tf.Tensor) -> tf.Tensor | list:
    """The shape ``[B, n]`` that views ``g`` (``[B, ...]``) as one row per example: ``n`` the
    static size of an example's tensor where the shape gives it, else inferred."""
    size = g.shape[1:].num_elements() if g.shape.rank is not None else None
    return tf.stack([batch, -1]) if size is None else [batch, size]


def _unconverged_orders(record: logging.LogRecord) -> bool:
    """Drops dp-accounting's warning that a fractional Renyi order's series did not converge:
    the accountant leaves that order out and the epsilon it returns, the minimum over the other
    orders, is still a valid bound, so the warning is nothing a user can act on (the default
    run's DP recipe printed dozens of them)."""
    return "failed to converge" not in record.getMessage()
