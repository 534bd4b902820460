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

from leakbench.attacks.suite import PROTOCOL
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
    NullBounds,
    class_means,
    distractor_pool,
    identified,
    label_floor,
    leak_graph,
    matched_leaks,
    null_bounds,
    null_reconstructions,
    recognisable,
    splits_share_images,
)
from leakbench.core.errors import DataError
from leakbench.datasets import Dataset, load_dataset
from leakbench.outputs.arrays import CellArrays, load_cell, row_positions
from leakbench.outputs.leak_flags import identification_alphas, identifications_count
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
    "null_psnr", "null_lpips", "over_null",
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
    # What the label-only null reaches on the public images (protocol 2's thresholds).
    bounds: NullBounds | None = None

    @classmethod
    def of(cls, dataset: Dataset, private_split: str, variant: str | None) -> Identification:
        if splits_share_images(dataset):
            return cls(None, None, None, variant)  # no public split: no pool, no label floor
        pool = distractor_pool(dataset, private_split)
        means = class_means(dataset, private_split)
        bounds = null_bounds(dataset, private_split, variant)
        return cls(pool, EmbeddedPool(pool, variant), means, variant, bounds=bounds)


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
    protocol: int = PROTOCOL,
) -> pd.DataFrame:
    """``frame`` (trial rows in ``trials.csv`` order) with the flag columns set, by the
    rules of ``protocol`` (`leakbench.outputs.leak_flags.with_leak_flags`).

    ``null_psnr`` and ``null_lpips`` score each row's label-only null (the public class mean of
    its recovered label, `leakbench.components.leakage.label_floor`) against its original as
    the arrays keep it; ``over_null`` says whether the reconstruction in the arrays is
    recognisable by a measure on which it beats that null (protocol 2's ``recognisable``).

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
        flags, null_rate, cell_batches, floors = _judge_cell(
            group, cell, at, judge, success_mse, lpips_known, protocol
        )
        if judge.pool is not None:
            frame.loc[group.index, "identified"] = flags.astype(float)
            frame.loc[group.index, "identified_null"] = null_rate
        if floors is not None:
            frame.loc[group.index, ["null_psnr", "null_lpips", "over_null"]] = floors
        batches.append((group.index, cell_batches))
    own = with_leak_flags(frame, success_mse, protocol)["leaked"] == 1
    alphas = identification_alphas(frame, protocol)
    for index, cell_batches in batches:
        counts = identifications_count(frame.loc[index], float(alphas.loc[index[0]]))
        for batch in cell_batches:
            edges = batch.pairs
            if counts and batch.nearer is not None:
                edges = batch.pairs | batch.nearer
            covered = matched_leaks(edges, own.loc[batch.index].to_numpy())
            frame.loc[batch.index, "leak_matched"] = covered.astype(float)
    return with_leak_flags(frame, success_mse, protocol)


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
    protocol: int,
) -> tuple[pd.Series, float, list[Batch], pd.DataFrame | None]:
    """One cell's identification flags (aligned with ``group``), its measured null rate (NaN
    when identification is off), its batches' leak graphs (with the label floor under any
    protocol but 1) and the label floor's columns (`label_floors`; None without class means)."""
    where = pd.Series(at, index=group.index)
    flags = pd.Series(False, index=group.index)
    floors = None if judge.means is None else pd.DataFrame(index=group.index, dtype=float)
    parts = []
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
        floor = None
        if judge.means is not None:
            floor = label_floors(
                group.loc[index], originals, reconstructions, own_embedding, rec_embedding,
                judge, lpips_known,
            )  # fmt: skip
            parts.append(floor)
        start = 0
        for trial in chunk:
            span = slice(start, start + len(trial))
            start += len(trial)
            distances = squared_distances(rec_embedding[span], own_embedding[span])
            graph_floor = None
            if floor is not None and protocol != 1:
                graph_floor = (floor["null_psnr"].to_numpy()[span],
                               floor["null_lpips"].to_numpy()[span])  # fmt: skip
            pairs = leak_graph(
                originals[span], reconstructions[span], distances, None, success_mse,
                lpips_known, graph_floor, judge.bounds if protocol != 1 else None,
            )  # fmt: skip
            nearer = None if nearest is None else distances < nearest[span, None]
            batches.append(Batch(trial, pairs, nearer))
    if floors is not None and parts:
        floors = pd.concat(parts).reindex(group.index)
    return flags, (hits / draws if draws else float("nan")), batches, floors


def label_floors(
    rows: pd.DataFrame,
    originals: np.ndarray,
    reconstructions: np.ndarray,
    own_embedding: np.ndarray,
    rec_embedding: np.ndarray,
    judge: Identification,
    lpips_known: bool,
) -> pd.DataFrame:
    """Per row of ``rows`` (with its 8-bit ``originals`` and ``reconstructions`` and their
    embeddings): ``null_psnr`` and ``null_lpips`` of its label-only null
    (`leakbench.components.leakage.label_floor` of its ``predicted_label``; ``null_lpips`` NaN
    when the distance is not LPIPS), and ``over_null``, whether the reconstruction is
    recognisable by a measure on which it beats that null, both scored from the same 8-bit
    arrays (so a reconstruction that is the null itself never is), beyond the dataset's
    ``judge.bounds`` (`leakbench.components.leakage.null_bounds`)."""
    if judge.means is None:
        raise ValueError("the label floor needs the public split's class means")
    floor = label_floor(judge.means, rows["predicted_label"].to_numpy())

    def scores(images: np.ndarray, embedding: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        a = originals.reshape(len(images), -1).astype(np.float64) / 255.0
        b = images.reshape(len(images), -1).astype(np.float64) / 255.0
        mse = ((a - b) ** 2).mean(1)
        psnr = 10.0 * np.log10(1.0 / np.maximum(mse, 1e-10))
        distance = ((embedding - own_embedding) ** 2).sum(1)
        return psnr, (distance if lpips_known else np.full(len(images), np.nan))

    null_psnr, null_lpips = scores(floor, embed(floor, judge.variant))
    psnr, lpips = scores(reconstructions, rec_embedding)
    over = recognisable(lpips, psnr, null_lpips, null_psnr, judge.bounds)
    return pd.DataFrame(
        {"null_psnr": null_psnr, "null_lpips": null_lpips, "over_null": over.astype(float)},
        index=rows.index,
    )


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
        trials, path, dataset, spec.threat_model.private_split, spec.lpips, spec.success_mse,
        spec.protocol,
    )  # fmt: skip
    board = leaderboard(
        trials, spec.success_mse, utility, spec.max_accuracy_drop, spec.protocol,
        classes=dataset.num_classes, clients=spec.threat_model.clients,
        releases=spec.local.steps,
    )  # fmt: skip
    write_csv(trials, path / "trials.csv", TRIAL_COLUMNS)
    write_csv(board, path / "leaderboard.csv", LEADERBOARD_COLUMNS)
    return board
