"""Result tables: column declarations, the leaderboard aggregation and atomic CSV writing."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from leakbench.metrics import mean_ci95

# Declared once; the CSVs always have exactly these columns in this order.
TRIAL_COLUMNS = [
    "run", "dataset", "model", "attack", "attack_params", "defense", "defense_params", "seed",
    "batch_index", "position", "image_index", "batch_size", "label", "predicted_label", "mse",
    "psnr", "ssim", "label_acc", "status", "loss", "iterations", "evaluations", "attempts",
    "seconds",
]  # fmt: skip
TIMING_COLUMNS = ["seconds"]
CELL_COLUMNS = ["dataset", "model", "attack", "attack_params", "defense", "defense_params"]
LEADERBOARD_COLUMNS = [
    *CELL_COLUMNS, "n", "psnr_mean", "psnr_ci95", "psnr_median", "ssim_mean", "ssim_ci95",
    "mse_mean", "mse_median", "label_acc", "success_rate", "diverged", "errors", "seconds_mean",
]  # fmt: skip


def leaderboard(trials: pd.DataFrame, success_mse: float = 1e-3) -> pd.DataFrame:
    """One row per (dataset, model, attack, attack_params, defense, defense_params) cell.

    ``n`` counts images; ``success_rate`` is the share with MSE <= ``success_mse`` (iDLG's
    fidelity threshold 1e-3 by default); ``diverged`` and ``errors`` count images of trials with
    that status (their reconstructions are still scored, as the attacker would have them).
    """
    rows = []
    for cell, group in trials.groupby(CELL_COLUMNS, sort=False):
        psnr_mean, psnr_ci, n = mean_ci95(group["psnr"].to_numpy())
        ssim_mean, ssim_ci, _ = mean_ci95(group["ssim"].to_numpy())
        rows.append(
            {
                **dict(zip(CELL_COLUMNS, cell, strict=True)),
                "n": n,
                "psnr_mean": psnr_mean,
                "psnr_ci95": psnr_ci,
                "psnr_median": float(np.median(group["psnr"])),
                "ssim_mean": ssim_mean,
                "ssim_ci95": ssim_ci,
                "mse_mean": float(group["mse"].mean()),
                "mse_median": float(group["mse"].median()),
                "label_acc": float(group["label_acc"].mean()),
                "success_rate": float((group["mse"] <= success_mse).mean()),
                "diverged": int((group["status"] == "diverged").sum()),
                "errors": int((group["status"] == "error").sum()),
                "seconds_mean": float(group["seconds"].mean()),
            }
        )
    return pd.DataFrame(rows, columns=LEADERBOARD_COLUMNS)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates files with mode 0600; results get the usual permissions of new files instead.
_FILE_MODE = 0o666 & ~_umask()


def write_csv(frame: pd.DataFrame, path: str | Path, columns: list[str]) -> None:
    """Writes ``frame[columns]`` to ``path`` atomically (temp file in the same folder, then
    ``os.replace``), so a reader never sees a half-written table."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", newline="") as handle:
            os.fchmod(handle.fileno(), _FILE_MODE)
            frame.reindex(columns=columns).to_csv(handle, index=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> None:
    """Writes text atomically, like `write_csv`."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), _FILE_MODE)
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
