"""A dense block placed in front of a model: what a malicious server ships to its clients.

`with_dense_stem` returns a model that flattens each input, passes it through a dense layer of
``units`` ReLU units (the ``stem``), maps those back to the input's shape with a second dense
layer (``stem_back``), and feeds the result to the original model's own layers. The original
layers are called again, not copied, so the returned model shares their variables; it is one flat
graph (its last layer is the original output layer), so everything that looks for the output
layer (label recovery, Soteria, PRECODE) finds it. The caller sets the two new layers' weights:
the imprint block (Fowl et al.) and trap weights (Boenisch et al.) differ only there.
"""

from __future__ import annotations

import math

import keras
import numpy as np

STEM = "stem"
STEM_BACK = "stem_back"


def with_dense_stem(
    model: keras.Model, input_shape: tuple[int, ...], units: int
) -> tuple[keras.Model, keras.layers.Dense, keras.layers.Dense]:
    """``model`` behind a dense block of ``units`` ReLU units, with the block's two layers (the
    stem, inputs to units, and the map back, units to inputs), whose weights the caller sets."""
    size = math.prod(input_shape)
    images = keras.Input(shape=input_shape, name="shipped_images")
    stem = keras.layers.Dense(units, activation="relu", name=STEM)
    back = keras.layers.Dense(size, name=STEM_BACK)
    flat = keras.layers.Flatten(name="stem_flatten")(images)
    shaped = keras.layers.Reshape(input_shape, name="stem_reshape")(back(stem(flat)))
    if isinstance(model, keras.Sequential):
        outputs = shaped
        for layer in model.layers:
            outputs = layer(outputs)
    else:
        # Keras' own walk of a functional graph (what Functional.call runs), with the same
        # layers: the new nodes join the returned model's graph instead of nesting the model.
        outputs = model._run_through_graph(shaped, operation_fn=lambda op: op)  # noqa: SLF001
    return keras.Model(images, outputs, name=f"{model.name}_{STEM}"), stem, back


def set_stem_weights(
    stem: keras.layers.Dense,
    back: keras.layers.Dense,
    kernel: np.ndarray,
    bias: np.ndarray,
    gain: float,
) -> None:
    """Gives the block its units (``kernel`` ``[inputs, units]`` and ``bias`` ``[units]``, both
    times ``gain``) and the map back that sends every unit's output to every input value with
    the weight ``1 / (gain * units)``: the same function for any gain, while the block's share
    of the gradient grows as ``1 / gain``; each example then sends one number back to every unit
    it activates."""
    units, size = kernel.shape[1], kernel.shape[0]
    stem.kernel.assign((gain * kernel).astype(np.float32))
    stem.bias.assign((gain * bias).astype(np.float32))
    back.kernel.assign(np.full((units, size), 1.0 / (gain * units), np.float32))
    back.bias.assign(np.zeros(size, np.float32))
