"""Every random stream of a run, named, and how each derives from the run seed.

A run has one seed per entry of ``seeds`` in its config. Everything random in a trial or a
training derives from that seed through the functions below, and nothing else draws: the same
config and seed give the same numbers on a CPU. The streams, and the values they are keyed by:

========================  =========================================  ===========================
stream                    derived from                               used by
========================  =========================================  ===========================
private images            ``permutation(default_rng(seed))``         `private_indices`
model weights             ``seed`` (one NumPy draw per variable)     `leakbench.models`
pre-attack training       ``default_rng(seed)`` (batch order)        `leakbench.training`
defense draw, observed    stateless ``[seed, batch]``; client k > 0  `observed_draw`,
                          of an aggregate folds in k                 `client_draw`
attack start              ``seed * 1_000_003 + batch``, then         `attack_seed`,
                          stateless ``[that, attempt]``              `attempt_draw`
defense draw, training    stateless ``[2**56 + client, step]``,      `training_client`,
                          client = ``seed`` (one device) or          `training_draw`
                          ``seed * 65536 + replica``
utility training order    ``default_rng(seed)`` (batch order)        `leakbench.training`
========================  =========================================  ===========================

Stateless draws (TensorFlow's ``stateless_*`` ops, Philox) are keyed by an int64 pair; two
draws are independent when their keys differ. The training's defense draws carry the tag
``2**56`` in their first word, so that training step ``t`` never shares a key with the observed
gradient of batch ``t`` (run seeds and client numbers stay below ``2**47``); before engine
version 2 they did. A defense that draws several tensors folds the
tensor's index into its key (`leakbench.defenses.tensor_seed`); an attack that runs several
starts folds in the start's index.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

# Attack seeds are seed * ATTACK_STRIDE + batch; a run's batches per seed stay below it, and
# seeds below 2**31 keep the product inside int64.
ATTACK_STRIDE = 1_000_003
# Replica r of a training with seed s is the client s * MAX_REPLICAS + r.
MAX_REPLICAS = 1 << 16
# Added to the first word of the training's defense-draw keys: a stream of their own.
TRAINING_STREAM = 1 << 56
# The largest run seed a config may give.
MAX_SEED = 2**31 - 1


def private_indices(split_size: int, images: int, seed: int) -> np.ndarray:
    """The indices of a split of ``split_size`` examples attacked under ``seed``: a prefix of a
    seeded permutation, so that a run with more images extends a smaller one instead of
    drawing new ones."""
    return np.random.default_rng(seed).permutation(split_size)[:images]


def observed_draw(seed: int, batch: int) -> tf.Tensor:
    """The stateless key of the defense's draw for the observed gradient of ``batch``: every
    attack of one (seed, batch, defense) cell sees the same defended gradient."""
    return tf.constant([seed, batch], tf.int64)


def client_draw(seed: int, batch: int, client: int) -> tf.Tensor:
    """The stateless key of client ``client``'s defense draw for the observed gradient of
    ``batch`` under secure aggregation: client 0 draws as a lone client does
    (`observed_draw`), client k > 0 from that key with k folded in."""
    key = observed_draw(seed, batch)
    return key if client == 0 else tf.random.experimental.stateless_fold_in(key, client)


def attack_seed(seed: int, batch: int) -> int:
    """The integer seed of the attack on ``batch`` (what `leakbench.attacks.Attack` takes)."""
    return seed * ATTACK_STRIDE + batch


def attempt_draw(attack: int, attempt: int) -> tf.Tensor:
    """The stateless key of attempt ``attempt`` (1 for the first) of the attack seeded
    ``attack``: a retry after divergence starts from a fresh draw."""
    return tf.constant([attack, attempt], tf.int64)


def training_client(seed: tf.Tensor, replica: tf.Tensor | None = None) -> tf.Tensor:
    """The client number of a training's defense draws: ``seed`` on one device, ``seed *
    MAX_REPLICAS + replica`` for each replica of a distributed step (each replica is one
    client, with noise of its own)."""
    if replica is None:
        return seed
    return seed * MAX_REPLICAS + tf.cast(replica, tf.int64)


def training_draw(client: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
    """The stateless key of the defense's draw of a client at training step ``step``, in the
    training's own stream (apart from every observed-gradient draw)."""
    return tf.stack([TRAINING_STREAM + client, step])
