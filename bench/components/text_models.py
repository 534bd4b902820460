"""Text models: small next-token language models, ``int ids [B, L] -> logits [B, L, V]``.

They are registered in `MODELS` (`leakbench.components.model_registry`) beside the image zoo,
with the modality ``"text"``: `build_model` refuses them, and ``build_text_model(name,
vocabulary_size, sequence_length, seed, tie_embeddings=False, width=64)`` builds one (and refuses
an image model) with seeded weights; ``width`` is the model dimension d (the embedding, the
attention and the GRU's state).

Both models embed tokens with a ``keras.layers.Embedding`` named ``token_embedding`` (its
gradient under TensorFlow is ``tf.IndexedSlices``; `leakbench.modalities.text` densifies
it). The output layer is a dense head of its own by default; ``tie_embeddings=True`` reads the
logits from the input embedding instead (``h @ E^T + b``, `TiedHead`), which changes what the
embedding's gradient shows (docs/text.md).

Weights follow GPT-2's initialisation: every matrix (embeddings and kernels) is drawn from
N(0, 0.02^2) by one NumPy generator seeded by ``seed``, one draw per variable; biases are 0 and
layer-norm scales 1.
"""

from __future__ import annotations

import keras
import numpy as np

from leakbench.components.model_registry import MODELS
from leakbench.components.saved_models import is_saved_model, load_text_model
from leakbench.core.errors import ConfigError

EMBEDDING = "token_embedding"
INIT_STD = 0.02
WIDTH = 64  # the default model dimension d
HEADS = 4  # the transformer's attention heads


@keras.saving.register_keras_serializable(package="leakbench")
class PositionEmbedding(keras.layers.Layer):
    """Adds a learned embedding of each position (0, 1, ...) to a sequence [B, L, d]; L may be
    any length up to ``max_length``."""

    def __init__(self, max_length: int, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.max_length = int(max_length)

    def build(self, input_shape: tuple[int, ...]) -> None:
        self.positions = self.add_weight(
            shape=(self.max_length, int(input_shape[-1])), initializer="zeros", name="positions"
        )

    def call(self, x: keras.KerasTensor) -> keras.KerasTensor:
        length = keras.ops.shape(x)[1]
        return x + self.positions[None, :length, :]

    def get_config(self) -> dict[str, object]:
        return {**super().get_config(), "max_length": self.max_length}


class TiedHead(keras.layers.Layer):
    """Logits from a shared input embedding: ``h @ E^T + b`` (E is ``embedding.embeddings``)."""

    def __init__(self, embedding: keras.layers.Embedding, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.embedding = embedding

    def build(self, input_shape: tuple[int, ...]) -> None:
        self.bias = self.add_weight(
            shape=(self.embedding.input_dim,), initializer="zeros", name="bias"
        )

    def call(self, h: keras.KerasTensor) -> keras.KerasTensor:
        table = keras.ops.convert_to_tensor(self.embedding.embeddings)
        return keras.ops.matmul(h, keras.ops.transpose(table)) + self.bias


def build_text_model(
    name: str,
    vocabulary_size: int,
    sequence_length: int,
    seed: int,
    *,
    tie_embeddings: bool = False,
    width: int = WIDTH,
) -> keras.Model:
    """Builds a registered text model with seeded weights, or loads a saved one.

    Args:
        name: A text model of `MODELS` (``transformer``, ``gru``), or ``keras:PATH``: a saved
            Keras model of ids [B, L] -> logits [B, L, V], loaded with the file's weights
            (`leakbench.components.saved_models.load_text_model`; ``seed``, ``tie_embeddings``
            and ``width`` are then the file's business and not read).
        vocabulary_size: V, the number of token ids (reserved ids included).
        sequence_length: The longest input it reads (the transformer's position table).
        seed: Seed of every weight draw.
        tie_embeddings: Read the logits from the input embedding (`TiedHead`).
        width: The model dimension d (default 64); the transformer's must be a multiple of its
            4 heads.

    Raises:
        UnknownNameError: If ``name`` is not a text model of `MODELS`.
        ConfigError: If V < 2, the sequence length < 2, or the width is not allowed.
    """
    if is_saved_model(name):
        return load_text_model(name, int(vocabulary_size), int(sequence_length))
    factory = MODELS.get(name, modality="text")
    if vocabulary_size < 2:
        raise ConfigError(f"model {name}: vocabulary_size must be >= 2, got {vocabulary_size}")
    if sequence_length < 2:
        raise ConfigError(f"model {name}: sequence_length must be >= 2, got {sequence_length}")
    check_width(name, width)
    size, length = int(vocabulary_size), int(sequence_length)
    model = factory(size, length, int(seed), bool(tie_embeddings), width=int(width))
    _seed_weights(model, int(seed))
    return model


def check_width(name: str, width: object) -> int:
    """Returns ``width`` as an int, or raises `ConfigError`: an integer >= `HEADS` and, for the
    transformer, a multiple of `HEADS`."""
    if isinstance(width, bool) or not isinstance(width, (int, np.integer)) or width < HEADS:
        raise ConfigError(f"model {name}: width must be an integer >= {HEADS}, got {width!r}")
    if name == "transformer" and width % HEADS:
        raise ConfigError(
            f"model {name}: width must be a multiple of its {HEADS} heads, got {width}"
        )
    return int(width)


def _seed_weights(model: keras.Model, seed: int) -> None:
    """Assigns GPT-2's initialisation (module docstring), one draw per variable in order."""
    rng = np.random.default_rng(seed)
    for var in model.trainable_variables:
        leaf = var.path.rsplit("/", 1)[-1]
        if leaf in ("bias", "beta"):
            value = np.zeros(var.shape)
        elif leaf == "gamma":
            value = np.ones(var.shape)
        else:
            value = rng.normal(0.0, INIT_STD, size=var.shape)
        var.assign(value.astype(np.float32))


def _head(
    h: keras.KerasTensor, embedding: keras.layers.Embedding, vocabulary_size: int, tie: bool
) -> keras.KerasTensor:
    if tie:
        return TiedHead(embedding, name="tied_head")(h)
    return keras.layers.Dense(vocabulary_size, name="head")(h)


@MODELS.register("transformer", modality="text")
def transformer(
    vocabulary_size: int,
    sequence_length: int,
    seed: int,
    tie_embeddings: bool,
    *,
    width: int = WIDTH,
) -> keras.Model:
    """A causal transformer LM: d = ``width`` (64), 2 pre-norm blocks of 4-head self-attention
    under a causal mask and a 4d-unit (256) GELU MLP, each with a residual; a final layer norm;
    the head.

    ``seed`` is used by `build_text_model` (weights are drawn after building)."""
    del seed
    heads, hidden = HEADS, 4 * width
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    embedding = keras.layers.Embedding(vocabulary_size, width, name=EMBEDDING)
    x = PositionEmbedding(sequence_length, name="position_embedding")(embedding(ids))
    for block in range(2):
        h = keras.layers.LayerNormalization(epsilon=1e-5, name=f"block{block}_ln1")(x)
        attention = keras.layers.MultiHeadAttention(
            heads, width // heads, name=f"block{block}_attention"
        )
        x = x + attention(h, h, use_causal_mask=True)
        h = keras.layers.LayerNormalization(epsilon=1e-5, name=f"block{block}_ln2")(x)
        h = keras.layers.Dense(hidden, activation="gelu", name=f"block{block}_mlp_in")(h)
        x = x + keras.layers.Dense(width, name=f"block{block}_mlp_out")(h)
    x = keras.layers.LayerNormalization(epsilon=1e-5, name="final_ln")(x)
    logits = _head(x, embedding, vocabulary_size, tie_embeddings)
    return keras.Model(ids, logits, name="transformer")


@MODELS.register("gru", modality="text")
def gru(
    vocabulary_size: int,
    sequence_length: int,
    seed: int,
    tie_embeddings: bool,
    *,
    width: int = WIDTH,
) -> keras.Model:
    """A GRU LM: a ``width``-wide (64) embedding, one GRU of ``width`` units returning every
    step, the head.

    ``sequence_length`` and ``seed`` are used by `build_text_model`."""
    del sequence_length, seed
    ids = keras.Input(shape=(None,), dtype="int32", name="token_ids")
    embedding = keras.layers.Embedding(vocabulary_size, width, name=EMBEDDING)
    h = keras.layers.GRU(width, return_sequences=True, name="gru")(embedding(ids))
    logits = _head(h, embedding, vocabulary_size, tie_embeddings)
    return keras.Model(ids, logits, name="gru")


def input_embedding(model: keras.Model) -> keras.layers.Embedding:
    """The model's input embedding, found by type: the first ``keras.layers.Embedding`` among
    its layers (the built-in models' ``token_embedding``).

    Raises:
        ConfigError: If the model has no ``Embedding`` layer.
    """
    for layer in model.layers:
        if isinstance(layer, keras.layers.Embedding):
            return layer
    raise ConfigError(f"model {model.name}: has no keras.layers.Embedding layer")


def embedding_index(model: keras.Model) -> int:
    """The position of the input embedding's table (`input_embedding`) in
    ``model.trainable_variables``.

    Raises:
        ConfigError: If the model has no ``Embedding`` layer or its table is not trainable.
    """
    layer = input_embedding(model)
    for i, var in enumerate(model.trainable_variables):
        if var is layer.embeddings:
            return i
    raise ConfigError(f"model {model.name}: its embedding {layer.name!r} is not trainable")


def check_input_length(model: keras.Model, length: int) -> None:
    """Raises `ConfigError` if ``model`` cannot read inputs of ``length`` tokens: longer than
    its position table (`PositionEmbedding`); a model without one reads any length."""
    for layer in model.layers:
        if isinstance(layer, PositionEmbedding) and length > layer.max_length:
            raise ConfigError(
                f"model {model.name}: reads at most {layer.max_length} tokens (its "
                f"sequence_length), got inputs of {length}"
            )
