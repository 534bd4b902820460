"""The epsilon audit of a run (``[epsilon_audit]``): measured privacy beside promised privacy.

For every defense configuration of the run, the client's update on the first seed's model and
its first batch of private examples is audited with gradient canaries
(`leakbench.client.canaries`), and the scores give a lower bound on epsilon
(`leakbench.components.epsilon_bound`). A defense with a guarantee also gets its accountant's
epsilon of the same mechanism, one update of one client (``epsilon_update``: the defense's
`epsilon` at sampling rate 1 and one step); a lower bound above it is a failed audit, which
means a bug in the defense or in its accounting. A defense without a guarantee gets its
measured bound only.

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

from leakbench.client.canaries import canary_rounds
from leakbench.components.bottleneck import with_architecture
from leakbench.components.epsilon_bound import epsilon_lower_bound
from leakbench.core.canonical import canonical_json
from leakbench.datasets import Dataset
from leakbench.defenses import Defense
from leakbench.outputs.tables import (
    AUDIT_BOARD_COLUMNS,
    AUDIT_COLUMNS,
    atomic_file,
    leaderboard_columns,
    write_csv,
)
from leakbench.run.config import RunSpec
from leakbench.run.plan import Setting, Trial, private_split
from leakbench.run.store import trial_key

AUDIT_RECORD = "epsilon_audit.json"
AUDIT_TABLE = "epsilon_audit.csv"


def verdict(epsilon_update: float, bound: float) -> str:
    """``failed`` when the measured lower bound exceeds the accountant's epsilon (a bug),
    ``passed`` when it does not, ``no guarantee`` for a defense without one (NaN)."""
    if math.isnan(epsilon_update):
        return "no guarantee"
    return "failed" if bound > epsilon_update else "passed"


def update_epsilon(defense: Defense, delta: float) -> float:
    """The accountant's epsilon of one update of one client under ``defense`` (its `epsilon`
    at sampling rate 1 and one step), NaN without a guarantee."""
    found = defense.epsilon(1.0, 1, delta)
    return math.nan if found is None else float(found)


def audit_key(spec: RunSpec, setting: Setting, defense: Defense, seed: int, indices: Any) -> str:
    """Everything that decides an audit's numbers, hashed with the engine version."""
    audit = spec.epsilon_audit
    assert audit is not None
    threat = dict(setting.threat)
    return trial_key(
        {
            "epsilon_audit": {
                "rounds": audit.rounds,
                "confidence": audit.confidence,
                "delta": audit.delta,
                "canary_norm": audit.canary_norm,
            },
            **({"threat_model": threat} if threat else {}),
            **({"pretraining": setting.pretraining} if setting.pretraining else {}),
            "dataset": setting.dataset,
            "image_size": setting.image_size,
            "model": setting.model,
            **setting.model_digest(),
            "defense": defense.name,
            "defense_params": defense.params(),
            "seed": seed,
            "indices": [int(i) for i in indices],
        }
    )


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
    attack);
    the model is that seed's attacked model (`leakbench.run.execute.attacked_model`), extended
    as a defense's architecture says.

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
    indices = list(first.indices)[: spec.batch_size]
    split = private_split(spec, dataset)
    x = split.x[indices]
    targets = tf.one_hot(split.y[indices], dataset.num_classes).numpy()
    setting = first.setting
    record = out / AUDIT_RECORD
    held: dict[str, dict[str, Any]] = {}
    if record.is_file():
        held = json.loads(record.read_text(encoding="utf-8"))
    rows = []
    base = None
    grid = spec.defense_grid()
    keys = [audit_key(spec, setting, defense, seed, indices) for defense in grid]
    bar = tqdm(
        total=sum(key not in held for key in keys), desc=f"{spec.name} epsilon audit",
        unit="defense", disable=not progress,
    )  # fmt: skip
    for defense, key in zip(grid, keys, strict=True):
        if key not in held:
            if base is None:
                base = attacked_model(spec, dataset, seed)
            model = base
            if defense.architecture is not None:
                model = with_architecture(base, defense.architecture, seed)
            held[key] = _audit_record(spec, defense, model, x, targets, seed)
            with atomic_file(record) as handle:
                handle.write(json.dumps(held, indent=2, allow_nan=True) + "\n")
            bar.update()
            if notice is not None and held[key]["audit"] == "failed":
                notice(failed_line(held[key]))
        rows.append(held[key])
    bar.close()
    frame = pd.DataFrame(rows, columns=AUDIT_COLUMNS)
    write_csv(frame, out / AUDIT_TABLE, AUDIT_COLUMNS)
    return frame


def _audit_record(
    spec: RunSpec,
    defense: Defense,
    model: keras.Model,
    x: np.ndarray,
    targets: np.ndarray,
    seed: int,
) -> dict[str, Any]:
    """What one defense configuration's audit on the batch ``x`` records: the setting it
    audited and the audit's numbers (`audit_defense`)."""
    audit = spec.epsilon_audit
    assert audit is not None
    return {
        "dataset": spec.dataset,
        "model": spec.model,
        "defense": defense.name,
        "defense_params": canonical_json(defense.params()),
        "seed": seed,
        "batch_size": len(x),
        **audit_defense(
            defense,
            model,
            x,
            targets,
            rounds=audit.rounds,
            seed=seed,
            delta=audit.delta,
            confidence=audit.confidence,
            norm=audit.canary_norm or None,
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
) -> dict[str, Any]:
    """The audit of one defense on one client batch: its canary rounds
    (`leakbench.client.canaries.canary_rounds`), the lower bound they prove, the accountant's
    epsilon of one update and the verdict, as the columns of ``epsilon_audit.csv`` from
    ``rounds`` on."""
    found = canary_rounds(defense, model, images, targets, rounds=rounds, seed=seed, norm=norm)
    bound = epsilon_lower_bound(found.scores, found.included, delta=delta, confidence=confidence)
    promised = update_epsilon(defense, delta)
    return {
        "rounds": bound.rounds,
        "canary_norm": found.norm,
        "delta": delta,
        "epsilon_update": promised,
        "epsilon_audit": bound.epsilon,
        "epsilon_audit_confidence": bound.confidence,
        "epsilon_audit_cap": bound.cap,
        "audit": verdict(promised, bound.epsilon),
        "tpr_at_1pct_fpr": bound.tpr_at_low_fpr,
        "auroc": bound.auroc,
        "seconds": found.seconds,
    }


def failed_line(row: dict[str, Any]) -> str:
    """The one line that reports a failed audit."""
    return (
        f"epsilon audit FAILED for {row['defense']} {row['defense_params']}: its update's "
        f"measured lower bound {row['epsilon_audit']:.2f} (confidence "
        f"{row['epsilon_audit_confidence']:g}) exceeds its accountant's epsilon "
        f"{row['epsilon_update']:.2f} at delta {row['delta']:g}: a bug in the defense or in "
        "its accounting"
    )


def with_audit(board: pd.DataFrame, audit: pd.DataFrame) -> pd.DataFrame:
    """The leaderboard with the audit's columns beside ``epsilon``, joined on the defense."""
    joined = board.merge(
        audit[["defense", "defense_params", *AUDIT_BOARD_COLUMNS]],
        on=["defense", "defense_params"],
        how="left",
    )
    return joined.reindex(columns=leaderboard_columns(True))


def read_audit(out: Path) -> pd.DataFrame | None:
    """The run's ``epsilon_audit.csv``, or None if it has none."""
    path = Path(out) / AUDIT_TABLE
    if not path.is_file():
        return None
    return pd.read_csv(path)
