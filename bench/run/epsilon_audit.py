"""The epsilon audit of a run (``[epsilon_audit]``): measured privacy beside promised privacy.

For every defense configuration of the run, the client's update on the first seed's model and
its first batch of private examples is audited with gradient canaries
(`leakbench.client.canaries`), and the scores give a lower bound on epsilon that assumes
nothing of the mechanism (``epsilon_audit``, `leakbench.components.epsilon_bound`). A defense
that declares a Gaussian score (`Defense.gaussian_score`: DP-SGD, Gaussian noise, a chain that
ends in one) is also read by the Gaussian-DP bound (``epsilon_audit_gdp`` and ``mu_audit``,
`leakbench.components.gaussian_dp_bound`), with ``canaries`` Dirac canaries per round where
they are independent trials (`Defense.independent_canaries`).

A defense with a guarantee gets two accountants' epsilons of the same mechanism, one update of
one client (the defense's `Defense.dp_event` at sampling rate 1 and one step): dp-accounting's
Renyi-DP accountant (``epsilon_update``, what the defense's `epsilon` reports and training
states) and its PLD accountant (``epsilon_exact``, tight for the Gaussian mechanism). A lower
bound above the exact value is a failed audit, which means a bug in the defense or in its
accounting; the bound that decides is the Gaussian-DP one where it applies, the
distribution-free one otherwise. So that a run's failures hold together, each guaranteed
defense's bounds are stated at confidence ``1 - (1 - confidence) / m`` for the run's ``m``
guaranteed defense configurations (Bonferroni); a defense without a guarantee, which cannot
fail, gets its measured bounds at ``confidence``.

Each configuration's result is kept in ``OUT/epsilon_audit.json`` under a key of everything that
decides it (the engine version included), written as soon as it is computed, so a resumed run
audits only what is missing; ``OUT/epsilon_audit.csv`` holds the table, in the order of the
run's defenses.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pandas as pd
import tensorflow as tf
from tqdm.auto import tqdm

from leakbench.client.canaries import CanaryRounds, audit_rounds
from leakbench.components.bottleneck import with_architecture
from leakbench.components.epsilon_bound import epsilon_lower_bound
from leakbench.components.gaussian_dp_bound import gaussian_dp_lower_bound
from leakbench.core.canonical import canonical_json
from leakbench.core.errors import ConfigError
from leakbench.core.files import atomic_file
from leakbench.core.seeds import private_indices
from leakbench.datasets import Dataset
from leakbench.defenses import Defense
from leakbench.outputs.tables import (
    AUDIT_BOARD_COLUMNS,
    AUDIT_COLUMNS,
    leaderboard_columns,
    write_csv,
)
from leakbench.run.config import RunSpec
from leakbench.run.pipeline import AUDIT_TABLE
from leakbench.run.plan import Setting, Trial, private_split
from leakbench.run.sections import EpsilonAuditSpec, ThreatModel
from leakbench.run.store import trial_key

AUDIT_RECORD = "epsilon_audit.json"


def verdict(epsilon_exact: float, bound: float) -> str:
    """``failed`` when the measured lower bound exceeds the exact epsilon (a bug), ``passed``
    when it does not, ``no guarantee`` for a defense without one (NaN)."""
    if math.isnan(epsilon_exact):
        return "no guarantee"
    return "failed" if bound > epsilon_exact else "passed"


def update_epsilon(defense: Defense, delta: float, steps: int = 1) -> float:
    """The accountant's epsilon of one update of one client under ``defense`` (its `epsilon`
    at sampling rate 1 and one step; ``steps`` full-batch updates composed), NaN without a
    guarantee."""
    found = defense.epsilon(1.0, steps, delta)
    return math.nan if found is None else float(found)


def exact_epsilon(defense: Defense, delta: float, steps: int = 1) -> float:
    """dp-accounting's PLD epsilon of one update of one client under ``defense`` (its
    `Defense.dp_event` at sampling rate 1 and one step; ``steps`` full-batch updates composed),
    NaN without a guarantee."""
    event = defense.dp_event(1.0, steps)
    if event is None:
        return math.nan
    from dp_accounting import pld

    accountant = pld.PLDAccountant()
    accountant.compose(event)
    return float(accountant.get_epsilon(delta))


def audit_confidence(grid: list[Defense], confidence: float) -> list[float]:
    """Each defense's audit confidence (module docstring): ``confidence`` shared out over the
    ``m`` defenses with a guarantee (Bonferroni), ``confidence`` itself for the others."""
    guaranteed = [defense.dp_event(1.0, 1) is not None for defense in grid]
    m = max(sum(guaranteed), 1)
    return [1.0 - (1.0 - confidence) / m if g else confidence for g in guaranteed]


def canaries_for(defense: Defense, canaries: int) -> int:
    """The canaries per round ``defense`` is audited with: ``canaries`` where its score is
    Gaussian and the canaries are independent trials (`Defense.independent_canaries`), 1
    otherwise (an input canary included)."""
    independent = defense.gaussian_score() and defense.independent_canaries()
    return canaries if independent and not defense.acts_on_data() else 1


def batches_for(defense: Defense, batches: int) -> int:
    """The client batches ``defense`` is audited on: one where its output does not depend on
    the batch beyond the canary (`Defense.data_independent`), ``batches`` otherwise."""
    return 1 if defense.data_independent() else batches


def audit_batches(
    threat: ThreatModel, batch_size: int, name: str, dataset: Dataset, seed: int, count: int
) -> list[list[int]]:
    """The private examples of the first ``count`` client batches of ``seed``: batch ``j`` is
    the ``batch_size`` examples at the start of the ``j``-th block of the seed's permutation
    of the ``threat`` model's private split of ``dataset`` (the config's dataset ``name``;
    `leakbench.core.seeds.private_indices`), a block holding every client's batch, so batch 0
    is the one its first trials attack and the next ones continue the plan's batches, past
    ``images`` where more are asked for."""
    split = private_split(threat, dataset)
    size = batch_size * threat.clients  # the observed batch (`RunSpec.observed_batch`)
    if count * size > len(split):
        raise ConfigError(
            f"epsilon_audit.batches must be at most {len(split) // size} for "
            f"{name}'s {threat.private_split} split at {size} examples a batch, got {count}"
        )
    order = private_indices(len(split), count * size, seed)
    return [[int(i) for i in order[j * size : j * size + batch_size]] for j in range(count)]


def check_audit(
    audit: EpsilonAuditSpec | None,
    dataset: Dataset,
    *,
    name: str,
    defenses: list[Defense],
    threat: ThreatModel,
    batch_size: int,
    seed: int,
) -> None:
    """Refuses, before a run writes anything, an ``audit`` of the run's ``defenses`` (its
    `RunSpec.defense_grid`) that asks for more client batches of its first ``seed`` than the
    private split of ``dataset`` holds (`audit_batches`, with the run's dataset ``name``,
    ``threat`` model and ``batch_size``)."""
    if audit is None:
        return
    count = max(batches_for(defense, audit.batches) for defense in defenses)
    audit_batches(threat, batch_size, name, dataset, seed, count)


def canary_mu(defense: Defense, norm: float, batch_size: int, kind: str) -> float:
    """For noise without clipping (`Defense.unclipped_noise_std`) and a gradient canary: the
    canary's shift in its coordinate, its norm over the ``batch_size + 1`` slots the update
    averages, divided by the noise's std. For Gaussian noise that is exactly the mu of the
    canary's Gaussian-DP, so it decides the bound; for Laplace noise it is the same
    signal-to-noise ratio. NaN for any other defense or an input canary."""
    std = defense.unclipped_noise_std()
    if std is None or kind != "gradient":
        return math.nan
    return norm / (batch_size + 1) / std


def bound_of(defense: Defense) -> str:
    """What a measured bound is about: ``defense`` for one with a guarantee (its clipping
    bounds every example's influence, so the bound meets the accountant's value), ``canary``
    otherwise: nothing bounds the influence of an example, and the bound holds for this
    canary (its norm and place) on these batches, not for the defense."""
    return "defense" if defense.dp_event(1.0, 1) is not None else "canary"


def audit_key(
    audit: EpsilonAuditSpec,
    setting: Setting,
    defense: Defense,
    seed: int,
    batches: list[list[int]],
    confidence: float,
) -> str:
    """Everything that decides an ``audit``'s numbers, hashed with the engine version: one
    batch's audit keeps the key it always had."""
    threat = dict(setting.threat)
    return trial_key(
        {
            "epsilon_audit": audit_fields(audit, defense, len(batches), confidence),
            **({"threat_model": threat} if threat else {}),
            # The image setting's fields: the input size, the training before the attack.
            **dict(setting.fields),
            "dataset": setting.dataset,
            "model": setting.model,
            **setting.model_digest(),
            "defense": defense.name,
            "defense_params": defense.params(),
            "seed": seed,
            "indices": [int(i) for batch in batches for i in batch],
        }
    )


def audit_fields(
    audit: EpsilonAuditSpec, defense: Defense, batches: int, confidence: float
) -> dict[str, Any]:
    """The ``[epsilon_audit]`` settings that decide one defense configuration's audit, as its
    key holds them (`audit_key`; a text run's `leakbench.run.text`): a setting at its
    one-batch, one-canary, gradient-canary value is left out, so older keys stay valid."""
    canaries = canaries_for(defense, audit.canaries)
    return {
        "rounds": audit.rounds,
        "confidence": confidence,
        "delta": audit.delta,
        "canary_norm": audit.canary_norm,
        **({"canaries": canaries} if canaries != 1 else {}),
        **({"batches": batches} if batches != 1 else {}),
        **({"canary": "input"} if defense.acts_on_data() else {}),
    }


def run_epsilon_audit(
    spec: RunSpec,
    dataset: Dataset,
    trials: list[Trial],
    out: Path,
    *,
    progress: bool = False,
    notice: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """Audits every defense configuration of ``spec`` (resuming from ``OUT/epsilon_audit.json``)
    and writes ``OUT/epsilon_audit.csv``.

    The audited batch is the first seed's first batch of the plan (the examples its trials
    attack), and for a defense whose output depends on the batch (`batches_for`) the
    ``[epsilon_audit] batches`` first batches of that seed (`audit_batches`); the model is that
    seed's attacked model (`leakbench.run.execute.attacked_model`), extended as a defense's
    architecture says.

    Returns:
        The table, one row per defense configuration.
    """
    from leakbench.run.execute import attacked_model

    audit = spec.epsilon_audit
    assert audit is not None
    seed = spec.seeds[0]
    mine = [t for t in trials if t.seed == seed]
    if not mine:
        return pd.DataFrame(columns=AUDIT_COLUMNS)
    first = min(mine, key=lambda t: t.batch_index)  # the seed's first batch (``first_batch``)
    grid = spec.defense_grid()
    counts = [batches_for(defense, audit.batches) for defense in grid]
    threat = spec.threat_model
    every = audit_batches(threat, spec.batch_size, spec.dataset, dataset, seed, max(counts))
    assert every[0] == list(first.indices)[: spec.batch_size]
    split = private_split(threat, dataset)
    data = [
        (split.x[rows], tf.one_hot(split.y[rows], dataset.num_classes).numpy()) for rows in every
    ]
    setting = first.setting
    levels = audit_confidence(grid, audit.confidence)
    keys = [
        audit_key(audit, setting, defense, seed, every[:count], level)
        for defense, level, count in zip(grid, levels, counts, strict=True)
    ]
    base: list[keras.Model] = []

    def compute(i: int) -> dict[str, Any]:
        if not base:
            base.append(
                attacked_model(spec.model, dataset, seed, threat=threat, training=spec.training)
            )
        defense, model = grid[i], base[0]
        if defense.architecture is not None:
            model = with_architecture(base[0], defense.architecture, seed)
        return _audit_record(audit, setting, defense, model, data[: counts[i]], seed, levels[i])

    return audited_table(
        grid, keys, out, compute, desc=f"{spec.name} epsilon audit", progress=progress,
        notice=notice,
    )  # fmt: skip


def audited_table(
    grid: list[Defense],
    keys: list[str],
    out: Path,
    compute: Callable[[int], dict[str, Any]],
    *,
    desc: str,
    progress: bool = False,
    notice: Callable[[str], None] | None = None,
) -> pd.DataFrame:
    """The audit table of ``grid`` (one row per configuration, `completed`), written to
    ``OUT/epsilon_audit.csv``: each row read from the record ``OUT/epsilon_audit.json`` under
    its key or computed now (``compute(i)`` for ``grid[i]``) and written there as soon as it
    is, so that an interrupted audit resumes with the configurations it lacks; a failed
    audit's line goes to ``notice``."""
    record = out / AUDIT_RECORD
    held: dict[str, dict[str, Any]] = {}
    if record.is_file():
        held = json.loads(record.read_text(encoding="utf-8"))
    bar = tqdm(
        total=sum(key not in held for key in keys), desc=desc, unit="defense",
        disable=not progress,
    )  # fmt: skip
    rows = []
    for i, (defense, key) in enumerate(zip(grid, keys, strict=True)):
        if key not in held:
            held[key] = compute(i)
            with atomic_file(record) as handle:
                handle.write(json.dumps(held, indent=2, allow_nan=True) + "\n")
            bar.update()
            if notice is not None and held[key]["audit"] == "failed":
                notice(failed_line(held[key]))
        rows.append(completed(held[key], defense))
    bar.close()
    frame = pd.DataFrame(rows, columns=AUDIT_COLUMNS)
    write_csv(frame, out / AUDIT_TABLE, AUDIT_COLUMNS)
    return frame


def completed(record: dict[str, Any], defense: Defense) -> dict[str, Any]:
    """A held audit record with the columns that follow from it and the defense: what the
    bound is about (`bound_of`) and the canary's mu (`canary_mu`); a record written before
    audits spread over batches (one batch, a gradient canary) says so."""
    out = {"batches": 1, "canary_type": "gradient", **record}
    kind = str(out["canary_type"])
    norm, size = float(out["canary_norm"]), int(out["batch_size"])
    return {**out, "bound_of": bound_of(defense), "canary_mu": canary_mu(defense, norm, size, kind)}


def _audit_record(
    audit: EpsilonAuditSpec,
    setting: Setting,
    defense: Defense,
    model: keras.Model,
    batches: list[tuple[np.ndarray, np.ndarray]],
    seed: int,
    confidence: float,
) -> dict[str, Any]:
    """What one defense configuration's ``audit`` on ``batches`` records: the ``setting`` it
    audited (its dataset and model) and the audit's numbers (`audit_defense`) at
    ``confidence``."""
    return {
        "dataset": setting.dataset,
        "model": setting.model,
        "defense": defense.name,
        "defense_params": canonical_json(defense.params()),
        "seed": seed,
        "batch_size": len(batches[0][0]),
        **audit_defense(
            defense,
            model,
            [x for x, _ in batches],
            [y for _, y in batches],
            rounds=audit.rounds,
            seed=seed,
            delta=audit.delta,
            confidence=confidence,
            norm=audit.canary_norm or None,
            canaries=canaries_for(defense, audit.canaries),
        ),
    }


def audit_defense(
    defense: Defense,
    model: Any,
    images: Any,
    targets: Any,
    *,
    rounds: int,
    seed: int,
    delta: float,
    confidence: float = 0.95,
    norm: float | None = None,
    canaries: int = 1,
) -> dict[str, Any]:
    """The audit of one defense on one client batch, or on several (``images`` and
    ``targets`` as lists of batches, the rounds spread over them): its canary rounds
    (`leakbench.client.canaries.audit_rounds`, ``canaries`` per round), the lower bounds they
    prove (the Gaussian-DP one only where the defense declares a Gaussian score), the
    accountants' epsilons of one update and the verdict, as the columns of
    ``epsilon_audit.csv`` from ``rounds`` on."""
    batches = (
        list(zip(images, targets, strict=True)) if isinstance(images, list) else [(images, targets)]
    )
    found = audit_rounds(
        defense, model, batches, rounds=rounds, seed=seed, norm=norm, canaries=canaries
    )
    return audit_result(
        defense, found, len(batches[0][0]), rounds=rounds, delta=delta, confidence=confidence,
        canaries=canaries,
    )  # fmt: skip


def audit_result(
    defense: Defense,
    found: CanaryRounds,
    batch_size: int,
    *,
    rounds: int,
    delta: float,
    confidence: float,
    canaries: int,
) -> dict[str, Any]:
    """What an audit's rounds ``found`` on a client of ``batch_size`` examples prove
    (`audit_defense`, whatever the client: an image's or a text's)."""
    scores, included = found.trials()
    bound = epsilon_lower_bound(scores, included, delta=delta, confidence=confidence)
    gdp = math.nan, math.nan, math.nan
    if defense.gaussian_score():
        fit = gaussian_dp_lower_bound(scores, included, delta=delta, confidence=confidence)
        gdp = fit.epsilon, fit.mu, fit.mu_estimate
    exact = exact_epsilon(defense, delta)
    deciding = bound.epsilon if math.isnan(gdp[0]) else gdp[0]
    return {
        "rounds": rounds,
        "batches": found.batches,
        "canaries": canaries,
        "canary_type": found.kind,
        "canary_norm": found.norm,
        "delta": delta,
        "epsilon_update": update_epsilon(defense, delta),
        "epsilon_exact": exact,
        "epsilon_audit": bound.epsilon,
        "epsilon_audit_gdp": gdp[0],
        "mu_audit": gdp[1],
        "mu_estimate": gdp[2],
        "canary_mu": canary_mu(defense, found.norm, batch_size, found.kind),
        "bound_of": bound_of(defense),
        "epsilon_audit_confidence": bound.confidence,
        "epsilon_audit_cap": bound.cap,
        "audit": verdict(exact, deciding),
        "tpr_at_1pct_fpr": bound.tpr_at_low_fpr,
        "auroc": bound.auroc,
        "seconds": found.seconds,
    }


def deciding_bound(row: Any) -> tuple[float, str]:
    """The bound that decides a row's verdict and its name: the Gaussian-DP one where it was
    computed, the distribution-free one otherwise."""
    gdp = float(row.get("epsilon_audit_gdp", math.nan))
    if not math.isnan(gdp):
        return gdp, "Gaussian-DP"
    return float(row["epsilon_audit"]), "distribution-free"


def failed_line(row: dict[str, Any]) -> str:
    """The one line that reports a failed audit."""
    bound, name = deciding_bound(row)
    return (
        f"epsilon audit FAILED for {row['defense']} {row['defense_params']}: its update's "
        f"measured {name} lower bound {bound:.2f} (confidence "
        f"{row['epsilon_audit_confidence']:g}) exceeds its exact epsilon "
        f"{row['epsilon_exact']:.2f} (PLD) at delta {row['delta']:g}: a bug in the defense or "
        "in its accounting"
    )


def with_audit(board: pd.DataFrame, audit: pd.DataFrame, modality: str = "image") -> pd.DataFrame:
    """The leaderboard of ``modality`` with the audit's columns beside ``epsilon``, joined on
    the defense (and for text, which audits every batch size, on the batch size too)."""
    keys = ["defense", "defense_params"]
    if modality == "text":
        keys = ["batch_size", *keys]
    joined = board.merge(audit[[*keys, *AUDIT_BOARD_COLUMNS]], on=keys, how="left")
    return joined.reindex(columns=leaderboard_columns(True, modality))
