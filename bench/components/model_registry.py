"""`MODELS`: the one registry of models, of every modality.

The image zoo (`leakbench.components.models`, ``factory(input_shape, num_classes, seed)``)
registers in it as ``"image"``, the language models (`leakbench.components.text_models`,
``factory(vocabulary_size, sequence_length, seed, tie_embeddings, width=...)``) as ``"text"``;
a plugin's model is an image one unless it registers with ``modality="text"``. Use it as
``leakbench.components.models.MODELS``: that module imports both, so every built-in is in it.
"""

from __future__ import annotations

from collections.abc import Callable

import keras

from leakbench.core.plugins import adopt_function
from leakbench.core.registry import Registry

MODELS: Registry[Callable[..., keras.Model]] = Registry("model")


def _adopt(name: str, obj: object) -> bool:
    """Registers a plugin's model function ``(input_shape, num_classes, seed) -> keras.Model``
    (a model of logits with seeded weights, like the zoo's) as the image model ``name``."""
    return adopt_function(MODELS, name, obj)


MODELS.use_entry_points("leakbench.models", _adopt)
