"""Execution of a text run's trials and trainings (`leakbench.run.text_plan`).

One group is one private batch (a seed, a batch size, a batch index) with every defense and attack:
the model of the seed (`build_text_model`, weights from the seed, untrained), the client's observed
update under each defense (`leakbench.client.update.defended_update` of the text modality: the dense
gradient, the defense's draw keyed by `leakbench.core.seeds.observed_draw` of the seed and the
batch's key), each attack's `TextReconstruction` (its final ``__call__``: checked, seeded,
retried, timed) on a `TextTarget` holding only what the server sees, and
the judge: the per-sentence scores of `leakbench.components.text_metrics` against the private ids
(which only the judge reads). The rows of a group are stored in one transaction by the runner.

The threat model (`leakbench.run.text_checks.check_text_threat_model`) as the image track reads it
(`leakbench.run.execute.observed_update`): under FedAvg each client shares its defended weight
change after local training (`leakbench.client.update.local_change`), which the target holds divided
by ``steps * lr`` (one gradient's worth; `TextTarget.local`); under secure aggregation (``clients``
K > 1) a trial's batch holds B x K sentences, client k the k-th B of them with its own defense draw
(`leakbench.core.seeds.client_draw`), and the server sees the mean of the K updates.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from leakbench.attacks.text.bag_of_words import MARKS, bag_scores
from leakbench.attacks.text.base import TextTarget
from leakbench.client.text_training import train_text
from leakbench.client.update import observer
from leakbench.components.text_metrics import score_text_batch
from leakbench.components.text_models import EMBEDDING, build_text_model
from leakbench.core.canonical import canonical_json
from leakbench.core.federated import LocalTraining
from leakbench.core.seeds import attack_seed, client_draw
from leakbench.datasets.text_base import TextCorpus, Vocabulary, build_vocabulary
from leakbench.defenses import Defense
from leakbench.modalities.text import TEXT
from leakbench.run.config import RunSpec
from leakbench.run.text_plan import TextTraining, TextTrial, attackable

# A batch's key in the seeded streams: batch b of batch size B is B * BATCH_STRIDE + b, so
# that batch sizes draw their own defense noise and attack starts.
BATCH_STRIDE = 10_000


@dataclasses.dataclass
class TextContext:
    """What every group of a text run reads: the vocabulary, the encoded pools, the models."""

    spec: RunSpec
    vocabulary: Vocabulary
    private_ids: np.ndarray
    public_ids: np.ndarray
    models: dict[int, keras.Model] = dataclasses.field(default_factory=dict)
    observers: dict[tuple[int, str, LocalTraining | None], Any] = dataclasses.field(
        default_factory=dict
    )

    @classmethod
    def of(cls, spec: RunSpec, corpus: TextCorpus) -> TextContext:
        """The context of ``spec`` on ``corpus`` (its vocabulary from the public pool)."""
        assert spec.text is not None
        vocabulary = build_vocabulary(corpus, spec.text.max_words)
        length = spec.text.sequence_length
        return cls(
            spec,
            vocabulary,
            vocabulary.encode_many(corpus.private, length),
            vocabulary.encode_many(corpus.public, length),
        )

    def model(self, seed: int) -> keras.Model:
        """The attacked model of ``seed`` (built once; never changed by a trial)."""
        if seed not in self.models:
            self.models[seed] = text_model(self.spec, len(self.vocabulary), seed)
        return self.models[seed]

    def local(self, batch_size: int) -> LocalTraining | None:
        """Each client's local training for a client batch of ``batch_size`` sentences, None
        for FedSGD (`leakbench.run.sections.ThreatModel.local_training`)."""
        local = self.spec.threat_model.local_training(batch_size)
        return None if local.fedsgd else local

    def observe(self, seed: int, defense: Defense, ids: np.ndarray, key: int) -> list[tf.Tensor]:
        """The update the server sees of ``ids`` under ``defense`` on the model of ``seed``:
        one client's (its draw keyed by ``key``), or under secure aggregation the mean of K
        clients' updates, client k holding the k-th ``len(ids) / K`` sentences and drawing by
        `client_draw` (client 0 as a lone client). Each update is `observer`'s, traced
        once per defense, model, local training and client batch shape."""
        clients = self.spec.threat_model.clients
        size = len(ids) // clients
        local = self.local(size)
        name = (seed, canonical_json([defense.name, defense.params()]), local)
        if name not in self.observers:
            self.observers[name] = observer(defense, self.model(seed), local, TEXT)
        observe = self.observers[name]
        parts = [tf.constant(ids[k * size : (k + 1) * size]) for k in range(clients)]
        updates = [observe(part, part, client_draw(seed, key, k)) for k, part in enumerate(parts)]
        if clients == 1:
            return list(updates[0])
        return [tf.add_n(list(parts)) / clients for parts in zip(*updates, strict=True)]

    def target(self, seed: int, ids: np.ndarray, observed: tuple[tf.Tensor, ...]) -> TextTarget:
        """What the server attacks: the observed update (under FedAvg divided by ``steps *
        lr``, as `TextTarget.local` says) and what it knows of the batch and the threat
        model."""
        clients = self.spec.threat_model.clients
        local = self.local(len(ids) // clients)
        if local is not None:
            observed = tuple(g / local.scale for g in observed)
        return TextTarget(
            self.model(seed),
            observed,
            len(ids),
            ids.shape[1],
            len(self.vocabulary),
            self.public_ids,
            local=local,
            clients=clients,
        )


def text_model(spec: RunSpec, vocabulary_size: int, seed: int) -> keras.Model:
    """The run's text model with seeded weights, its embedding frozen if the config says so."""
    assert spec.text is not None
    model = build_text_model(
        spec.model,
        vocabulary_size,
        spec.text.sequence_length,
        seed,
        tie_embeddings=spec.text.tie_embeddings,
    )
    if spec.text.freeze_embeddings:
        model.get_layer(EMBEDDING).trainable = False
    return model


def batch_key(trial: TextTrial) -> int:
    """The batch's key in the seeded streams (`BATCH_STRIDE`)."""
    return trial.batch_size * BATCH_STRIDE + trial.batch_index


def words_of(ids: np.ndarray) -> set[int]:
    """The distinct ids of ``ids`` that are words (the sentence marks and padding left out)."""
    flat = np.asarray(ids).ravel()
    return {int(i) for i in flat[~np.isin(flat, MARKS)]}


def run_text_group(context: TextContext, group: list[TextTrial]) -> list[tuple[str, list[Any]]]:
    """The stored rows of every trial of ``group`` (one private batch), as (key, rows)."""
    first = group[0]
    ids = context.private_ids[list(first.indices)]
    key = batch_key(first)
    observed: dict[str, TextTarget] = {}
    items = []
    for trial in group:
        name = canonical_json([trial.defense.name, trial.defense.params()])
        if name not in observed:
            update = tuple(context.observe(first.seed, trial.defense, ids, key))
            observed[name] = context.target(first.seed, ids, update)
        # The final contract: the target checked, attempt k seeded attempt_draw(seed, k), a
        # non-finite attempt retried, a failing kernel recorded (stop_reason "diverged" or
        # "error", the message in the note).
        result = trial.attack(observed[name], seed=attack_seed(first.seed, key))
        scores = score_text_batch(ids, result.ids, context.vocabulary.words)
        precision, recall = bag_scores(words_of(result.ids), words_of(ids))
        rows = [
            {
                **trial.columns(),
                "position": i,
                "sentence_index": trial.indices[i],
                **score,
                "exact": int(bool(score["exact"])),
                "leaked": int(bool(score["leaked"])),
                "bag_precision": precision,
                "bag_recall": recall,
                "loss": result.loss,
                "stop_reason": result.stop_reason,
                "iterations_used": result.iterations_used,
                "budget": result.budget,
                "note": result.note,
                "seconds": result.seconds,
            }
            for i, score in enumerate(scores)
        ]
        items.append((trial.key, _plain(rows)))
    return items


def run_text_training(context: TextContext, training: TextTraining) -> list[dict[str, Any]]:
    """The utility row of one training: the defense's model trained on the private pool less
    its held-out sentences (those the trials draw from), scored on the held-out ones."""
    spec = context.spec
    assert spec.text is not None
    pool = attackable(spec, len(context.private_ids))
    train_ids, test_ids = context.private_ids[:pool], context.private_ids[pool:]
    start = time.perf_counter()
    scores = train_text(
        spec.model,
        len(context.vocabulary),
        spec.text.sequence_length,
        train_ids,
        test_ids,
        training.defense,
        seed=training.seed,
        epochs=spec.text.train_epochs,
        batch_size=spec.text.train_batch_size,
        learning_rate=spec.text.learning_rate,
        tie_embeddings=spec.text.tie_embeddings,
        freeze_embeddings=spec.text.freeze_embeddings,
    )
    row = {
        **training.setting.columns(training.defense, training.seed),
        **scores,
        "seconds": time.perf_counter() - start,
    }
    return _plain([row])


def _plain(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows as JSON holds them: numpy scalars as Python numbers."""
    return [{k: v.item() if isinstance(v, np.generic) else v for k, v in r.items()} for r in rows]
