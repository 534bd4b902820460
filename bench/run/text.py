"""The text pipeline (`leakbench.run.pipeline`): a run whose dataset is a text corpus.

**Plan.** A trial is one (seed, batch size B, batch index, defense configuration, attack
configuration): the private sentences of the batch are a seeded draw from the private pool less
its held-out test sentences (`leakbench.core.seeds.private_indices`, the image runs' draw), the
same sentences for every batch size of a seed (the first ``images`` of the draw, cut into
batches of B), so that batch sizes, defenses and attacks are compared on the same text. Keys
(`leakbench.run.plan.Trial.key`) add ``kind = "text"`` and the ``[text]`` settings that change
the numbers, so that no text key can equal an image one. Under secure aggregation (``clients``
K) a trial's batch holds B x K sentences (B per client) and its ``batch_size`` column is B.

**Execution.** One group is one private batch (a seed, a batch size, a batch index) with every
defense and attack: the model of the seed (`build_text_model`, weights from the seed,
untrained), the client's observed update under each defense
(`leakbench.client.update.observer` of the text modality: the dense gradient, the defense's
draw keyed by the seed and the batch), each attack's `TextReconstruction` (its final
``__call__``: checked, seeded, retried, timed) on a `TextTarget` holding only what the server
sees, and the per-sentence scores of `leakbench.components.text_metrics` against the private
ids (which only the scoring reads). Under FedAvg each client shares its defended weight change
after local training, which the target holds divided by ``steps * lr`` (`TextTarget.local`);
under secure aggregation client k holds the k-th B sentences with its own defense draw
(`leakbench.core.seeds.client_draw`) and the server sees the mean of the K updates.

**Epsilon audit.** Every (batch size, defense configuration) is audited, on the first seed's
model and its first batch of that size (for a defense whose output depends on the batch, its
first ``batches`` batches), with the image audit's rounds, bounds and verdict
(`leakbench.run.epsilon_audit`); each is kept in ``OUT/epsilon_audit.json`` under a key of
everything that decides it (``kind = "text"``), so a resumed run audits only what is missing.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Iterable
from pathlib import Path
from typing import Any, cast

import keras
import numpy as np
import pandas as pd
import tensorflow as tf

from leakbench.attacks.text.bag_of_words import MARKS, bag_scores
from leakbench.attacks.text.base import TextAttack, TextTarget
from leakbench.client.canaries import audit_rounds
from leakbench.client.training import train_text
from leakbench.client.update import observer
from leakbench.components.text_metrics import score_text_batch
from leakbench.components.text_models import EMBEDDING, build_text_model
from leakbench.core.canonical import canonical_json
from leakbench.core.errors import ConfigError
from leakbench.core.federated import LocalTraining
from leakbench.core.seeds import attack_seed, client_draw, private_indices
from leakbench.datasets.text_base import TextCorpus, Vocabulary, build_vocabulary, load_text_corpus
from leakbench.defenses import Defense
from leakbench.modalities.text import TEXT, next_token_loss
from leakbench.outputs.report import write_report
from leakbench.outputs.summary import headline_table
from leakbench.outputs.tables import (
    TEXT_TRIAL_COLUMNS,
    TEXT_UTILITY_COLUMNS,
    leaderboard,
)
from leakbench.run.config import RunSpec
from leakbench.run.epsilon_audit import (
    audit_confidence,
    audit_fields,
    audit_result,
    audited_table,
    batches_for,
    canaries_for,
    with_audit,
)
from leakbench.run.pipeline import PIPELINES, GroupResult, Pipeline, Tables
from leakbench.run.plan import Setting, Training, Trial, plan_batches
from leakbench.run.sections import EpsilonAuditSpec, TextSettings
from leakbench.run.store import Store, trial_key

# The [text] settings that change an attack's numbers (the model, its vocabulary, its ids).
ATTACK_SETTINGS = (
    "sequence_length",
    "max_words",
    "public_share",
    "tie_embeddings",
    "freeze_embeddings",
)
# Those that change a utility training's numbers too.
TRAINING_SETTINGS = (
    *ATTACK_SETTINGS,
    "test_sentences",
    "train_epochs",
    "train_batch_size",
    "learning_rate",
)
# A batch's key in the seeded streams: batch b of batch size B is B * BATCH_STRIDE + b, so
# that batch sizes draw their own defense noise and attack starts.
BATCH_STRIDE = 10_000


def text_settings(text: TextSettings, names: tuple[str, ...]) -> dict[str, Any]:
    """The settings ``names`` of a text run's ``[text]`` table ``text``."""
    values = dataclasses.asdict(text)
    return {name: values[name] for name in names}


@PIPELINES.register("text")
class TextPipeline(Pipeline):
    """A text run: a corpus, a next-token model, the text attacks (`leakbench.attacks.text`)."""

    modality = "text"

    def load(self) -> TextContext:
        return TextContext.of(self.spec, load_text_corpus(self.spec.dataset))

    def check(self, data: TextContext, trials: list[Trial]) -> None:
        """Refuses a model that cannot read the run's sequences, attacks that cannot attack
        it and an audit of more batches than the pool holds (one line each)."""
        spec = self.spec
        probe = data.model(spec.seeds[0])
        next_token_loss(probe, data.private_ids[:1])  # checks the input length
        # A text run's trials hold text attacks (`leakbench.attacks.attacks_of`).
        attacks = {canonical_json([t.attack.name, t.attack.params()]): cast(TextAttack, t.attack)
                   for t in trials}  # fmt: skip
        for attack in attacks.values():
            try:
                attack.check_model(probe)
            except ConfigError as error:
                if spec.suite != "standard":
                    raise
                # The standard suite adds every family; a model that one cannot attack runs
                # only with the attacks it lists.
                raise ConfigError(
                    f'{error}; the standard suite runs every text family: set suite = "listed" '
                    "and list the attacks this model can take"
                ) from None
        check_text_audit(spec, len(data.private_ids))

    def plan(self, data: TextContext) -> list[Trial]:
        return plan_text(self.spec, len(data.private_ids))

    def trainings(self, data: TextContext) -> list[Training]:
        return plan_text_training(self.spec)

    def groups(self, trials: list[Trial]) -> list[list[Trial]]:
        """One group per batch (seed, batch size, batch index) with every defense and attack."""
        groups: dict[tuple[int, int, int], list[Trial]] = {}
        for trial in trials:
            groups.setdefault((trial.seed, trial.batch_size, trial.batch_index), []).append(trial)
        return list(groups.values())

    def cache(
        self, data: TextContext, folder: Path | None = None, progress: bool = False
    ) -> TextContext:
        return data

    def attack(
        self,
        data: TextContext,
        group: list[Trial],
        cache: Any,
        skip: Collection[str] = frozenset(),
        checkpoint: Any = None,
    ) -> GroupResult:
        items = [item for item in run_text_group(data, group) if item[0] not in skip]
        return items, {}

    def train(self, data: TextContext, job: Training) -> list[dict[str, Any]]:
        return run_text_training(data, job)

    def audit(
        self, data: TextContext, trials: list[Trial], out: Path, progress: bool
    ) -> pd.DataFrame | None:
        if self.spec.epsilon_audit is None:
            return None
        return run_text_epsilon_audit(self.spec, data, out, progress=progress)

    trial_columns = TEXT_TRIAL_COLUMNS
    utility_columns = TEXT_UTILITY_COLUMNS

    def leaderboard(
        self, trials: pd.DataFrame, utility: pd.DataFrame, audit: pd.DataFrame | None
    ) -> pd.DataFrame:
        """The text leaderboard (`leakbench.outputs.tables`), joined with the epsilon
        audit's rows ``audit`` if given."""
        board = leaderboard(trials, utility=utility, protocol=self.spec.protocol, modality="text")
        return board if audit is None else with_audit(board, audit, "text")

    def summary(self, board: pd.DataFrame) -> str:
        return headline_table(board)

    def export(
        self,
        store: Store,
        trials: list[Trial],
        trainings: list[Training],
        out: Path,
        data: Any,
        audit: pd.DataFrame | None = None,
    ) -> Tables:
        """The tables (`Pipeline.export`) and report.html."""
        frame, utility, board = super().export(store, trials, trainings, out, data, audit)
        write_report(out, trials=frame, board=board)
        return frame, utility, board


def plan_text(spec: RunSpec, private_count: int) -> list[Trial]:
    """Every trial of the text run ``spec`` on a private pool of ``private_count`` sentences,
    in execution order: seed, batch size, batch, defense, attack."""
    assert spec.text is not None
    pool = attackable(spec.text, private_count, images=spec.images, dataset=spec.dataset)
    setting = Setting.of(spec, kind="text", text=text_settings(spec.text, ATTACK_SETTINGS))
    cells = [(d, spec.text_attacks_for(d)) for d in spec.defense_grid()]
    return plan_batches(
        setting,
        spec.seeds,
        lambda seed: private_indices(pool, spec.images, seed),
        list(spec.text.batch_sizes),
        cells,
        clients=spec.threat_model.clients,
    )


def plan_text_training(spec: RunSpec) -> list[Training]:
    """One utility training per seed and defense configuration (none without epochs)."""
    assert spec.text is not None
    if not spec.text.train_epochs:
        return []
    setting = Setting.of(spec)
    fields = (("kind", "text_utility"), ("text", text_settings(spec.text, TRAINING_SETTINGS)))
    return [Training(setting, seed, d, spec.text, 0, fields)
            for seed in spec.seeds for d in spec.defense_grid()]  # fmt: skip


def attackable(text: TextSettings, private_count: int, *, images: int, dataset: str) -> int:
    """How many private sentences trials may draw from: the pool of ``private_count`` less the
    held-out test ones (``text.test_sentences``).

    Raises:
        ConfigError: If that leaves fewer than the run's ``images`` (naming its ``dataset``).
    """
    count = private_count - text.test_sentences
    if count < images:
        raise ConfigError(
            f"images must be at most the private pool of {dataset} less text.test_sentences "
            f"({private_count} - {text.test_sentences} = {max(count, 0)}), got {images}"
        )
    return count


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
            spec = self.spec
            assert spec.text is not None
            self.models[seed] = text_model(spec.model, spec.text, len(self.vocabulary), seed)
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


def text_model(model_name: str, text: TextSettings, vocabulary_size: int, seed: int) -> keras.Model:
    """The run's text model ``model_name`` with seeded weights, its embedding frozen if the
    ``[text]`` settings ``text`` say so."""
    model = build_text_model(
        model_name,
        vocabulary_size,
        text.sequence_length,
        seed,
        tie_embeddings=text.tie_embeddings,
    )
    if text.freeze_embeddings:
        model.get_layer(EMBEDDING).trainable = False
    return model


def batch_key(trial: Trial) -> int:
    """The batch's key in the seeded streams (`BATCH_STRIDE`)."""
    return trial.batch_size * BATCH_STRIDE + trial.batch_index


def words_of(ids: np.ndarray) -> set[int]:
    """The distinct ids of ``ids`` that are words (the sentence marks and padding left out)."""
    flat = np.asarray(ids).ravel()
    return {int(i) for i in flat[~np.isin(flat, MARKS)]}


def run_text_group(context: TextContext, group: list[Trial]) -> list[tuple[str, list[Any]]]:
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


def run_text_training(context: TextContext, training: Training) -> list[dict[str, Any]]:
    """The utility row of one training: the defense's model trained on the private pool less
    its held-out sentences (those the trials draw from), scored on the held-out ones."""
    spec = context.spec
    assert spec.text is not None
    pool = attackable(spec.text, len(context.private_ids), images=spec.images, dataset=spec.dataset)
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


def text_audit_batches(
    dataset: str, pool: int, seed: int, size: int, count: int
) -> list[list[int]]:
    """The private sentences of the first ``count`` batches of ``size`` sentences under
    ``seed``: batch ``j`` is the ``j``-th block of the seed's draw from the ``pool`` sentences
    trials may attack (`leakbench.core.seeds.private_indices`, as the plan draws them), so that
    batch 0 is the one the seed's first trials of that size attack.

    Raises:
        ConfigError: If ``count`` batches do not fit in the pool.
    """
    if count * size > pool:
        raise ConfigError(
            f"epsilon_audit.batches must be at most {pool // size} for {dataset}'s "
            f"{pool} attackable sentences at {size} sentences a batch, got {count}"
        )
    order = private_indices(pool, count * size, seed)
    return [[int(i) for i in order[j * size : (j + 1) * size]] for j in range(count)]


def text_audit_grid(text: TextSettings, defenses: list[Defense]) -> list[tuple[int, Defense]]:
    """What a text run audits, in order: each batch size of its ``[text]`` settings ``text``,
    each of its ``defenses`` (`RunSpec.defense_grid`)."""
    return [(size, defense) for size in text.batch_sizes for defense in defenses]


def check_text_audit(spec: RunSpec, private_count: int) -> None:
    """Refuses, before a run writes anything, an audit that asks for more batches than the
    attackable sentences hold (`text_audit_batches`)."""
    audit = spec.epsilon_audit
    if audit is None:
        return
    assert spec.text is not None
    pool = attackable(spec.text, private_count, images=spec.images, dataset=spec.dataset)
    for size, defense in text_audit_grid(spec.text, spec.defense_grid()):
        text_audit_batches(
            spec.dataset, pool, spec.seeds[0], size, batches_for(defense, audit.batches)
        )


def text_audit_key(
    audit: EpsilonAuditSpec,
    defense: Defense,
    seed: int,
    batches: list[list[int]],
    confidence: float,
    *,
    dataset: str,
    model: str,
    text: TextSettings,
) -> str:
    """Everything that decides a text ``audit``'s numbers (the run's ``dataset``, ``model``
    and the ``[text]`` settings ``text`` that change an attack's), hashed with the engine
    version."""
    return trial_key(
        {
            "kind": "text",
            "epsilon_audit": audit_fields(audit, defense, len(batches), confidence),
            "dataset": dataset,
            "model": model,
            "text": text_settings(text, ATTACK_SETTINGS),
            "defense": defense.name,
            "defense_params": defense.params(),
            "seed": seed,
            "indices": [i for batch in batches for i in batch],
        }
    )


def run_text_epsilon_audit(
    spec: RunSpec,
    context: TextContext,
    out: Path,
    *,
    progress: bool = False,
    notice: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """Audits every (batch size, defense configuration) of the text run ``spec`` (resuming from
    ``OUT/epsilon_audit.json``) and writes ``OUT/epsilon_audit.csv``; returns the table."""
    audit, text = spec.epsilon_audit, spec.text
    assert audit is not None and text is not None
    seed = spec.seeds[0]
    pool = attackable(text, len(context.private_ids), images=spec.images, dataset=spec.dataset)
    grid = text_audit_grid(text, spec.defense_grid())
    defenses = [defense for _, defense in grid]
    levels = audit_confidence(defenses, audit.confidence)
    chosen = [
        text_audit_batches(spec.dataset, pool, seed, size, batches_for(defense, audit.batches))
        for size, defense in grid
    ]
    keys = [
        text_audit_key(
            audit, defense, seed, batches, level, dataset=spec.dataset, model=spec.model, text=text
        )
        for defense, batches, level in zip(defenses, chosen, levels, strict=True)
    ]

    def compute(i: int) -> dict[str, Any]:
        (size, defense), level = grid[i], levels[i]
        canaries = canaries_for(defense, audit.canaries)
        found = audit_rounds(
            defense,
            context.model(seed),
            [(context.private_ids[rows],) * 2 for rows in chosen[i]],
            rounds=audit.rounds,
            seed=seed,
            norm=audit.canary_norm or None,
            canaries=canaries,
            modality=TEXT,
        )
        return {
            "dataset": spec.dataset,
            "model": spec.model,
            "defense": defense.name,
            "defense_params": canonical_json(defense.params()),
            "seed": seed,
            "batch_size": size,
            **audit_result(
                defense,
                found,
                size,
                rounds=audit.rounds,
                delta=audit.delta,
                confidence=level,
                canaries=canaries,
            ),  # fmt: skip
        }

    return audited_table(
        defenses, keys, out, compute, desc=f"{spec.name} epsilon audit", progress=progress,
        notice=notice,
    )  # fmt: skip
