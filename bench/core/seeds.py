"""Every random stream of a run, named, and how each derives from the run seed.

A run has one seed per entry of ``seeds`` in its config. Everything random in a trial or a
training derives from that seed through the functions below, and nothing else draws: the same
config and seed give the same numbers on a CPU. The streams, and the values they are keyed by:

========================  =========================================  ===========================
stream                    derived from                               used by
========================  =========================================  ===========================
private images            ``permutation(default_rng(seed))``         `private_indices`
model weights             ``seed`` (one NumPy draw per variable)     `leakbench.components.models`
pre-attack training       ``default_rng(seed)`` (batch order)        `leakbench.client.training`
defense draw, observed    stateless ``[seed, batch]``; client k > 0  `observed_draw`,
                          of an aggregate folds in k                 `client_draw`
attack start              ``seed * 1_000_003 + batch``, then         `attack_seed`,
                          stateless ``[that, attempt]``              `attempt_draw`
defense draw, training    stateless ``[2**56 + client, step]``,      `training_client`,
                          client = ``seed`` (one device) or          `training_draw`
                          ``seed * 65536 + replica``
utility training order    ``default_rng(training_seed(seed, r))``    `leakbench.client.training`
                          (batch order of a defense without an
                          accountant; replicate r of the seed)
DP training batches       ``default_rng([POISSON_STREAM, run,        `poisson_generator`
                          training_seed(seed, r)])``: run k is the
                          search's k-th learning rate
defense draw, DP          ``training_draw`` with the run folded in   `sampled_draw`
training
utility model weights     ``training_seed(seed, r)``; replicate 0    `training_seed`
                          is ``seed`` (the weights the attacks see)
validation split          ``default_rng(VALIDATION_STREAM)``, fixed  `validation_indices`
distractor pool           ``default_rng(DISTRACTOR_STREAM)``, fixed  `distractor_indices`
                          (of the split the private images are not
                          drawn from)
attacker's own updates    stateless ``[2**59 + seed, draw]`` (of       `simulation_seed`
(learned attack)          public examples only; clients folded in
                          as for the observed draw)
epsilon audit rounds      membership ``default_rng([AUDIT_STREAM,    `audit_membership`,
                          seed])``; defense draw stateless           `audit_draw`,
                          ``[2**57 + seed, round]``; step t of a     `audit_step_draw`
                          multi-step round folds t into that key
========================  =========================================  ===========================

Stateless draws (TensorFlow's ``stateless_*`` ops, Philox) are keyed by an int64 pair; two
draws are independent when their keys differ. The training's defense draws carry the tag
``2**56`` in their first word, so that training step ``t`` never shares a key with the observed
gradient of batch ``t`` (client numbers, replicate seeds included, stay below ``2**54``, and
the first words of every other stream below ``2**51``); before engine version 2 they did. A
defense that draws several tensors folds the tensor's index into its key
(`leakbench.defenses.tensor_seed`); an attack that runs several starts folds in the start's
index.
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
# Replicate r > 0 of a utility training under run seed s is seeded s + r * REPLICATE_STRIDE:
# above every run seed, so no replicate shares its weights or batch order with another seed's.
REPLICATE_STRIDE = MAX_SEED + 1
# The most training replicates per run seed (keeps the replicate seeds below 2**38, so that
# `training_client` stays below 2**54 even with MAX_REPLICAS replicas).
MAX_REPLICATES = 100
# The generator seed of the validation split: one fixed split for every run seed and defense,
# so that every learning-rate choice of a run is made on the same examples.
VALIDATION_STREAM = 0x5EED_7A11
# The generator seed of the distractor pool of the identification test
# (`leakbench.components.leakage`): one fixed pool per dataset, whatever the run seed, so every
# trial is judged against the same images.
DISTRACTOR_STREAM = 0xD15_7AC7
# The first word of the generators of Poisson-sampled batches (`poisson_generator`): a stream of
# their own, apart from every generator seeded by a bare integer.
POISSON_STREAM = 0x9015_5011
# Added to the first word of the epsilon audit's defense-draw keys (above the training's tag and
# every other stream's first word), so that no audit round shares a draw with a trial or a step.
AUDIT_STREAM = 1 << 57
# Added to the seed of the defense draws of an attacker's own updates (`simulation_seed`).
SIMULATION_STREAM = 1 << 59


def training_seed(seed: int, replicate: int) -> int:
    """The seed of utility training replicate ``replicate`` (0-based) under run seed ``seed``:
    its model weights, batch order and defense draws. Replicate 0 is ``seed`` itself, so the
    first model starts from the weights the attacks see; replicate r > 0 is ``seed + r *
    REPLICATE_STRIDE``."""
    if not 0 <= replicate < MAX_REPLICATES:
        raise ValueError(f"replicate must be in [0, {MAX_REPLICATES}), got {replicate}")
    return seed + replicate * REPLICATE_STRIDE


def distractor_indices(size: int, count: int) -> np.ndarray:
    """Indices of the distractor pool in a split of ``size`` images: the first ``min(count,
    size)`` entries of a fixed permutation, sorted. The split is the one the private images
    are not drawn from, so the pool never holds a private image."""
    order = np.random.default_rng(DISTRACTOR_STREAM).permutation(size)
    return np.sort(order[: min(count, size)])


def validation_indices(train_size: int, share: float) -> np.ndarray:
    """The indices of the training split held out for validation: the first ``round(share *
    train_size)`` entries of a fixed permutation (at least one when ``share`` > 0), sorted.
    The same for every seed and defense; the test split is never involved."""
    count = 0 if share <= 0 else max(1, round(share * train_size))
    order = np.random.default_rng(VALIDATION_STREAM).permutation(train_size)
    return np.sort(order[:count])


def simulation_seed(seed: int) -> int:
    """The seed whose `observed_draw` keys are the defense draws of the updates an attacker
    computes itself on public examples (`leakbench.attacks.Simulator`): ``2**59 + seed``, so
    draw ``d`` never shares a key with a private batch's draw (first word ``seed``), a training
    (``2**56``) or an audit (``2**57``)."""
    return SIMULATION_STREAM + seed


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


def poisson_generator(seed: int, run: int) -> np.random.Generator:
    """The generator of the Poisson-sampled batches of a DP training under ``seed`` (its
    `training_seed`), run ``run`` of its learning-rate search (0 for the first rate): each run
    of the search draws its own batches, so that the runs are independent releases and their
    privacy composes (`leakbench.client.selection`)."""
    return np.random.default_rng([POISSON_STREAM, run, seed])


def sampled_draw(key: tf.Tensor, run: tf.Tensor) -> tf.Tensor:
    """The stateless key of a DP training step's defense draw: the step's `training_draw` key
    with the search's run number folded in, so that no two runs of one search share noise."""
    return tf.random.experimental.stateless_fold_in(key, run)


def audit_membership(seed: int, rounds: int) -> np.ndarray:
    """Which of ``rounds`` epsilon-audit rounds hold the canary (`leakbench.client.canaries`):
    exactly ``rounds // 2`` of them, chosen by a permutation seeded by the run seed in the
    audit's own stream."""
    order = np.random.default_rng([AUDIT_STREAM, seed]).permutation(rounds)
    included = np.zeros(rounds, dtype=bool)
    included[order[: rounds // 2]] = True
    return included


def audit_draw(seed: int, rounds: int) -> tf.Tensor:
    """The stateless keys of the defense's draws in ``rounds`` epsilon-audit rounds under run
    seed ``seed``, shape ``[rounds, 2]``: round ``r`` is ``[AUDIT_STREAM + seed, r]``."""
    first = np.full(rounds, AUDIT_STREAM + seed, dtype=np.int64)
    return tf.constant(np.stack([first, np.arange(rounds, dtype=np.int64)], axis=1))


def audit_step_draw(key: tf.Tensor, step: tf.Tensor) -> tf.Tensor:
    """The stateless key of the defense's draw at training step ``step`` of a multi-step audit
    round whose key is ``key`` (`audit_draw`): the step folded into the round's key, so that no
    two steps, and no step and a one-update audit round, share a draw."""
    return tf.random.experimental.stateless_fold_in(tf.cast(key, tf.int64), step)
