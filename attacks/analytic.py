"""Analytic input recovery from a first dense layer with bias.

Phong, Aono, Hayashi, Wang & Moriai, "Privacy-Preserving Deep Learning via Additively
Homomorphic Encryption", IEEE TIFS 2018 (ATIS 2017); Geiping, Bauermeister, Dröge & Moeller,
"Inverting Gradients -- How easy is it to break privacy in federated learning?", NeurIPS 2020,
section 4 (fully connected layers).
"""

from __future__ import annotations

import dataclasses
import math

import keras
import numpy as np
import tensorflow as tf

from leakbench.attacks.base import ATTACKS, RETRIES, Attack, AttackTarget, RunOutput
from leakbench.attacks.labels import label_from_last_layer
from leakbench.core.errors import ConfigError
from leakbench.core.params import param

_NEEDS = (
    "a model whose first trainable layer is a Dense layer with a trainable bias on the flattened "
    "input (e.g. mlp)"
)


def first_dense_layer(model: keras.Model, input_shape: tuple[int, ...]) -> keras.layers.Dense:
    """The dense layer the attack inverts, or `ConfigError` when the model has none.

    The layer must be the model's first layer with trainable weights, be reached from the input
    through shape-only layers (Flatten), take every input value (``prod(input_shape)`` kernel
    rows) and have a trainable bias. Its activation does not matter: the gradients of kernel and
    bias share the same backpropagated factor, which cancels.

    Args:
        model: The attacked model.
        input_shape: Shape of one input, without the batch axis.

    Raises:
        ConfigError: The model does not have such a layer; the message says what it has.
    """
    name = model.name
    layers = [ly for ly in model.layers if not isinstance(ly, keras.layers.InputLayer)]
    first = next((i for i, ly in enumerate(layers) if ly.trainable_weights), None)
    if first is None:
        raise ConfigError(
            f"attack analytic: needs {_NEEDS}; got model {name} without trainable layers"
        )
    layer = layers[first]
    if not isinstance(layer, keras.layers.Dense):
        raise ConfigError(
            f"attack analytic: needs {_NEEDS}; got model {name} whose first trainable layer is "
            f"{type(layer).__name__}"
        )
    shape_only = (keras.layers.Flatten,)
    between = [type(ly).__name__ for ly in layers[:first] if not isinstance(ly, shape_only)]
    if between:
        raise ConfigError(
            f"attack analytic: needs {_NEEDS}; got model {name} with {', '.join(between)} "
            "before its first Dense layer"
        )
    trainable = {id(v) for v in model.trainable_variables}
    if not layer.use_bias or not {id(layer.kernel), id(layer.bias)} <= trainable:
        raise ConfigError(
            f"attack analytic: needs {_NEEDS}; got model {name} whose first Dense layer has "
            "no trainable bias (or a frozen kernel)"
        )
    size = math.prod(int(d) for d in input_shape)
    if int(layer.kernel.shape[0]) != size:
        raise ConfigError(
            f"attack analytic: needs {_NEEDS}; got model {name} whose first Dense layer takes "
            f"{int(layer.kernel.shape[0])} values, not the {size} of the input"
        )
    return layer


def rank_one_input(kernel_grad: np.ndarray, bias_grad: np.ndarray) -> tuple[np.ndarray, float]:
    """The input ``x`` of a dense layer from one example's gradients, and the fit's residual.

    For one example, ``dW = x d^T`` and ``db = d`` (``d``: the gradient at the layer's
    pre-activations), so ``[dW; db^T] = [x; 1] d^T`` has rank one. Its leading left singular
    vector ``u`` is proportional to ``[x; 1]``, hence ``x = u[:-1] / u[-1]``: the total least
    squares fit. Without noise this is exact like ``dW[:, j] / db[j]`` for any unit with
    ``db[j] != 0``, but it uses every unit, weighted by its size, instead of one; and unlike
    the ordinary least-squares average ``dW db / |db|^2``, it allows for noise on ``db`` too,
    which otherwise shrinks ``x`` towards zero. Measured on digits with the ``gaussian``
    defense (median MSE over 16 images): sigma 1e-3: largest-``|db|`` unit 3.4e-4, least
    squares 9.4e-6, this fit 7.5e-6; sigma 1e-2: 0.060, 0.0084, 0.00078.

    Args:
        kernel_grad: Gradient of the kernel, [D, H].
        bias_grad: Gradient of the bias, [H].

    Returns:
        ``x`` as float64 [D] (non-finite when the gradient is all zero), and the share of the
        gradient's energy outside the rank-one fit (0 without noise; NaN for a zero gradient).
    """
    stacked = np.vstack([np.asarray(kernel_grad, np.float64), np.asarray(bias_grad, np.float64)])
    u, s, _ = np.linalg.svd(stacked, full_matrices=False)
    energy = float(np.sum(s**2))
    with np.errstate(divide="ignore", invalid="ignore"):
        x = u[:-1, 0] / u[-1, 0]
        residual = float(np.sum(s[1:] ** 2)) / energy if energy > 0 else float("nan")
    return x, residual


@ATTACKS.register("analytic")
@dataclasses.dataclass(frozen=True)
class Analytic(Attack):
    """Exact input recovery from a first dense layer with bias (Phong et al., 2017).

    For one example and a first layer ``z = W^T x + b`` on the flattened input, the kernel's
    gradient is ``x`` times the bias's gradient, unit by unit, so ``x = dW[:, j] / db[j]`` for
    every unit with ``db[j] != 0`` (also Geiping et al., 2020, section 4). The attack fits the
    rank-one model to all units at once (see `rank_one_input`). It needs no optimisation and
    no randomness, and defenses that only scale the gradient (norm clipping) do not change the
    result. The label comes from the last layer's gradient (iDLG rule) unless the target
    carries labels.

    The reported loss is the share of the first layer's gradient energy that the rank-one fit
    does not explain: zero (to rounding) for an undefended single example, growing with noise.
    A gradient whose first layer is all zero has no solution: the loss and images are NaN and
    the trial is marked ``diverged``.

    Applies only to batch size 1 and to models whose first trainable layer is a dense layer
    with bias on the flattened input (``mlp``); other models raise `ConfigError`.

    Args:
        retries: Kept for the common interface (the old name ``restarts`` is still accepted);
            the attack is deterministic, so a retry would repeat the same computation
            (default 0).
    """

    name = "analytic"
    max_batch_size = 1

    retries: int = param(0, RETRIES, doc="kept for the common interface; a retry repeats")

    def check_batch_size(self, batch_size: int) -> None:
        if batch_size != 1:
            raise ConfigError(
                f"attack analytic: needs batch_size 1 (a batch's first-layer gradient sums the "
                f"examples' rank-one terms), got {batch_size}"
            )

    def check_model(self, model: keras.Model, input_shape: tuple[int, ...]) -> None:
        """Raises `ConfigError` unless the attack applies to ``model``."""
        first_dense_layer(model, input_shape)

    def run(self, target: AttackTarget, seed: tf.Tensor) -> RunOutput:
        del seed  # deterministic
        self.check_batch_size(target.batch_size)
        layer = first_dense_layer(target.model, target.input_shape)
        variables = target.model.trainable_variables
        grads = {id(v): g for v, g in zip(variables, target.gradients, strict=True)}
        x, residual = rank_one_input(
            np.asarray(grads[id(layer.kernel)]), np.asarray(grads[id(layer.bias)])
        )
        if target.labels is not None:
            labels = np.asarray(target.labels, np.int64)
        else:
            labels = np.array(
                [label_from_last_layer(target.gradients, target.num_classes, attack=self.name)],
                np.int64,
            )
        return RunOutput(
            images=x.reshape(1, *target.input_shape).astype(np.float32),
            labels=labels,
            loss=residual,
            loss_history=np.array([residual], np.float32),
            evaluations=0,
        )
