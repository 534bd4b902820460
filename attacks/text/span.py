"""Exact span recovery: the DAGER idea (Petrov et al., "DAGER: Exact Gradient Inversion for Large
Language Models", 2024) on leakbench's text models.

**Why it works.** A dense layer's kernel gradient is ``sum_i x_i delta_i^T`` over the counted
positions ``i`` of the batch, with ``x_i`` the layer's input row. Every input row therefore lies
in the column space of that gradient, whose rank is at most the number of counted positions
(B x (L-1) at most). The server can compute the input row of any candidate (a token at a
position, or a whole prefix) from its own model, and a candidate whose row lies outside that
space cannot be in the batch. While the batch holds fewer counted positions than the layer's
width d, a wrong candidate's row is in the space only by accident, so the test is exact.

**The two stages (transformer).**

1. The first attention layer's query, key and value kernels read ``LN(E[t] + P[p])``. Each
   candidate (t, p), all V tokens at all L - 1 positions, is tested against the span of those
   three kernel gradients. Layer normalisation only centres and rescales, and the span test
   ignores scale, so the test is linear in ``E[t] + P[p]``: when token t is in the batch at
   some position and position p is used by some token, ``E[t] + P[p]`` is often a combination
   of true rows (``(E[t]+P[q]) - (E[s]+P[q]) + (E[s]+P[p])``). So stage 1 returns, per
   position, a superset of the true tokens (close to the batch's bag of words at every
   counted position), not the answer.
2. The second block's attention input at position p depends on the prefix up to p only (the
   causal mask) and non-linearly on it. Prefixes are extended one position at a time with the
   stage-1 tokens of that position, and an extension is kept when its second-block input row
   passes the same test on the second attention layer's kernel gradients. A prefix with no
   passing extension has ended. This also orders the rows, for any B.

**Which layers.** They are found by type, not by name (`layout`), so a user's own model
(``keras:PATH``) is read as the built-in ones: the first two ``MultiHeadAttention`` layers (each
stage's rows are that layer's query input), or else the first ``GRU`` that reads the
``Embedding``'s output; the head is the model's last layer, a ``Dense`` with a bias or the tied
head. A model with neither is refused in one line saying what span needs.

**The GRU.** Its input kernel reads the token embedding ``E[t]`` with no position, so stage 1
(the input kernel's gradient) gives the batch's token set. Stage 2 tests the hidden state
``h_p`` after a candidate prefix against the span of the recurrent kernel's gradient (which
reads ``h_{p-1}``) and the head's kernel gradient (which reads ``h_p`` at every counted
position); with a tied head, the head's part is the embedding gradient's rows of the tokens
outside the stage-1 set (the input-side rows carry other vectors). The search is the
transformer's. Measured at initialisation it is exact at B = 1 only: the GRU's gates sit near
1/2, so it is nearly linear and the hidden states of different prefixes are nearly dependent;
from B = 2 the spectrum has no clean gap and wrong prefixes pass, and the verification below
then reports ``stalled`` or ``beyond_rank`` instead of ``exact``.

**Calibration (never from private data).** For each stage the kernel gradients are stacked
side by side, each block divided by its Frobenius norm, and decomposed (SVD). The rank r is
placed at the largest drop between consecutive singular values, provided that drop is at least
`GAP_DECADES` decades (a factor 10^2): true rows give singular values well above the float32
round-off floor of the rest. A gap at r >= d - 1 does not count: a layer-normalised row has mean
zero, so every such row lies in a (d-1)-dimensional space and that last drop is always there.
A candidate is accepted when its relative residual after projection on the top r left singular
vectors is below ``max(q, FLOOR)`` with ``q = s_{r+1} / s_r`` (at most 10^-2 by the gap rule)
and `FLOOR` = 100 float32 epsilons (1.2e-5): a span perturbed by ``s_{r+1}`` tilts by about
``q`` (Davis-Kahan), and the candidate's own row, computed in float32 like the client's, is off
by round-off (measured: true rows' residuals are 1e-7.5 to 1e-6). A wrong row's residual is of
order 0.1-1 for the transformer; the GRU at initialisation is nearly linear (its gates sit
near 1/2), so a wrong prefix's state can come within 10^-3.4 of the span, and the bound ``q``
itself, not a looser midpoint, is what refuses it.

**Beyond rank.** Without such a drop the gradient has full rank (the batch counts at least d
positions, or noise fills the spectrum): no candidate can be refused. The attack then answers
as its ``test="rank"`` variant does (below) and returns ``stop_reason="beyond_rank"`` with the
note ``beyond rank: B x (L-1) = .. >= d = ..`` (or, when B x (L-1) < d, that the gradient has
full rank). A batch with B x (L-1) >= d whose padding leaves fewer than d counted positions
still shows a gap and is recovered exactly.

**Padding.** A position whose target is ``<pad>`` and every later one reaches no counted loss,
so its input row is not in any span (``leakbench.modalities.text.read_tokens``). A row ends
where no extension passes; its next id is then ``<eos>`` (the encoding puts ``<eos>`` before
the padding) and the rest is ``<pad>``. A row that runs to L - 1 inputs has a last target no
input shows; it is read from the head: the head bias's gradient is ``sum_p (softmax_p -
onehot(y_p)) / C``, so, with every input and so every softmax known, it gives the multiset of
the unknown last targets exactly, and the head kernel's gradient (``sum_p h_p (softmax_p -
onehot(y_p))^T / C``) assigns them to rows (Hungarian matching on the cosine between each row's
last hidden state and each token's left-over column). With a tied head the kernel part is the
embedding gradient, whose rows of input tokens also carry input-side terms; there the
assignment is refined by exchanging the last ids of two full rows while that brings the
gradient of the candidate batch closer to the observed one (`swap_ends`; the multiset from the
bias is exact, its assignment to rows is then the gradient's best among pairwise exchanges).

**Rows the search cannot tell apart.** Two equal rows, or a row that is a prefix of another,
give the same span evidence as one row; when the search finds fewer than B rows it repeats the
found rows to fill the batch (the note says how many).

**Verification.** The server computes the gradient of its answer (as a client without a
defense would) and compares it with the observed one: ``loss`` is their relative distance. An
answer of the exact test is reported ``exact`` only when that distance is below `VERIFIED`
(1e-3; a right answer differs by float32 round-off, about 1e-6, and one wrong id moves the
gradient by about 1/C of its size, C the counted positions); otherwise it is ``stalled`` (the
rows passed every span test, yet are not the batch), and the note says so. Before that
verdict, an unverified answer is repaired greedily (`lengthen_rows`: insert a stage-1 token
before a row's ``<eos>`` while the gradient distance falls), which restores the GRU's last
inputs when the stage-2 span misses them; this step is gradient matching, not a span test.

**FedAvg and secure aggregation.** Under FedAvg (``TextTarget.local`` of several steps) the
update is the weight change of several SGD steps read as one gradient (divided by ``steps *
lr``): each step's rows are those of the weights it started from, so the rows of the sent
model are not exactly in the spans, and the stages may keep wrong candidates or miss true ones.
The verification then compares the observed update with the one the answer gives under the same
local steps (the server knows them: `leakbench.client.update.local_change`), not
with a single gradient, so ``exact`` still means that the answer reproduces the update; the
note says that the update is not a single-step gradient. Under secure aggregation
(``TextTarget.clients`` K > 1) the update is the mean of K clients' gradients and the answer's
is the gradient of its B x K rows as one batch: the two are equal only when every client counts
as many positions (the note says so), so a right answer may be reported ``stalled``, never the
reverse.

**Adaptive variants** (a defense's ``adaptive`` setting picks them; ``test``):

- ``exact`` (default): the calibrated threshold of both stages.
- ``rank``: for noisy or pruned gradients, where no exact test holds. The rank r is the
  spectral gap's if there is one, else min(B x (L-1), d - 1) (what the batch's shape allows);
  stage 1 keeps the B x (L-1) lowest-residual tokens at each position (stage 1 is only a
  filter), and stage 2 keeps the B lowest-residual extensions of the live prefixes at each
  position (less the rows that ended), fewer when the ranked residuals jump by
  `RANK_GAP_DECADES` (a decade) among them: the rows before the jump are the batch's, and a
  prefix left without extension has ended; then each row is cut where the gradient of the answer
  comes closest to the observed one (`end_rows`: inputs, ``<eos>``, padding; gradient
  matching). Its stop reason is ``converged`` (an answer by ranking, no test passed) below
  rank, ``beyond_rank`` above. A beyond-rank answer is this variant's. Under
  top-k pruning the kept entries are not the gradient of any input, so no span test on them is
  exact; ranking by distance is what survives (documented; measured where the defense runs).
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf
from scipy.optimize import linear_sum_assignment

from leakbench.attacks.base import ATTACKS, RETRIES
from leakbench.attacks.text.base import TextAttack, TextResult, TextTarget
from leakbench.client.update import local_change
from leakbench.components.text_models import TiedHead, input_embedding
from leakbench.core.errors import ConfigError
from leakbench.core.params import Choice, Int, param
from leakbench.datasets.text_base import EOS, PAD
from leakbench.modalities.text import TEXT, next_token_loss

GAP_DECADES = 2.0
RANK_GAP_DECADES = 1.0  # a jump in the ranked residuals that ends the kept extensions
# an answer whose own gradient is this close to the observed one (relative) is verified exact
VERIFIED = 1e-3
FLOOR = 100.0 * float(np.finfo(np.float32).eps)  # the round-off of float32 rows, about 1.2e-5
_CHUNK = 2048  # candidate prefixes per forward pass
# the stop reason of an answer below rank: a passed test, or a ranking (no test passed)
_STOP = {"exact": "exact", "rank": "converged"}


@dataclasses.dataclass(frozen=True)
class Basis:
    """A calibrated span: the top-r left singular vectors of a stacked kernel gradient.

    Attributes:
        vectors: [d, r] orthonormal columns.
        tolerance: The largest relative residual accepted (the module's rule); NaN when the
            spectrum has no gap.
        full: True when the spectrum shows no gap (the span cannot refuse a candidate).
    """

    vectors: np.ndarray
    tolerance: float
    full: bool

    @property
    def rank(self) -> int:
        return int(self.vectors.shape[1])

    @property
    def width(self) -> int:
        return int(self.vectors.shape[0])


def calibrate(matrix: np.ndarray, cap: int) -> Basis:
    """The span of ``matrix`` [d, k] by the module's rule; ``cap`` is the rank taken when the
    spectrum has no gap (clipped to d - 1)."""
    u, s, _ = np.linalg.svd(np.asarray(matrix, np.float64), full_matrices=False)
    width = int(matrix.shape[0])
    if s.size == 0 or s[0] <= 0.0:
        return Basis(np.zeros((width, 0)), 0.0, False)
    logs = np.log10(np.maximum(s / s[0], 1e-300))
    drops = logs[:-1] - logs[1:]
    rank = int(np.argmax(drops)) + 1 if drops.size else width
    if drops.size and drops.max() >= GAP_DECADES and rank < width - 1:
        return Basis(u[:, :rank], max(float(s[rank] / s[rank - 1]), FLOOR), False)
    rank = max(1, min(int(cap), width - 1, s.size))
    return Basis(u[:, :rank], math.nan, True)


def residuals(basis: Basis, rows: np.ndarray) -> np.ndarray:
    """Relative distance of each row (``[..., d]``) from the span: ``|x - U U^T x| / |x|``."""
    x = np.asarray(rows, np.float64)
    left = x - (x @ basis.vectors) @ basis.vectors.T
    norms = np.linalg.norm(x, axis=-1)
    return np.linalg.norm(left, axis=-1) / np.where(norms > 0.0, norms, 1.0)


@dataclasses.dataclass(frozen=True)
class Layout:
    """The layers the attack reads, found by type (any names): the first two
    ``MultiHeadAttention`` layers (a transformer), or else the first ``GRU`` fed by the input
    embedding; the output layer (the model's last: a ``Dense`` head, or `TiedHead`)."""

    kind: str
    attention: tuple[keras.layers.MultiHeadAttention, ...]
    gru: keras.layers.GRU | None
    embedding: keras.layers.Embedding
    head: keras.layers.Layer

    @property
    def tied(self) -> bool:
        return isinstance(self.head, TiedHead)


_NEEDS = (
    "text attack span: needs two keras.layers.MultiHeadAttention layers (their query, key and "
    "value kernels), or a keras.layers.GRU that reads the Embedding's output (its input kernel)"
)


def layout(model: keras.Model) -> Layout:
    """The model's `Layout`; raises `ConfigError` saying what span needs where it is absent."""
    try:
        embedding = input_embedding(model)
    except ConfigError as error:
        raise ConfigError(f"{_NEEDS}, after an Embedding; {error}") from None
    head = model.layers[-1]
    dense = isinstance(head, keras.layers.Dense) and head.bias is not None
    if not (isinstance(head, TiedHead) or dense):
        raise ConfigError(
            f"text attack span: needs a Dense output layer with a bias (or leakbench's tied "
            f"head); model {model.name} ends with {type(head).__name__} {head.name!r}"
        )
    attention = tuple(
        layer for layer in model.layers if isinstance(layer, keras.layers.MultiHeadAttention)
    )
    if len(attention) >= 2:
        return Layout("transformer", attention[:2], None, embedding, head)
    for layer in model.layers:
        if isinstance(layer, keras.layers.GRU) and _reads(layer) is embedding.output:
            return Layout("gru", (), layer, embedding, head)
    raise ConfigError(f"{_NEEDS}; model {model.name} has neither")


def _reads(layer: keras.layers.Layer) -> keras.KerasTensor | None:
    """The tensor a layer called once reads first (an attention layer's query), else None."""
    try:
        tensor = layer.input
    except (AttributeError, ValueError):
        return None
    return tensor[0] if isinstance(tensor, (list, tuple)) else tensor


def _gradient(target: TextTarget, variable: keras.Variable) -> np.ndarray:
    """The observed gradient of one of the model's trainable variables."""
    for var, grad in zip(target.model.trainable_variables, target.gradients, strict=True):
        if var is variable:
            if isinstance(grad, tf.IndexedSlices):
                raise TypeError(f"gradient of {var.path} is tf.IndexedSlices; the wire is dense")
            return np.asarray(grad, np.float64)
    raise ConfigError(
        f"text attack span: model {target.model.name}: {variable.path} is not trainable"
    )


def stacked(blocks: Sequence[np.ndarray]) -> np.ndarray:
    """Kernel gradients side by side as [d, k], each (flattened past its first axis) divided
    by its Frobenius norm so that no block's scale decides the spectrum."""
    parts = []
    for block in blocks:
        flat = np.asarray(block, np.float64).reshape(block.shape[0], -1)
        norm = np.linalg.norm(flat)
        parts.append(flat / norm if norm > 0.0 else flat)
    return np.concatenate(parts, axis=1)


def _attention_kernels(target: TextTarget, block: int) -> np.ndarray:
    attention = layout(target.model).attention[block]
    denses = (attention.query_dense, attention.key_dense, attention.value_dense)
    return stacked([_gradient(target, dense.kernel) for dense in denses])


def head_kernel(target: TextTarget, inputs: np.ndarray) -> np.ndarray:
    """The head's kernel gradient [d, V] (``sum_p h_p (softmax_p - onehot(y_p))^T / C``). For a
    tied head it is the embedding gradient's transpose, with the rows of ``inputs`` (the
    input tokens, whose rows also carry input-side terms) set to zero."""
    parts = layout(target.model)
    if not parts.tied:
        return _gradient(target, parts.head.kernel)
    table = _gradient(target, parts.embedding.embeddings).copy()
    table[np.asarray(inputs, int)] = 0.0
    return table.T


def _head_bias(target: TextTarget) -> np.ndarray:
    return _gradient(target, layout(target.model).head.bias)


def _submodel(model: keras.Model, tensor: keras.KerasTensor) -> keras.Model:
    return keras.Model(model.inputs[0], tensor)


@dataclasses.dataclass(frozen=True)
class _Stages:
    """What the search reads for one target: the two calibrated spans, the stage-1 candidate
    rows [V, L-1, d] and the model giving each prefix's stage-2 rows."""

    first: Basis
    second: Basis
    candidates: np.ndarray
    prefix_rows: keras.Model


def _transformer_stages(target: TextTarget, cap: int) -> _Stages:
    """The transformer's stages: each attention layer's query input is a stage's row."""
    model, length = target.model, target.sequence_length - 1
    attention = layout(model).attention
    first = calibrate(_attention_kernels(target, 0), cap)
    grid = np.tile(np.arange(target.vocabulary_size, dtype=np.int32)[:, None], (1, length))
    candidates = np.asarray(_submodel(model, _reads(attention[0]))(grid))
    second = calibrate(_attention_kernels(target, 1), cap)
    return _Stages(first, second, candidates, _submodel(model, _reads(attention[1])))


def _gru_stages(target: TextTarget, cap: int, tokens: np.ndarray | None) -> _Stages:
    """The GRU's stages; ``tokens`` (the stage-1 set, once known) are left out of a tied head's
    columns."""
    model, length = target.model, target.sequence_length - 1
    parts = layout(model)
    assert parts.gru is not None
    first = calibrate(stacked([_gradient(target, parts.gru.cell.kernel)]), cap)
    table = np.asarray(parts.embedding.embeddings, np.float64)
    candidates = np.broadcast_to(table[:, None, :], (table.shape[0], length, table.shape[1]))
    inputs = np.arange(0) if tokens is None else tokens
    recurrent = _gradient(target, parts.gru.cell.recurrent_kernel)
    second = calibrate(stacked([recurrent, head_kernel(target, inputs)]), cap)
    return _Stages(first, second, candidates, _submodel(model, parts.gru.output))


def _last_rows(stages: _Stages, prefixes: Sequence[Sequence[int]]) -> np.ndarray:
    """The stage-2 row of each prefix (all of one length) at its last position."""
    ids = np.asarray(prefixes, np.int32)
    out = [
        np.asarray(stages.prefix_rows(ids[i : i + _CHUNK]))[:, -1, :]
        for i in range(0, len(ids), _CHUNK)
    ]
    return np.concatenate(out, axis=0)


@dataclasses.dataclass
class _Search:
    """The prefix search's state: live prefixes, ended rows, tests made, worst accepted
    residual."""

    live: list[list[int]]
    ended: list[list[int]]
    tests: int = 0
    worst: float = 0.0


def _extend_exact(state: _Search, stages: _Stages, tokens: np.ndarray, rows: int) -> None:
    """One position of the exact search: keep the extensions that pass the stage-2 test; a
    prefix with none has ended. At most ``rows`` rows, live and ended, are kept (lowest
    residual first)."""
    extensions = [prefix + [int(t)] for prefix in state.live for t in tokens]
    if not extensions:
        state.ended += [prefix for prefix in state.live if prefix]
        state.live = []
        return
    scores = residuals(stages.second, _last_rows(stages, extensions))
    state.tests += len(extensions)
    passed = np.flatnonzero(scores < stages.second.tolerance)
    parents = {tuple(extensions[i][:-1]) for i in passed}
    state.ended += [prefix for prefix in state.live if prefix and tuple(prefix) not in parents]
    room = max(rows - len(state.ended), 0)
    kept = passed[np.argsort(scores[passed], kind="stable")][:room]
    if kept.size:
        state.worst = max(state.worst, float(scores[kept].max()))
    state.live = [extensions[i] for i in kept]


def _extend_ranked(state: _Search, stages: _Stages, tokens: np.ndarray, rows: int) -> None:
    """One position of the ranked search: of the extensions ranked by residual, the first
    ``rows`` (less the rows already ended) survive, cut at the widest gap of at least
    `RANK_GAP_DECADES` between consecutive residuals among them and the next one; a prefix
    with no surviving extension has ended."""
    extensions = [prefix + [int(t)] for prefix in state.live for t in tokens]
    if not extensions:
        return
    scores = residuals(stages.second, _last_rows(stages, extensions))
    state.tests += len(extensions)
    order = np.argsort(scores, kind="stable")
    room = max(rows - len([p for p in state.ended if p]), 1)
    head = np.log10(np.maximum(scores[order[: room + 1]], 1e-300))
    drops = head[:-1] - head[1:] if head.size > 1 else np.zeros(0)
    keep = room
    if drops.size and -drops.min() >= RANK_GAP_DECADES:
        keep = min(room, int(np.argmin(drops)) + 1)
    kept = order[:keep]
    parents = {tuple(extensions[i][:-1]) for i in kept}
    state.ended += [prefix for prefix in state.live if prefix and tuple(prefix) not in parents]
    state.worst = max(state.worst, float(scores[kept].max()))
    state.live = [extensions[i] for i in kept]


def stage_one(stages: _Stages, ranked: bool, keep: int) -> list[np.ndarray]:
    """Per position, the tokens whose stage-1 row passes (exact) or the ``keep`` tokens of
    lowest residual (ranked)."""
    scores = residuals(stages.first, stages.candidates)  # [V, L-1]
    if ranked:
        order = np.argsort(scores, axis=0, kind="stable")[:keep]
        return [np.sort(order[:, p]) for p in range(scores.shape[1])]
    return [np.flatnonzero(scores[:, p] < stages.first.tolerance) for p in range(scores.shape[1])]


def order_rows(stages: _Stages, per_position: list[np.ndarray], ranked: bool, rows: int) -> _Search:
    """The prefix search of the module docstring over the stage-1 tokens of each position."""
    state = _Search(live=[[]], ended=[])
    step = _extend_ranked if ranked else _extend_exact
    for tokens in per_position:
        step(state, stages, tokens, rows)
        if not state.live:
            break
    state.ended += [prefix for prefix in state.live if prefix]
    state.live = []
    return state


def _unknown_counts(
    target: TextTarget, rows: list[list[int]], probs: list[np.ndarray]
) -> np.ndarray:
    """How many full rows end on each token, from the head bias's gradient (module docstring):
    ``sum_p softmax_p - C * grad(b) - (the known targets' counts)``, rounded."""
    counted = sum(len(row) for row in rows)
    total = sum(p.sum(axis=0) for p in probs) - counted * _head_bias(target)
    full = target.sequence_length - 1
    for row in rows:
        known = row[1:] + ([] if len(row) == full else [EOS])
        np.subtract.at(total, np.asarray(known, int), 1.0)
    return np.maximum(np.rint(total), 0).astype(int)


def last_targets(target: TextTarget, rows: list[list[int]]) -> list[int]:
    """The id after each row's inputs: ``<eos>`` for a row that ended early, else read from the
    head (module docstring)."""
    full = target.sequence_length - 1
    ends = [EOS if len(row) < full else -1 for row in rows]
    open_rows = [i for i, row in enumerate(rows) if len(row) == full]
    if not open_rows:
        return ends
    model = target.model
    hidden_model = _submodel(model, _reads(layout(model).head))
    hidden = [np.asarray(hidden_model(np.asarray([row], np.int32)))[0] for row in rows]
    probs = [
        np.asarray(tf.nn.softmax(model(np.asarray([row], np.int32)), axis=-1))[0] for row in rows
    ]
    counts = _unknown_counts(target, rows, probs)
    tokens = np.repeat(np.arange(counts.size), counts)
    if tokens.size == 0:
        tokens = np.argsort(-counts)[: len(open_rows)]
    counted = sum(len(row) for row in rows)
    inputs = np.unique(np.concatenate([np.asarray(r, int) for r in rows]))
    left = sum(h.T @ p for h, p in zip(hidden, probs, strict=True)) - counted * head_kernel(
        target, inputs
    )
    for row, h in zip(rows, hidden, strict=True):
        known = row[1:] + ([] if len(row) == full else [EOS])
        for pos, token in enumerate(known):
            left[:, token] -= h[pos]
    last = np.stack([hidden[i][-1] for i in open_rows])
    cols = left[:, tokens].T
    cosine = (last @ cols.T) / np.outer(
        np.linalg.norm(last, axis=1) + 1e-30, np.linalg.norm(cols, axis=1) + 1e-30
    )
    picked, chosen = linear_sum_assignment(-cosine)
    for i, j in zip(picked, chosen, strict=True):
        ends[open_rows[i]] = int(tokens[j])
    return [EOS if end < 0 else end for end in ends]


def relative_distance(target: TextTarget, ids: np.ndarray) -> float:
    """``|grad(ids) - observed| / |observed|`` over every variable (`gradient_distance`)."""
    norm = sum(float(np.sum(np.asarray(g, np.float64) ** 2)) for g in target.gradients)
    return math.sqrt(gradient_distance(target, ids) / norm) if norm > 0.0 else math.inf


_GRADIENTS: weakref.WeakKeyDictionary[keras.Model, dict[object, object]] = (
    weakref.WeakKeyDictionary()
)


def _gradient_function(target: TextTarget) -> object:
    """What a client without a defense would share for candidate ids, as one traced function
    per model and local training: the dense gradient (`leakbench.modalities.text`), or
    under FedAvg the weight change of the target's local steps divided by ``steps * lr`` (what
    ``target.gradients`` holds then)."""
    model, local = target.model, target.local
    if local is not None and local.fedsgd:
        local = None
    functions = _GRADIENTS.setdefault(model, {})
    if local not in functions:
        if local is None:

            @tf.function(reduce_retracing=True)
            def gradients(ids: tf.Tensor) -> list[tf.Tensor]:
                with tf.GradientTape() as tape:
                    loss = next_token_loss(model, ids)
                raw = tape.gradient(loss, model.trainable_variables)
                return [tf.convert_to_tensor(g) for g in raw]

            functions[local] = gradients
        else:
            scale = local.scale

            @tf.function  # the local steps read the batch's size: one trace per shape
            def simulated(ids: tf.Tensor) -> list[tf.Tensor]:
                return [c / scale for c in local_change(model, ids, ids, local, TEXT)]

            functions[local] = simulated
    return functions[local]


def gradient_distance(target: TextTarget, ids: np.ndarray) -> float:
    """Squared distance between the update of the candidate batch ``ids`` (the server's own
    computation, as a client without a defense would share it: `_gradient_function`) and the
    observed one."""
    grads = _gradient_function(target)(tf.constant(ids, tf.int32))  # type: ignore[operator]
    return float(
        sum(
            np.sum((np.asarray(g, np.float64) - np.asarray(o, np.float64)) ** 2)
            for g, o in zip(grads, target.gradients, strict=True)
        )
    )


def swap_ends(target: TextTarget, ids: np.ndarray, open_rows: Sequence[int]) -> np.ndarray:
    """Exchanges the last ids of two full rows while that lowers `gradient_distance`: the
    tied head's assignment is approximate (module docstring), its multiset is not."""
    best, score = ids.copy(), gradient_distance(target, ids)
    last = target.sequence_length - 1
    improved = True
    while improved:
        improved = False
        for i, a in enumerate(open_rows):
            for b in open_rows[i + 1 :]:
                if best[a, last] == best[b, last]:
                    continue
                trial = best.copy()
                trial[[a, b], last] = best[[b, a], last]
                trial_score = gradient_distance(target, trial)
                if trial_score < score:
                    best, score, improved = trial, trial_score, True
    return best


def lengthen_rows(
    target: TextTarget, ids: np.ndarray, distance: float, tokens: np.ndarray
) -> tuple[np.ndarray, float]:
    """Greedy repair of an unverified answer: insert one stage-1 token before a row's
    ``<eos>`` while that lowers `relative_distance` (the GRU's last input can fail its
    stage-2 test: module docstring); at most B insertions, and it stops when verified or when
    nothing helps."""
    best = ids.copy()
    for _ in range(ids.shape[0]):  # at most B insertions
        if distance < VERIFIED:
            break
        trials = []
        for b in range(best.shape[0]):
            ends = np.flatnonzero(best[b] == EOS)
            if ends.size == 0 or ends[0] + 1 >= best.shape[1]:
                continue
            for token in tokens:
                trial = best.copy()
                trial[b, ends[0]], trial[b, ends[0] + 1] = int(token), EOS
                trials.append(trial)
        scored = [(relative_distance(target, trial), k) for k, trial in enumerate(trials)]
        if not scored or min(scored)[0] >= distance:
            break
        distance, k = min(scored)
        best = trials[k]
    return best, distance


def end_rows(target: TextTarget, ids: np.ndarray) -> np.ndarray:
    """Where each row of a ranked answer ends (its search runs every row to L - 1): row by row,
    the cut ``inputs[:n] + <eos> + <pad>...`` (or no cut) of least `gradient_distance`. This is
    gradient matching of the whole update; noise adds about the same to every candidate."""
    best = ids.copy()
    length = ids.shape[1]
    for b in range(ids.shape[0]):
        trials = [best]
        for n in range(1, length - 1):
            trial = best.copy()
            trial[b, n], trial[b, n + 1 :] = EOS, PAD
            trials.append(trial)
        scores = [gradient_distance(target, trial) for trial in trials]
        best = trials[int(np.argmin(scores))]
    return best


def assemble(rows: list[list[int]], ends: list[int], batch: int, length: int) -> np.ndarray:
    """[batch, length] ids: each row's inputs, its last target, then ``<pad>``; missing rows
    repeat the found ones (``<pad>`` rows when none was found)."""
    out = np.full((batch, length), PAD, np.int32)
    for b in range(min(batch, len(rows)) if rows else 0):
        row = rows[b] + [ends[b]]
        out[b, : len(row)] = row[:length]
    for b in range(len(rows), batch):
        if rows:
            out[b] = out[b % len(rows)]
    return out


def _stages_and_tokens(target: TextTarget, ranked: bool) -> tuple[_Stages, list[np.ndarray]]:
    """Both stages and the stage-1 tokens of each position (for the GRU with a tied head the
    second span is recalibrated without the stage-1 tokens' embedding rows)."""
    cap = target.batch_size * (target.sequence_length - 1)
    if layout(target.model).kind == "transformer":
        stages = _transformer_stages(target, cap)
        return stages, stage_one(stages, ranked or stages.first.full, cap)
    stages = _gru_stages(target, cap, None)
    if ranked or stages.first.full:
        # one token set for every position: the lowest residuals, as many as positions allow
        scores = residuals(stages.first, stages.candidates[:, 0])
        tokens = np.sort(np.argsort(scores, kind="stable")[: min(cap, scores.size)])
    else:
        tokens = np.flatnonzero(
            residuals(stages.first, stages.candidates[:, 0]) < stages.first.tolerance
        )
    if layout(target.model).tied:
        stages = _gru_stages(target, cap, tokens)
    return stages, [tokens] * (target.sequence_length - 1)


def _note(target: TextTarget, stages: _Stages, filled: int, reason: str, distance: float) -> str:
    batch, length, width = target.batch_size, target.sequence_length, stages.first.width
    parts = []
    if stages.first.full or stages.second.full:
        if batch * (length - 1) >= width:
            parts.append(f"beyond rank: B x (L-1) = {batch * (length - 1)} >= d = {width}")
        else:
            which = "first" if stages.first.full else "second"
            parts.append(
                f"beyond rank: the {which} stage's gradient shows no rank gap (d = {width})"
            )
    elif batch * (length - 1) >= width:
        parts.append(
            f"B x (L-1) = {batch * (length - 1)} >= d = {width}, but the spans have rank "
            f"{stages.first.rank} and {stages.second.rank} (padding)"
        )
    if reason == "stalled":
        parts.append(
            f"the rows pass the span tests but their gradient is off by {distance:.1e} "
            f"(relative; a verified answer is below {VERIFIED:g})"
        )
    if filled:
        parts.append(f"{filled} row(s) repeat found rows (equal rows or one a prefix of another)")
    local = target.local
    if local is not None and not local.fedsgd:
        parts.append(
            f"FedAvg update of {local.steps} local steps at lr {local.lr:g}, not a single-step "
            "gradient: the span tests assume one; the answer is checked by simulating the steps"
        )
    if target.clients > 1:
        parts.append(
            f"mean of {target.clients} clients' updates, checked as one batch's gradient (equal "
            "only when the clients count as many positions)"
        )
    return "; ".join(parts)


@ATTACKS.register("span")
@dataclasses.dataclass(frozen=True)
class SpanAttack(TextAttack):
    """Exact span recovery (DAGER); the module docstring states every rule.

    Attributes:
        test: ``exact`` (calibrated threshold) or ``rank`` (the B lowest residuals; the
            adaptive variant for noise and pruning).
        max_vocabulary: The largest V it tests (every token at every position is a candidate).
    """

    name = "span"
    not_adaptive = ("max_vocabulary",)

    retries: int = param(0, RETRIES, doc="fresh starts (it draws nothing)", keyed_when_set=True)
    test: str = param("exact", Choice("exact", "rank"), doc="accept by threshold or by rank")
    max_vocabulary: int = param(
        100_000, Int(4, 10_000_000), doc="largest vocabulary it tests (V x (L-1) candidates)"
    )

    def check_model(self, model: keras.Model) -> None:
        layout(model)

    def run(self, target: TextTarget, seed: tf.Tensor) -> TextResult:
        """Recovers the batch; deterministic (``seed`` is not used)."""
        del seed
        self.check_model(target.model)
        if target.vocabulary_size > self.max_vocabulary:
            raise ConfigError(
                f"text attack span: max_vocabulary is {self.max_vocabulary}, the model has "
                f"V = {target.vocabulary_size}"
            )
        stages, per_position = _stages_and_tokens(target, self.test == "rank")
        beyond = stages.first.full or stages.second.full
        search = order_rows(stages, per_position, self.test == "rank" or beyond, target.batch_size)
        rows = search.ended[: target.batch_size]
        ends = last_targets(target, rows) if rows else []
        ids = assemble(rows, ends, target.batch_size, target.sequence_length)
        if self.test == "rank" or beyond:
            ids = end_rows(target, ids)
        full = [b for b, row in enumerate(rows) if len(row) == target.sequence_length - 1]
        if len(full) > 1 and layout(target.model).tied:
            ids = swap_ends(target, ids, full)
        distance = relative_distance(target, ids)
        if not beyond and self.test == "exact" and not distance < VERIFIED:
            ids, distance = lengthen_rows(target, ids, distance, per_position[0])
        reason = "beyond_rank" if beyond else _STOP[self.test]
        if reason == "exact" and not distance < VERIFIED:
            reason = "stalled"
        candidates = target.vocabulary_size * (target.sequence_length - 1)
        budget = candidates + candidates * target.batch_size
        return TextResult(
            ids=ids,
            loss=distance,
            stop_reason=reason,
            iterations_used=candidates + search.tests,
            budget=max(budget, candidates + search.tests),
            note=_note(target, stages, target.batch_size - len(rows), reason, distance),
        )
