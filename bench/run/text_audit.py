"""The epsilon audit of a text run (``[epsilon_audit]`` with a text corpus): the image audit
(`leakbench.run.epsilon_audit`) on a text client's dense gradients.

Every (batch size, defense configuration) of the run is audited, since a text run attacks each
batch size apart and a bound without a guarantee (noise without clipping) depends on it: on the
first seed's model (`leakbench.run.text_execute.text_model`, the one its trials attack), its
first batch of that size (the sentences its first trials attack) or, for a defense whose output
depends on the batch (`leakbench.run.epsilon_audit.batches_for`), its first ``batches`` batches,
continuing the plan's seeded draw of private sentences. The rounds are the image audit's
(`leakbench.client.text_canaries`: Dirac gradient canaries in the token embedding, a sentence of
their own for DP-SGD, one shared extra slot for a batch-level defense), and so are the bounds,
the accountants' epsilons of one update, the verdict and the Bonferroni share of the confidence
(over every audited (batch size, defense) with a guarantee).

Each audit is kept in ``OUT/epsilon_audit.json`` under a key of everything that decides it (the
engine version included, ``kind = "text"`` so that it can equal no image key) as soon as it is
computed, so a resumed run audits only what is missing; ``OUT/epsilon_audit.csv`` has the image
audit's columns, one row per (batch size, defense) in the run's order, and the leaderboard gets
the audit's columns after ``epsilon`` on the rows of the audited batch size and defense.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from leakbench.client.text_canaries import text_audit_rounds
from leakbench.core.canonical import canonical_json
from leakbench.core.errors import ConfigError
from leakbench.core.seeds import private_indices
from leakbench.defenses import Defense
from leakbench.outputs.tables import AUDIT_BOARD_COLUMNS, AUDIT_COLUMNS, write_csv
from leakbench.outputs.text_tables import TEXT_LEADERBOARD_COLUMNS
from leakbench.run.config import RunSpec
from leakbench.run.epsilon_audit import (
    AUDIT_RECORD,
    AUDIT_TABLE,
    audit_confidence,
    audit_fields,
    audit_result,
    audited_rows,
    batches_for,
    canaries_for,
)
from leakbench.run.store import trial_key
from leakbench.run.text_execute import TextContext
from leakbench.run.text_plan import ATTACK_SETTINGS, TextSetting, attackable


def text_audit_batches(
    spec: RunSpec, pool: int, seed: int, size: int, count: int
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
            f"epsilon_audit.batches must be at most {pool // size} for {spec.dataset}'s "
            f"{pool} attackable sentences at {size} sentences a batch, got {count}"
        )
    order = private_indices(pool, count * size, seed)
    return [[int(i) for i in order[j * size : (j + 1) * size]] for j in range(count)]


def text_audit_grid(spec: RunSpec) -> list[tuple[int, Defense]]:
    """What a text run audits, in order: each batch size, each defense configuration."""
    assert spec.text is not None
    return [(size, defense) for size in spec.text.batch_sizes for defense in spec.defense_grid()]


def check_text_audit(spec: RunSpec, private_count: int) -> None:
    """Refuses, before a run writes anything, an audit that asks for more batches than the
    attackable sentences hold (`text_audit_batches`)."""
    audit = spec.epsilon_audit
    if audit is None:
        return
    pool = attackable(spec, private_count)
    for size, defense in text_audit_grid(spec):
        text_audit_batches(spec, pool, spec.seeds[0], size, batches_for(defense, audit.batches))


def text_audit_key(
    spec: RunSpec, defense: Defense, seed: int, batches: list[list[int]], confidence: float
) -> str:
    """Everything that decides a text audit's numbers, hashed with the engine version."""
    assert spec.epsilon_audit is not None
    return trial_key(
        {
            "kind": "text",
            "epsilon_audit": audit_fields(spec.epsilon_audit, defense, len(batches), confidence),
            "dataset": spec.dataset,
            "model": spec.model,
            "text": TextSetting.of(spec).settings(ATTACK_SETTINGS),
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
    audit = spec.epsilon_audit
    assert audit is not None
    seed = spec.seeds[0]
    pool = attackable(spec, len(context.private_ids))
    grid = text_audit_grid(spec)
    defenses = [defense for _, defense in grid]
    levels = audit_confidence(defenses, audit.confidence)
    chosen = [
        text_audit_batches(spec, pool, seed, size, batches_for(defense, audit.batches))
        for size, defense in grid
    ]
    keys = [
        text_audit_key(spec, defense, seed, batches, level)
        for defense, batches, level in zip(defenses, chosen, levels, strict=True)
    ]

    def compute(i: int) -> dict[str, Any]:
        (size, defense), level = grid[i], levels[i]
        canaries = canaries_for(defense, audit.canaries)
        found = text_audit_rounds(
            defense,
            context.model(seed),
            [context.private_ids[rows] for rows in chosen[i]],
            rounds=audit.rounds,
            seed=seed,
            norm=audit.canary_norm or None,
            canaries=canaries,
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

    rows = audited_rows(
        defenses, keys, out / AUDIT_RECORD, compute, desc=f"{spec.name} epsilon audit",
        progress=progress, notice=notice,
    )  # fmt: skip
    frame = pd.DataFrame(rows, columns=AUDIT_COLUMNS)
    write_csv(frame, out / AUDIT_TABLE, AUDIT_COLUMNS)
    return frame


def text_leaderboard_columns(audited: bool) -> list[str]:
    """A text leaderboard's columns: `TEXT_LEADERBOARD_COLUMNS`, with the audit's
    (`leakbench.outputs.tables.AUDIT_BOARD_COLUMNS`) after ``epsilon`` when the run audited
    its defenses (a run without an audit keeps its file as it was)."""
    if not audited:
        return list(TEXT_LEADERBOARD_COLUMNS)
    at = TEXT_LEADERBOARD_COLUMNS.index("epsilon") + 1
    return [*TEXT_LEADERBOARD_COLUMNS[:at], *AUDIT_BOARD_COLUMNS, *TEXT_LEADERBOARD_COLUMNS[at:]]


def with_text_audit(board: pd.DataFrame, audit: pd.DataFrame) -> pd.DataFrame:
    """The text leaderboard with the audit's columns, joined on the batch size and defense."""
    keys = ["batch_size", "defense", "defense_params"]
    joined = board.merge(audit[[*keys, *AUDIT_BOARD_COLUMNS]], on=keys, how="left")
    return joined.reindex(columns=text_leaderboard_columns(True))
