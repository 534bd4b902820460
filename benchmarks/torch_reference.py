"""PyTorch reference implementations of the DLG and Inverting Gradients attacks, for timing and
success comparisons.

This module reimplements, in PyTorch, the algorithm published with Zhu et al., "Deep Leakage from
Gradients" (NeurIPS 2019; the ``main.py`` of the authors' repository) against the DLG LeNet:
the attacker matches the observed single-example gradient by optimising a dummy image and dummy
label logits jointly with ``torch.optim.LBFGS`` (no line search), calling ``optimizer.step`` a
fixed number of times. It exists so that benchmarks can compare leakbench's TensorFlow attack with
the published method on the same weights, image and start point; it is not used by leakbench.

`ig_attack` does the same for Inverting Gradients (Geiping et al., NeurIPS 2020) against the
``convnet`` (`leakbench.components.models.convnet`), written from the paper's algorithm and the
reference implementation's published configuration
(``breaching/config/attack/invertinggradients.yaml`` of the authors' breaching repository, whose
README the original ``invertinggradients`` repository points to): the dummy image is optimised in
the reference's normalised units ``u = (x - mean) / std`` (CIFAR-10 channel statistics) from a N(0,
1) start, by Adam at step 0.1 on the sign of the gradient, the step divided by 10 at 3/8, 5/8 and
7/8 of the iterations, projected after every step onto the box that maps to [0, 1] pixels; the loss
is one minus the cosine similarity of the parameter gradients (all tensors concatenated) plus 0.2
times the zero-padded total variation of ``u``. The network itself takes pixels, as leakbench's
does, so it is fed ``mean + std * u``.

PyTorch is optional and is not a project dependency: this module imports it lazily, and callers
should check `available` before calling `dlg_attack` or `ig_attack`.
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

__all__ = [
    "TorchIGResult",
    "TorchResult",
    "available",
    "convnet_gradients",
    "convnet_relu_inputs",
    "dlg_attack",
    "ig_attack",
]

# The DLG LeNet: 12 filters of 5x5 in every convolution, zero padding 2, these strides.
_FILTERS = 12
_KERNEL = 5
_PADDING = 2
_STRIDES = (2, 2, 1)

# The convnet: 3x3 convolutions (stride 1, zero padding 1) of these multiples of its width, each
# followed by BatchNorm and ReLU, with a 3x3 max pool of stride 3 after the blocks listed here.
_CONVNET_MULTIPLES = (1, 2, 2, 4, 4, 4, 4, 4)
_CONVNET_POOLED = (5, 7)
# BatchNorm's epsilon in leakbench's models (PyTorch's default).
_BN_EPSILON = 1e-5
# The CIFAR-10 channel statistics of the reference's normalisation (inversefed/consts.py).
CIFAR10_MEAN = (0.4914672374725342, 0.4822617471218109, 0.4467701315879822)
CIFAR10_STD = (0.24703224003314972, 0.24348513782024384, 0.26158785820007324)


def _checked_inputs(
    image: np.ndarray, start: np.ndarray, label: int, num_classes: int, extra: int
) -> tuple[np.ndarray, np.ndarray, tuple[int, int, int]]:
    """The image as float32 [H, W, C], the flat float32 start (the image's pixels and ``extra``
    more values), and the image's shape; a ValueError on a wrong shape, size or label."""
    image = np.asarray(image, dtype=np.float32)
    if image.ndim != 3:
        raise ValueError(f"image must be [H, W, C], got shape {image.shape}")
    shape = (int(image.shape[0]), int(image.shape[1]), int(image.shape[2]))
    start = np.asarray(start, dtype=np.float32).reshape(-1)
    expected = int(np.prod(shape)) + extra
    if start.size != expected:
        raise ValueError(f"start has {start.size} values, expected {expected}")
    if not 0 <= label < num_classes:
        raise ValueError(f"label {label} is outside [0, {num_classes})")
    return image, start, shape


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
    # A copy: for one channel the transpose is a view, and the attack writes into its tensor.
    return torch.from_numpy(nhwc.transpose(0, 3, 1, 2).copy())


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
    log_of_softmax: bool = False,
    converge_below: float | None = None,
    keep_best: bool = False,
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
        log_of_softmax: Score the dummy example with ``log(softmax(logits))`` instead of
            ``log_softmax(logits)``, as the DLG branch of the iDLG paper's code (``iDLG.py``)
            does. The two differ only where a softmax value underflows to 0: then the former is
            infinite and its gradient NaN.
        converge_below: If given, stop once the loss after a step is below it, checked after
            every tenth step from the first, as ``iDLG.py`` does with 1e-6.
        keep_best: Return the point with the lowest finite loss among those evaluated and
            the last iterate, as leakbench's attacks do, instead of the last iterate (the
            paper's code).

    Returns:
        The reconstruction (NHWC, unclipped), the dummy label's argmax, the attack's wall time,
        the number of closure calls and the final gradient-matching loss. If the loss stops
        being finite the attack stops early and the result may hold NaNs.

    Raises:
        ImportError: If PyTorch is not installed.
        ValueError: If shapes do not match.
    """
    import torch

    image, start, image_shape = _checked_inputs(image, start, label, num_classes, num_classes)
    num_pixels = int(np.prod(image_shape))

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
            soft_label = torch.softmax(dummy_label, dim=-1)
            if log_of_softmax:
                log_probs = torch.log(torch.softmax(net(dummy_data), dim=-1))
                dummy_loss = torch.mean(torch.sum(-soft_label * log_probs, dim=-1))
            else:
                dummy_loss = _onehot_cross_entropy(net(dummy_data), soft_label)
            dummy_grads = torch.autograd.grad(dummy_loss, params, create_graph=create_graph)
            total = torch.zeros((), dtype=torch.float32)
            for dummy_grad, observed_grad in zip(dummy_grads, observed, strict=True):
                total = total + ((dummy_grad - observed_grad) ** 2).sum()
            return total

        evaluations = 0
        last_loss = 0.0
        best: list = [math.inf, None, None]  # loss, image, label logits of the best point

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
            if keep_best and last_loss < best[0]:  # NaN compares false
                best[:] = [last_loss, dummy_data.detach().clone(), dummy_label.detach().clone()]
            return grad_diff

        began = time.perf_counter()
        for step in range(steps):
            optimizer.step(closure)
            # Once the loss is NaN (or infinite) every later step is wasted work; the caller
            # scores the NaN reconstruction as a failure.
            if not math.isfinite(last_loss):
                break
            if converge_below is not None and step % 10 == 0:
                # iDLG.py's test: the loss at the point the step left, after every tenth step.
                if float(matching_loss(create_graph=False).item()) < converge_below:
                    break
        seconds = time.perf_counter() - began

        # Not the last closure value: LBFGS moves after its last evaluation in a step, so the
        # loss is recomputed at the returned point (untimed, uncounted, no graph needed).
        # The point the last step left has not been evaluated yet: it competes too.
        if keep_best and best[1] is not None and not matching_loss(False).item() <= best[0]:
            with torch.no_grad():
                dummy_data.copy_(best[1])
                dummy_label.copy_(best[2])
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


@dataclass
class TorchIGResult:
    """Outcome of one `ig_attack` run.

    Attributes:
        images: ``[H, W, C]`` float32 reconstruction in pixel units (``mean + std * u`` of the
            kept iterate), NHWC.
        seconds: Wall time of the optimisation loop, excluding model building and the observed
            gradient.
        evaluations: Number of loss and gradient evaluations.
        loss: Total loss (matching loss plus the weighted total variation) at the kept iterate.
        matching_loss: One minus the cosine similarity of the gradients there.
        initial_loss: Total loss at the start.
    """

    images: np.ndarray
    seconds: float
    evaluations: int
    loss: float
    matching_loss: float
    initial_loss: float


def _convnet_sizes(height: int, width: int) -> list[tuple[int, int]]:
    """The pool window after each pooled block (leakbench's rule: 3x3, shrunk to a feature map
    smaller than 3) and the final spatial size, for an input of ``height`` x ``width``."""
    pools = []
    for _ in _CONVNET_POOLED:
        pool = (min(3, height), min(3, width))
        pools.append(pool)
        height, width = height // pool[0], width // pool[1]
    return [*pools, (height, width)]


def _convnet_layout(
    keras_arrays: Sequence[np.ndarray], image_shape: tuple[int, int, int], width: int
) -> list[np.ndarray]:
    """Keras-layout convnet arrays (weights or their gradients, in ``trainable_variables``
    order: per block the convolution kernel and bias and BatchNorm's gamma and beta, then the
    dense kernel and bias) rearranged into the order and layout of the PyTorch network's
    parameters. The rearrangement is a permutation, so it maps gradients as it maps weights.

    Raises:
        ValueError: If the arrays do not fit this architecture and input shape.
    """
    blocks = len(_CONVNET_MULTIPLES)
    if len(keras_arrays) != 4 * blocks + 2:
        raise ValueError(f"expected {4 * blocks + 2} convnet arrays, got {len(keras_arrays)}")
    out: list[np.ndarray] = []
    for b in range(blocks):
        kernel, bias, gamma, beta = keras_arrays[4 * b : 4 * b + 4]
        # Keras convolution kernels are [kh, kw, in, out]; PyTorch's are [out, in, kh, kw].
        out += [np.transpose(kernel, (3, 2, 0, 1)), bias, gamma, beta]
    dense_kernel, dense_bias = keras_arrays[-2], keras_arrays[-1]
    channels = _CONVNET_MULTIPLES[-1] * width
    out_h, out_w = _convnet_sizes(image_shape[0], image_shape[1])[-1]
    classes = dense_kernel.shape[-1]
    if dense_kernel.shape != (out_h * out_w * channels, classes):
        raise ValueError(
            f"dense kernel has shape {dense_kernel.shape}, expected "
            f"{(out_h * out_w * channels, classes)} for input shape {image_shape}"
        )
    # Keras flattens NHWC maps in (h, w, c) order and PyTorch NCHW maps in (c, h, w) order.
    dense = dense_kernel.reshape(out_h, out_w, channels, classes).transpose(3, 2, 0, 1)
    return [*out, dense.reshape(classes, -1), dense_bias]


def _build_convnet(
    keras_weights: Sequence[np.ndarray],
    image_shape: tuple[int, int, int],
    num_classes: int,
    width: int = 8,
) -> torch.nn.Sequential:
    """The convnet in PyTorch, holding the given Keras weights.

    BatchNorm normalises with the batch's own statistics whatever the module's mode
    (``track_running_stats=False``), as leakbench's training-mode forward pass does.

    Raises:
        ValueError: If the weights do not fit this architecture and input shape.
    """
    import torch
    from torch import nn

    height, wide, channels = image_shape
    pools = iter(_convnet_sizes(height, wide))
    layers: list[nn.Module] = []
    for index, multiple in enumerate(_CONVNET_MULTIPLES):
        layers += [
            nn.Conv2d(channels, multiple * width, 3, padding=1),
            nn.BatchNorm2d(multiple * width, eps=_BN_EPSILON, track_running_stats=False),
            nn.ReLU(),
        ]
        channels = multiple * width
        if index in _CONVNET_POOLED:
            pool = next(pools)
            layers.append(nn.MaxPool2d(pool, stride=pool))
    out_h, out_w = next(pools)
    layers += [nn.Flatten(), nn.Linear(channels * out_h * out_w, num_classes)]
    net = nn.Sequential(*layers).to(torch.float32)
    converted = _convnet_layout(keras_weights, image_shape, width)
    with torch.no_grad():
        for param, value in zip(net.parameters(), converted, strict=True):
            if tuple(param.shape) != value.shape:
                raise ValueError(f"weight of shape {value.shape} for a {tuple(param.shape)} slot")
            param.copy_(torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32)))
    return net


def convnet_gradients(
    keras_weights: Sequence[np.ndarray], image: np.ndarray, label: int, num_classes: int
) -> list[np.ndarray]:
    """The PyTorch convnet's parameter gradient of the cross-entropy of ``(image, label)``, in
    its own parameter layout (compare with `to_torch_layout` of leakbench's gradient).

    Args:
        keras_weights: The convnet's ``trainable_variables`` values.
        image: ``[H, W, C]`` pixels in [0, 1].
        label: The label.
        num_classes: Number of logits.
    """
    import torch

    image = np.asarray(image, np.float32)
    shape = (int(image.shape[0]), int(image.shape[1]), int(image.shape[2]))
    net = _build_convnet(keras_weights, shape, num_classes)
    logits = net(_nhwc_to_nchw(image, shape))
    loss = torch.nn.functional.cross_entropy(logits, torch.tensor([label]))
    return [g.numpy() for g in torch.autograd.grad(loss, list(net.parameters()))]


def to_torch_layout(
    keras_arrays: Sequence[np.ndarray], image_shape: tuple[int, int, int], width: int = 8
) -> list[np.ndarray]:
    """Keras-layout convnet arrays (e.g. leakbench's gradient) in the PyTorch network's layout."""
    return _convnet_layout(keras_arrays, image_shape, width)


def _total_variation(u: torch.Tensor, padded: bool) -> torch.Tensor:
    """Mean absolute difference of horizontal plus of vertical neighbours of an NCHW tensor.

    ``padded``: as a 3x3 difference filter with zero padding 1 computes it, each image gets a
    column of zeros on its right and a row of zeros below, so both directions have H x W
    differences and one mean is taken over them; otherwise each direction's differences inside
    the image are averaged on their own.
    """
    import torch

    if padded:
        p = torch.nn.functional.pad(u, (0, 1, 0, 1))
        across = (p[:, :, :-1, 1:] - p[:, :, :-1, :-1]).abs()
        down = (p[:, :, 1:, :-1] - p[:, :, :-1, :-1]).abs()
        return (across + down).mean()
    across = (u[:, :, :, 1:] - u[:, :, :, :-1]).abs()
    down = (u[:, :, 1:, :] - u[:, :, :-1, :]).abs()
    return across.mean() + down.mean()


def ig_attack(
    keras_weights: list[np.ndarray],
    image: np.ndarray,
    label: int,
    num_classes: int,
    start: np.ndarray,
    *,
    iterations: int = 2000,
    lr: float = 0.1,
    tv: float = 0.2,
    tv_padded: bool = True,
    signed: bool = True,
    mean: Sequence[float] = CIFAR10_MEAN,
    std: Sequence[float] = CIFAR10_STD,
    threads: int | None = None,
) -> TorchIGResult:
    """Runs Inverting Gradients on one example of the convnet in PyTorch, in the reference's
    normalised units (see the module docstring).

    The observed gradient is that of the cross-entropy of ``(image, label)`` with respect to
    every convnet parameter; the label is known to the attacker. Each iteration evaluates the
    loss and its gradient with respect to ``u``, takes the sign (``signed``), makes one Adam
    step (PyTorch's defaults but the step size) and projects ``u`` onto ``[-mean / std,
    (1 - mean) / std]``; the step size is divided by 10 after ``int(f * iterations)`` steps
    for f = 3/8, 5/8 and 7/8. The iterate with the lowest loss seen (the last one included)
    is returned.

    Args:
        keras_weights: The convnet's ``trainable_variables`` values (Keras layout).
        image: ``[H, W, C]`` private image in [0, 1] (NHWC).
        label: The private label.
        num_classes: Number of classes.
        start: ``[H, W, C]`` (or flat NHWC) start in normalised units, e.g. N(0, 1).
        iterations: Adam steps.
        lr: Initial step size, normalised units.
        tv: Weight of the total variation of ``u``.
        tv_padded: Zero-padded total variation (see `_total_variation`).
        signed: Step on the sign of the gradient.
        mean: Per-channel mean of the normalisation.
        std: Per-channel std of the normalisation.
        threads: If given, ``torch.set_num_threads`` for the duration of the call.

    Raises:
        ImportError: If PyTorch is not installed.
        ValueError: If shapes do not match.
    """
    import torch

    image, start, shape = _checked_inputs(image, start, label, num_classes, 0)

    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        net = _build_convnet(keras_weights, shape, num_classes)
        params = list(net.parameters())
        target = torch.tensor([label])
        dm = torch.tensor(mean, dtype=torch.float32).reshape(1, -1, 1, 1)
        ds = torch.tensor(std, dtype=torch.float32).reshape(1, -1, 1, 1)
        low, high = -dm / ds, (1 - dm) / ds

        def cross_entropy(pixels: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.cross_entropy(net(pixels), target)

        private = _nhwc_to_nchw(image, shape)
        observed = [g.detach() for g in torch.autograd.grad(cross_entropy(private), params)]
        observed_norm = torch.sqrt(sum((o * o).sum() for o in observed))

        u = _nhwc_to_nchw(start, shape).requires_grad_(True)

        def objective(graph: bool) -> tuple[torch.Tensor, torch.Tensor]:
            grads = torch.autograd.grad(cross_entropy(dm + ds * u), params, create_graph=graph)
            dot = sum((g * o).sum() for g, o in zip(grads, observed, strict=True))
            norm = torch.sqrt(sum((g * g).sum() for g in grads))
            matching = 1 - dot / (norm * observed_norm)
            return matching + tv * _total_variation(u, tv_padded), matching

        optimizer = torch.optim.Adam([u], lr=lr)
        milestones = [int(f * iterations) for f in (3 / 8, 5 / 8, 7 / 8)]
        scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones, gamma=0.1)

        best = (math.inf, math.inf, u.detach().clone())
        initial = math.nan
        evaluations = 0
        began = time.perf_counter()
        for step in range(iterations + 1):
            optimizer.zero_grad()
            loss, matching = objective(graph=step < iterations)
            evaluations += 1
            value = float(loss.item())
            if step == 0:
                initial = value
            if math.isfinite(value) and value < best[0]:
                best = (value, float(matching.item()), u.detach().clone())
            if step == iterations:
                break  # the last iterate is evaluated only, so that it can be kept
            if not math.isfinite(value):
                break
            loss.backward(inputs=[u])
            if signed:
                u.grad.sign_()
            optimizer.step()
            scheduler.step()
            with torch.no_grad():
                u.copy_(torch.maximum(torch.minimum(u, high), low))
        seconds = time.perf_counter() - began
        pixels = (dm + ds * best[2]).numpy()[0].transpose(1, 2, 0)
    finally:
        torch.set_num_threads(previous_threads)

    return TorchIGResult(
        images=np.ascontiguousarray(pixels, dtype=np.float32),
        seconds=seconds,
        evaluations=evaluations,
        loss=best[0],
        matching_loss=best[1],
        initial_loss=initial,
    )


def convnet_relu_inputs(
    keras_weights: Sequence[np.ndarray], image: np.ndarray, num_classes: int
) -> list[np.ndarray]:
    """The input of every ReLU of the PyTorch convnet for one ``[H, W, C]`` image, each
    ``[h, w, channels]`` (NHWC, the batch axis dropped), in the order of the network: where
    one framework's rounding puts an input on the other side of zero than the other's, the
    two gradients part (the ReLU's gate differs)."""
    import torch

    image = np.asarray(image, np.float32)
    shape = (int(image.shape[0]), int(image.shape[1]), int(image.shape[2]))
    net = _build_convnet(keras_weights, shape, num_classes)
    seen: list[np.ndarray] = []

    def keep(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], output: object) -> None:
        del module, output
        seen.append(inputs[0].detach().numpy()[0].transpose(1, 2, 0).copy())

    hooks = [m.register_forward_hook(keep) for m in net if isinstance(m, torch.nn.ReLU)]
    try:
        with torch.no_grad():
            net(_nhwc_to_nchw(image, shape))
    finally:
        for hook in hooks:
            hook.remove()
    return seen
