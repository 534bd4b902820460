"""The per-image leakage flags of a run's trial rows (`leakbench.components.leakage`), from its
arrays.

`add_flags` gives every row of ``trials.csv`` its ``identified``, ``recognisable`` and
``leaked`` flags, the ``distractors`` its identification was judged against, the cell's
measured null rate ``identified_null`` and the batch matching's ``leak_matched``.
Identification reads the 8-bit originals and reconstructions of the run directory's
``arrays/`` (`leakbench.outputs.arrays`), so a run exported by `leakbench.run.rundir` and a
committed run directory re-flagged by `rescore_run_dir` (e.g. after a change of the rules) get
the same flags from the same files. Rows of a cell without arrays keep NaN for
``identified``, ``identified_null`` and ``leak_matched``.

A cell is read in chunks of whole batches of at most `leakbench.components.leakage.CHUNK_ROWS`
rows, and its null reconstructions `NULL_ROWS` rows at a time, fewer for large images (as many
as `leakbench.components.embedding.rows_within` its block), and the distractor pool is an
`leakbench.components.embedding.EmbeddedPool`, on disk when larger than a block: memory does
not grow with the cell or the pool. What is held at once is at most one block of the pool's
embeddings, one chunk's (at least one whole batch: two embeddings per row) and one block of
null rows (`NULL_DRAWS` embeddings each), each block `BLOCK_BYTES` (256 MB), and the
distances between them (see the docs' performance page).

A dataset whose two splits are the same images (`leakbench.audit` without ``public``) has no
public images for a pool: identification is off for the run (``identified``,
``identified_null`` and ``distractors`` NaN) with one warning line, `IDENTIFICATION_OFF`.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd

from leakbench.components.embedding import (
    EmbeddedPool,
    embed,
    nearest_pool,
    rows_within,
    squared_distances,
    uses_lpips,
)
from leakbench.components.leakage import (
    CHUNK_ROWS,
    NULL_DRAWS,
    class_means,
    distractor_pool,
    identified,
    leak_graph,
    matched_leaks,
    null_reconstructions,
    splits_share_images,
)
from leakbench.core.errors import DataError
from leakbench.datasets import Dataset, load_dataset
from leakbench.outputs.arrays import CellArrays, load_cell, row_positions
from leakbench.outputs.leak_flags import identifications_count, run_alpha
from leakbench.outputs.tables import (
    CELL_COLUMNS,
    LEADERBOARD_COLUMNS,
    TRIAL_COLUMNS,
    leaderboard,
    with_leak_flags,
    write_csv,
)
from leakbench.run.config import RunSpec, load_record

FLAG_COLUMNS = (
    "identified", "recognisable", "leaked", "distractors", "identified_null", "leak_matched",
)  # fmt: skip
# Rows whose null reconstructions are embedded at once (NULL_DRAWS images each).
NULL_ROWS = 64
IDENTIFICATION_OFF = (
    "identification is off: the dataset's public split holds the private images (an audit "
    "without public=), so no distractor pool can be drawn; give public images to judge it"
)


@dataclasses.dataclass(frozen=True)
class Batch:
    """One trial's rows of a cell, in position order, and its leak graph's parts
    (`leakbench.components.leakage.leak_graph`): ``pairs`` (recovered or recognisable) and
    ``nearer`` (reconstruction nearer the original than every distractor), reconstruction by
    original; ``nearer`` is None when identification is off."""

    index: pd.Index
    pairs: np.ndarray
    nearer: np.ndarray | None


@dataclasses.dataclass(frozen=True)
class Identification:
    """What identification needs of a run: the distractor pool (None: off), its embedding,
    the null's class means, the distance's variant, and a cache of null hits per (seed,
    batch, position, label, original), shared by cells that attacked the same image."""

    pool: np.ndarray | None
    pool_embedding: EmbeddedPool | None
    means: np.ndarray | None
    variant: str | None
    null_hits: dict[tuple, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def of(cls, dataset: Dataset, private_split: str, variant: str | None) -> Identification:
        if splits_share_images(dataset):
            return cls(None, None, None, variant)
        pool = distractor_pool(dataset, private_split)
        means = class_means(dataset, private_split)
        return cls(pool, EmbeddedPool(pool, variant), means, variant)


# The judges made in this process, one per (dataset, private split, variant), each with the
# dataset it was made of (so that a reused id is a new key). A staged run flags its trials
# against none at each stage's gate and every trial at the end (`leakbench.run.stages`): with
# the judge kept, the pool is embedded and each image's null drawn once per run, not once per
# flagging. Both are pure functions of what keys them. The oldest is let go beyond MAX_JUDGES.
_JUDGES: dict[tuple[int, str, str | None], tuple[Dataset, Identification]] = {}
MAX_JUDGES = 2


def judge_for(dataset: Dataset, private_split: str, variant: str | None) -> Identification:
    """The `Identification` of ``dataset`` (made once per process, see `_JUDGES`)."""
    key = (id(dataset), private_split, variant)
    held = _JUDGES.get(key)
    if held is not None and held[0] is dataset:
        return held[1]
    judge = Identification.of(dataset, private_split, variant)
    while len(_JUDGES) >= MAX_JUDGES:
        _JUDGES.pop(next(iter(_JUDGES)))
    _JUDGES[key] = (dataset, judge)
    return judge


def add_flags(
    frame: pd.DataFrame,
    run_dir: str | Path,
    dataset: Dataset,
    private_split: str,
    variant: str | None,
    success_mse: float,
) -> pd.DataFrame:
    """``frame`` (trial rows in ``trials.csv`` order) with the flag columns set.

    ``recognisable`` and ``leaked`` are `leakbench.outputs.leak_flags.with_leak_flags`'s, the
    leaderboard's own; an unknown ``identified`` (no arrays) counts as not identified there.
    ``leak_matched`` needs a cell's identifications judged first (whether they count is a
    property of the whole cell), so the batches' graphs are kept until every cell is flagged.
    """
    frame = frame.copy()
    for column in FLAG_COLUMNS:
        frame[column] = np.nan
    if frame.empty:
        return frame
    judge = judge_for(dataset, private_split, variant)
    if judge.pool is None:
        warnings.warn(IDENTIFICATION_OFF, UserWarning, stacklevel=2)
    else:
        frame["distractors"] = float(len(judge.pool))
    batches: list[tuple[pd.Index, list[Batch]]] = []
    for group, cell, at in _cells_with_arrays(frame, run_dir):
        lpips_known = _lpips_known(variant) and bool(group["lpips"].notna().all())
        flags, null_rate, cell_batches = _judge_cell(
            group, cell, at, judge, success_mse, lpips_known
        )
        if judge.pool is not None:
            frame.loc[group.index, "identified"] = flags.astype(float)
            frame.loc[group.index, "identified_null"] = null_rate
        batches.append((group.index, cell_batches))
    own = with_leak_flags(frame, success_mse)["leaked"] == 1
    alpha = run_alpha(frame)
    for index, cell_batches in batches:
        counts = identifications_count(frame.loc[index], alpha)
        for batch in cell_batches:
            edges = batch.pairs
            if counts and batch.nearer is not None:
                edges = batch.pairs | batch.nearer
            covered = matched_leaks(edges, own.loc[batch.index].to_numpy())
            frame.loc[batch.index, "leak_matched"] = covered.astype(float)
    return with_leak_flags(frame, success_mse)


def _lpips_known(variant: str | None) -> bool:
    """Whether the identification distance is LPIPS (`leakbench.components.embedding.embed`)."""
    return uses_lpips(variant)


def _cells_with_arrays(
    frame: pd.DataFrame, run_dir: str | Path
) -> Iterator[tuple[pd.DataFrame, CellArrays, list[int]]]:
    """Each cell of ``frame`` whose arrays ``run_dir`` holds: its rows, its arrays and the rows'
    positions in them. Cells without arrays, or with arrays of another export, are passed
    over."""
    for _, group in frame.groupby(CELL_COLUMNS, sort=False):
        cell = load_cell(run_dir, group.iloc[0])
        if cell is None:
            continue
        at = row_positions(cell, group)
        if at is not None:
            yield group, cell, at


def _chunks(group: pd.DataFrame, most: int = CHUNK_ROWS) -> Iterator[list[pd.Index]]:
    """The cell's trials (rows sharing seed and batch index, in position order), gathered into
    runs of whole trials of at most ``most`` rows (one trial when a trial is larger)."""
    chunk: list[pd.Index] = []
    size = 0
    for _, trial in group.groupby(["seed", "batch_index"], sort=False):
        index = trial.sort_values("position", kind="mergesort").index
        if chunk and size + len(index) > most:
            yield chunk
            chunk, size = [], 0
        chunk.append(index)
        size += len(index)
    if chunk:
        yield chunk


def _judge_cell(
    group: pd.DataFrame,
    cell: CellArrays,
    at: list[int],
    judge: Identification,
    success_mse: float,
    lpips_known: bool,
) -> tuple[pd.Series, float, list[Batch]]:
    """One cell's identification flags (aligned with ``group``), its measured null rate (NaN
    when identification is off) and its batches' leak graphs."""
    where = pd.Series(at, index=group.index)
    flags = pd.Series(False, index=group.index)
    hits = draws = 0
    batches: list[Batch] = []
    shape = tuple(cell.original.shape[1:])
    most = min(CHUNK_ROWS, rows_within(shape, judge.variant, copies=2))
    for chunk in _chunks(group, most):
        index = chunk[0].append(chunk[1:]) if len(chunk) > 1 else chunk[0]
        originals = cell.original[where.loc[index].to_numpy()]
        reconstructions = cell.reconstruction[where.loc[index].to_numpy()]
        own_embedding = embed(originals, judge.variant)
        rec_embedding = embed(reconstructions, judge.variant)
        nearest = None
        if judge.pool_embedding is not None:
            nearest = nearest_pool(rec_embedding, judge.pool_embedding)
            own_distance = ((rec_embedding - own_embedding) ** 2).sum(1)
            flags.loc[index] = own_distance < nearest
            chunk_hits = _null_hits(group.loc[index], originals, own_embedding, judge)
            hits, draws = hits + chunk_hits, draws + NULL_DRAWS * len(index)
        start = 0
        for trial in chunk:
            span = slice(start, start + len(trial))
            start += len(trial)
            distances = squared_distances(rec_embedding[span], own_embedding[span])
            pairs = leak_graph(
                originals[span], reconstructions[span], distances, None, success_mse, lpips_known
            )
            nearer = None if nearest is None else distances < nearest[span, None]
            batches.append(Batch(trial, pairs, nearer))
    return flags, (hits / draws if draws else float("nan")), batches


def _null_hits(
    rows: pd.DataFrame, originals: np.ndarray, own_embedding: np.ndarray, judge: Identification
) -> int:
    """How many of ``rows``' null reconstructions (`leakbench.components.leakage`, NULL_DRAWS
    per row) are identified against the pool and the rows' own ``originals`` (embedded as
    ``own_embedding``), with the same distance as the reconstructions; cached per row."""
    keys = [
        (int(r.seed), int(r.batch_index), int(r.position), int(r.predicted_label), o.tobytes())
        for r, o in zip(rows.itertuples(), originals, strict=True)
    ]
    missing = [i for i, key in enumerate(keys) if key not in judge.null_hits]
    means, pool = judge.means, judge.pool_embedding
    if means is None or pool is None:
        raise ValueError("the null needs the public split's class means and the pool")
    step = min(NULL_ROWS, rows_within(originals.shape[1:], judge.variant, copies=NULL_DRAWS + 1))
    for k in range(0, len(missing), step):
        part = missing[k : k + step]
        nulls = np.concatenate(
            [null_reconstructions(means, keys[i][3], *keys[i][:3]) for i in part]
        )
        embedded = embed(nulls, judge.variant)
        draws = embedded.reshape(len(part), NULL_DRAWS, -1)
        own = np.concatenate(
            [((row - own_embedding[i]) ** 2).sum(1) for row, i in zip(draws, part, strict=True)]
        )
        found = (own < nearest_pool(embedded, pool)).reshape(len(part), NULL_DRAWS)
        for i, count in zip(part, found.sum(1), strict=True):
            judge.null_hits[keys[i]] = int(count)
    return sum(judge.null_hits[key] for key in keys)


def identified_cells(
    frame: pd.DataFrame, run_dir: str | Path, pool: np.ndarray, variant: str | None
) -> Iterator[tuple[pd.DataFrame, CellArrays, list[int], np.ndarray]]:
    """Each cell of ``frame`` whose arrays ``run_dir`` holds: its rows, its arrays, the rows'
    positions in them and the rows' identification flags against the distractor ``pool``
    (`leakbench.components.leakage.identified`). Cells without arrays, or with arrays of
    another export, are passed over."""
    pool_embedding = EmbeddedPool(pool, variant)
    for group, cell, at in _cells_with_arrays(frame, run_dir):
        originals, reconstructions = cell.original[at], cell.reconstruction[at]
        yield group, cell, at, identified(originals, reconstructions, pool, variant, pool_embedding)


def run_record(run_dir: str | Path) -> RunSpec:
    """`load_record` of a run directory's ``config.toml``, once the directory is checked to
    hold it and the ``trials.csv`` and ``utility.csv`` a rescore reads (`DataError` if not)."""
    path = Path(run_dir)
    for name in ("config.toml", "trials.csv", "utility.csv"):
        if not (path / name).is_file():
            raise DataError(f"{path} holds no {name}; give the --out of `leakbench run`")
    return load_record(path / "config.toml")


def rescore_run_dir(run_dir: str | Path) -> pd.DataFrame:
    """Rewrites a run directory's ``trials.csv`` (flag columns) and ``leaderboard.csv`` under
    this version's rules, from its ``config.toml``, ``trials.csv``, ``utility.csv`` and
    ``arrays/`` (no attack runs again; the store is not needed), and returns the leaderboard.
    For committed runs and runs made before the per-image flags existed."""
    path = Path(run_dir)
    spec = run_record(path)
    dataset = load_dataset(spec.dataset, spec.image_size)
    trials = pd.read_csv(path / "trials.csv")
    utility = pd.read_csv(path / "utility.csv")
    trials = add_flags(
        trials, path, dataset, spec.threat_model.private_split, spec.lpips, spec.success_mse
    )
    board = leaderboard(trials, spec.success_mse, utility, spec.max_accuracy_drop)
    write_csv(trials, path / "trials.csv", TRIAL_COLUMNS)
    write_csv(board, path / "leaderboard.csv", LEADERBOARD_COLUMNS)
    return board
