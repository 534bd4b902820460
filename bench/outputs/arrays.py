"""Reconstructions and loss histories kept for the figures.

Each finished trial stores one small blob beside its rows (same transaction, see
`leakbench.run.store`): its private images and the reconstructions matched to them, both as 8-bit
images, and the gradient-matching loss per iteration. The metrics are computed from the full
precision reconstructions before this rounding; the 8-bit copies only draw figures (rounding to
1/255 caps their own PSNR near 59 dB, far above what a figure can show).

A run directory's ``arrays/`` holds one ``<cell_id>.npz`` per leaderboard cell, exported from the
store with the CSVs, so figures can be drawn from a run directory without its store (a committed
run, a copied directory). Each file holds, in ``trials.csv`` order:

- ``original``, ``reconstruction``: uint8 ``[n, H, W, C]``, one per image row of the cell;
- ``seed``, ``batch_index``, ``position``, ``image_index``: int64 ``[n]``, identifying the rows;
- ``loss``: float32 ``[t, L]``, the loss history of each of the cell's ``t`` trials, padded with
  NaN to the longest; ``loss_seed``, ``loss_batch_index``: int64 ``[t]``.
"""

from __future__ import annotations

import dataclasses
import io
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from leakbench.core.canonical import stable_hash
from leakbench.core.files import atomic_file
from leakbench.outputs.tables import CELL_COLUMNS

ARRAYS_DIR = "arrays"


def to_uint8(images: np.ndarray) -> np.ndarray:
    """Images in [0, 1] (values outside are clipped) as uint8, rounded to the nearest level."""
    return np.round(np.clip(np.asarray(images, np.float32), 0.0, 1.0) * 255.0).astype(np.uint8)


def encode_trial(original: np.ndarray, reconstruction: np.ndarray, loss: np.ndarray) -> bytes:
    """One trial's blob: its images and the reconstructions matched to them (same order), and
    its loss history."""
    buffer = io.BytesIO()
    np.savez_compressed(
        buffer,
        original=to_uint8(original),
        reconstruction=to_uint8(reconstruction),
        loss=np.asarray(loss, np.float32).reshape(-1),
    )
    return buffer.getvalue()


def decode_trial(blob: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(blob), allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def cell_id(row: pd.Series | dict) -> str:
    """A short stable name for a leaderboard cell (its file name under ``arrays/``)."""
    values = [str(row[c]) for c in CELL_COLUMNS]
    return stable_hash(values, 16)


@dataclasses.dataclass(frozen=True)
class CellArrays:
    """The arrays of one cell (see the module docstring)."""

    original: np.ndarray
    reconstruction: np.ndarray
    seed: np.ndarray
    batch_index: np.ndarray
    position: np.ndarray
    image_index: np.ndarray
    loss: np.ndarray
    loss_seed: np.ndarray
    loss_batch_index: np.ndarray


def export_arrays(frame: pd.DataFrame, blobs: dict[tuple[int, int, str], bytes], out: Path) -> int:
    """Writes ``out/arrays/<cell_id>.npz`` for every cell of ``frame`` (``trials.csv``) whose
    trials all have a blob; stale files of cells no longer in ``frame`` are left alone.

    Args:
        frame: The trial rows, in the order of ``trials.csv``.
        blobs: ``(seed, batch_index, cell_id) -> blob`` of the trials that have one.
        out: The run directory.

    Returns:
        The number of cell files written.
    """
    if frame.empty:
        return 0
    folder = out / ARRAYS_DIR
    written = 0
    for _, group in frame.groupby(CELL_COLUMNS, sort=False):
        name = cell_id(group.iloc[0])
        trials = list(dict.fromkeys(zip(group["seed"], group["batch_index"], strict=True)))
        if not all((int(s), int(b), name) in blobs for s, b in trials):
            continue  # rows stored before arrays were kept: no figure data for this cell
        decoded = {t: decode_trial(blobs[(int(t[0]), int(t[1]), name)]) for t in trials}
        originals, reconstructions = [], []
        for seed, batch, position in zip(
            group["seed"], group["batch_index"], group["position"], strict=True
        ):
            data = decoded[(seed, batch)]
            originals.append(data["original"][int(position)])
            reconstructions.append(data["reconstruction"][int(position)])
        histories = [decoded[t]["loss"] for t in trials]
        length = max((len(h) for h in histories), default=0)
        loss = np.full((len(histories), length), np.nan, np.float32)
        for i, history in enumerate(histories):
            loss[i, : len(history)] = history
        folder.mkdir(exist_ok=True)
        _save_npz(
            folder / f"{name}.npz",
            original=np.stack(originals),
            reconstruction=np.stack(reconstructions),
            seed=group["seed"].to_numpy(np.int64),
            batch_index=group["batch_index"].to_numpy(np.int64),
            position=group["position"].to_numpy(np.int64),
            image_index=group["image_index"].to_numpy(np.int64),
            loss=loss,
            loss_seed=np.array([t[0] for t in trials], np.int64),
            loss_batch_index=np.array([t[1] for t in trials], np.int64),
        )
        written += 1
    return written


def load_cell(run_dir: str | Path, row: pd.Series | dict) -> CellArrays | None:
    """The arrays of the leaderboard ``row``'s cell, or None if the run kept none for it."""
    path = Path(run_dir) / ARRAYS_DIR / f"{cell_id(row)}.npz"
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as data:
        return CellArrays(**{f.name: data[f.name] for f in dataclasses.fields(CellArrays)})


def row_positions(cell: CellArrays, rows: pd.DataFrame) -> list[int] | None:
    """The index in ``cell``'s arrays of each of ``rows`` (trial rows of that cell, matched by
    seed, batch and position), or None when some row has no image there (arrays of another
    export)."""
    stored = {
        (int(s), int(b), int(p)): i
        for i, (s, b, p) in enumerate(zip(cell.seed, cell.batch_index, cell.position, strict=True))
    }
    keys = zip(rows["seed"], rows["batch_index"], rows["position"], strict=True)
    at = [stored.get((int(s), int(b), int(p))) for s, b, p in keys]
    found = [i for i in at if i is not None]
    return found if len(found) == len(at) else None


def _save_npz(path: Path, **arrays: np.ndarray) -> None:
    """``np.savez_compressed`` written atomically (`leakbench.core.files.atomic_file`)."""
    # Any values: mypy matches a ** mapping against numpy's `allow_pickle: bool` keyword too
    # (python/mypy#1969), though these keys are the array names.
    named: dict[str, Any] = arrays
    with atomic_file(path, "wb") as handle:
        np.savez_compressed(handle, **named)
