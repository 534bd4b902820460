"""PyTorch reference implementation of the DLG attack, for timing and success comparisons.

This module reimplements, in PyTorch, the algorithm published with Zhu et al., "Deep Leakage from
Gradients" (NeurIPS 2019; the ``main.py`` of the authors' repository) against the DLG LeNet:
the attacker matches the observed single-example gradient by optimising a dummy image and dummy
label logits jointly with ``torch.optim.LBFGS`` (no line search), calling ``optimizer.step`` a
fixed number of times. It exists so that benchmarks can compare leakbench's TensorFlow attack with
the published method on the same weights, image and start point; it is not used by leakbench.

PyTorch is optional and is not a project dependency: this module imports it lazily, and callers
should check `available` before calling `dlg_attack`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import torch

__all__ = ["TorchResult", "available", "dlg_attack"]

# The DLG LeNet: 12 filters of 5x5 in every convolution, zero padding 2, these strides.
_FILTERS = 12
_KERNEL = 5
_PADDING = 2
_STRIDES = (2, 2, 1)


def available() -> bool:
    """Whether PyTorch can be imported here.

    Returns:
        True if ``import torch`` succeeds.
    """
    try:
        import torch  # noqa: F401
    except Exception:  # a broken install can raise OSError etc., not only ImportError
        return False
    return True


@dataclass
class TorchResult:
    """Outcome of one `dlg_attack` run.

    Attributes:
        images: ``[H, W, C]`` float32 reconstruction in NHWC layout, not clipped to [0, 1].
        label: Argmax of the final dummy label logits.
        seconds: Wall time of the attack's optimizer steps, excluding model building, the
            observed-gradient computation and the optimizer's construction.
        evaluations: Number of closure calls, i.e. loss and gradient evaluations.
        loss: Gradient-matching loss at the returned reconstruction and label logits.
    """

    images: np.ndarray
    label: int
    seconds: float
    evaluations: int
    loss: float


def _spatial_size(size: int) -> int:
    """Height or width after the three convolutions (PyTorch's output-size formula)."""
    for stride in _STRIDES:
        size = (size + 2 * _PADDING - _KERNEL) // stride + 1
    return size


def _build_lenet(
    keras_weights: Sequence[np.ndarray], image_shape: tuple[int, int, int], num_classes: int
) -> torch.nn.Sequential:
    """The DLG LeNet in PyTorch, holding the given Keras weights.

    Args:
        keras_weights: Keras-layout weights: conv1 kernel, conv1 bias, conv2 kernel, conv2 bias,
            conv3 kernel, conv3 bias, dense kernel, dense bias.
        image_shape: ``(H, W, C)`` of one input.
        num_classes: Number of logits.

    Returns:
        The network, in float32, taking NCHW inputs.

    Raises:
        ValueError: If the weights do not fit this architecture and input shape.
    """
    import torch
    from torch import nn

    height, width, channels = image_shape
    out_h, out_w = _spatial_size(height), _spatial_size(width)
    layers: list[nn.Module] = []
    in_channels = channels
    for stride in _STRIDES:
        layers += [
            nn.Conv2d(in_channels, _FILTERS, _KERNEL, stride=stride, padding=_PADDING),
            nn.Sigmoid(),
        ]
        in_channels = _FILTERS
    layers += [nn.Flatten(), nn.Linear(_FILTERS * out_h * out_w, num_classes)]
    net = nn.Sequential(*layers).to(torch.float32)

    if len(keras_weights) != 8:
        raise ValueError(f"expected 8 LeNet weight arrays, got {len(keras_weights)}")
    converted = []
    for kernel, bias in zip(keras_weights[0:6:2], keras_weights[1:6:2], strict=True):
        # Keras convolution kernels are [kh, kw, in, out]; PyTorch's are [out, in, kh, kw].
        converted += [np.transpose(kernel, (3, 2, 0, 1)), bias]
    dense_kernel, dense_bias = keras_weights[6], keras_weights[7]
    if dense_kernel.shape != (out_h * out_w * _FILTERS, num_classes):
        raise ValueError(
            f"dense kernel has shape {dense_kernel.shape}, expected "
            f"{(out_h * out_w * _FILTERS, num_classes)} for input shape {image_shape}"
        )
    # Keras flattens NHWC feature maps in (h, w, c) order, PyTorch flattens NCHW in (c, h, w)
    # order, so the dense kernel's rows are permuted as well as transposed to [out, in].
    dense = dense_kernel.reshape(out_h, out_w, _FILTERS, num_classes).transpose(3, 2, 0, 1)
    converted += [dense.reshape(num_classes, -1), dense_bias]

    with torch.no_grad():
        for param, value in zip(net.parameters(), converted, strict=True):
            if tuple(param.shape) != value.shape:
                raise ValueError(f"weight of shape {value.shape} for a {tuple(param.shape)} slot")
            param.copy_(torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32)))
    return net


def _onehot_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of ``sum(-targets * log_softmax(logits))``, the paper's criterion.

    Written out rather than with ``F.cross_entropy`` so that soft targets are twice
    differentiable in exactly the way the paper's code is.
    """
    import torch

    return torch.mean(torch.sum(-targets * torch.log_softmax(logits, dim=-1), dim=-1))


def _nhwc_to_nchw(pixels: np.ndarray, image_shape: tuple[int, int, int]) -> torch.Tensor:
    """A ``[1, C, H, W]`` float32 tensor (own memory) from NHWC pixels of one image."""
    import torch

    nhwc = np.asarray(pixels, dtype=np.float32).reshape(1, *image_shape)
    return torch.from_numpy(np.ascontiguousarray(nhwc.transpose(0, 3, 1, 2)))


def dlg_attack(
    keras_weights: list[np.ndarray],
    image: np.ndarray,
    label: int,
    num_classes: int,
    start: np.ndarray,
    *,
    steps: int = 300,
    max_iter: int = 20,
    history_size: int = 100,
    lr: float = 1.0,
    threads: int | None = None,
) -> TorchResult:
    """Runs the published DLG attack on one example in PyTorch.

    The observed gradient is that of the one-hot cross-entropy of ``(image, label)`` with respect
    to every LeNet parameter. The attack then optimises a dummy image and dummy label logits
    (softmaxed into a soft label), starting from ``start``, to minimise the summed squared
    difference between their gradient and the observed one, with ``steps`` calls of
    ``LBFGS.step`` (each up to ``max_iter`` iterations, no line search), as in the paper's code.

    Args:
        keras_weights: LeNet weights in Keras layout, in the order conv1 kernel, conv1 bias,
            conv2 kernel, conv2 bias, conv3 kernel, conv3 bias, dense kernel, dense bias.
        image: ``[H, W, C]`` float32 private image in [0, 1] (NHWC).
        label: The private label.
        num_classes: Number of classes (logits).
        start: Flat float32 start point: ``H*W*C`` dummy pixels in NHWC order, then
            ``num_classes`` dummy label logits.
        steps: Number of ``optimizer.step(closure)`` calls.
        max_iter: LBFGS iterations per step (PyTorch's default).
        history_size: LBFGS history length (PyTorch's default).
        lr: LBFGS learning rate (PyTorch's default).
        threads: If given, ``torch.set_num_threads`` for the duration of the call.

    Returns:
        The reconstruction (NHWC, unclipped), the dummy label's argmax, the attack's wall time,
        the number of closure calls and the final gradient-matching loss. If the loss stops
        being finite the attack stops early and the result may hold NaNs.

    Raises:
        ImportError: If PyTorch is not installed.
        ValueError: If shapes do not match.
    """
    import torch

    image = np.asarray(image, dtype=np.float32)
    if image.ndim != 3:
        raise ValueError(f"image must be [H, W, C], got shape {image.shape}")
    image_shape = (int(image.shape[0]), int(image.shape[1]), int(image.shape[2]))
    num_pixels = int(np.prod(image_shape))
    start = np.asarray(start, dtype=np.float32).reshape(-1)
    if start.size != num_pixels + num_classes:
        raise ValueError(f"start has {start.size} values, expected {num_pixels + num_classes}")
    if not 0 <= label < num_classes:
        raise ValueError(f"label {label} is outside [0, {num_classes})")

    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        net = _build_lenet(keras_weights, image_shape, num_classes)
        params = list(net.parameters())

        # The client's update: gradient of its loss on the private example, held as constants.
        target = torch.zeros(1, num_classes, dtype=torch.float32)
        target[0, label] = 1.0
        private_loss = _onehot_cross_entropy(net(_nhwc_to_nchw(image, image_shape)), target)
        observed = [g.detach().clone() for g in torch.autograd.grad(private_loss, params)]

        dummy_data = _nhwc_to_nchw(start[:num_pixels], image_shape).requires_grad_(True)
        dummy_label = (
            torch.from_numpy(start[num_pixels:].copy()).reshape(1, num_classes).requires_grad_(True)
        )

        def matching_loss(create_graph: bool) -> torch.Tensor:
            """Squared distance between the dummy example's gradient and the observed one."""
            dummy_loss = _onehot_cross_entropy(net(dummy_data), torch.softmax(dummy_label, dim=-1))
            dummy_grads = torch.autograd.grad(dummy_loss, params, create_graph=create_graph)
            total = torch.zeros((), dtype=torch.float32)
            for dummy_grad, observed_grad in zip(dummy_grads, observed, strict=True):
                total = total + ((dummy_grad - observed_grad) ** 2).sum()
            return total

        evaluations = 0
        last_loss = 0.0

        # Built before the clock starts: the first optimizer a process constructs imports
        # torch._dynamo lazily (about 2 s here), a one-off cost that is not the attack's.
        optimizer = torch.optim.LBFGS(
            [dummy_data, dummy_label], lr=lr, max_iter=max_iter, history_size=history_size
        )

        def closure() -> torch.Tensor:
            nonlocal evaluations, last_loss
            optimizer.zero_grad()
            grad_diff = matching_loss(create_graph=True)
            # A plain backward(), as the paper's code does: it also fills the network
            # parameters' .grad, which nothing reads, but that cost belongs to the reference.
            grad_diff.backward()
            evaluations += 1
            last_loss = grad_diff.item()
            return grad_diff

        began = time.perf_counter()
        for _ in range(steps):
            optimizer.step(closure)
            # Once the loss is NaN (or infinite) every later step is wasted work; the caller
            # scores the NaN reconstruction as a failure.
            if not math.isfinite(last_loss):
                break
        seconds = time.perf_counter() - began

        # Not the last closure value: LBFGS moves after its last evaluation in a step, so the
        # loss is recomputed at the returned point (untimed, uncounted, no graph needed).
        final_loss = float(matching_loss(create_graph=False).item())
        reconstruction = dummy_data.detach().numpy()[0].transpose(1, 2, 0)
        logits = dummy_label.detach().numpy()[0]
    finally:
        torch.set_num_threads(previous_threads)

    return TorchResult(
        images=np.ascontiguousarray(reconstruction, dtype=np.float32),
        label=int(np.argmax(logits)),
        seconds=seconds,
        evaluations=evaluations,
        loss=final_loss,
    )
