"""A consistent forgery (issue 63, acceptance 2): one defense that leaks every image made to
look private by editing its trials' scores, overwriting its arrays with noise (so that the
scores are what the arrays give) and rescoring, so that every file agrees with every other.
The board alone cannot tell (it recomputes only from what was submitted); `board --verify`
must, because its draw covers every configuration and cannot be known in advance. The test
counts how many of 20 seeded draws dispute the forgery and prints the rate."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cli_capture import run_cli

from leakbench.components.metrics import mse as mse_of
from leakbench.components.metrics import psnr as psnr_of
from leakbench.outputs.arrays import ARRAYS_DIR, cell_id
from leakbench.run.board_build import build_board
from leakbench.run.identification import rescore_run_dir
from leakbench.run.ledger import entry_sha256, read_ledger
from leakbench.run.verify import verify_entry

# Single-trial groups (parallel_trials = 1), so that a draw can take a few of them.
RUN = """\
name = "victim"
dataset = "digits"
model = "lenet"
suite = "listed"
images = 4
seeds = [0]
parallel_trials = 1

[[attack]]
name = "idlg"
iterations = 100

[[defense]]
name = "none"

[[defense]]
name = "gaussian"
sigma = [1e-4, 1e-1]

[training]
enabled = false
"""
BROKEN = '{"sigma":0.0001}'
DRAWS = 20


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("forgery")
    (root / "victim.toml").write_text(RUN)
    honest = root / "honest"
    result = run_cli("run", str(root / "victim.toml"), "--out", str(honest), "--quiet")
    assert result.code == 0, result.err
    return honest, forge(honest, root / "forged")


def forge(run: Path, out: Path) -> Path:
    """The consistent forgery of the module docstring, of the `BROKEN` defense's cell."""
    shutil.copytree(run, out, ignore=shutil.ignore_patterns("store.sqlite*"))
    trials = pd.read_csv(out / "trials.csv")
    rows = trials[trials["defense_params"] == BROKEN]
    path = out / ARRAYS_DIR / f"{cell_id(rows.iloc[0])}.npz"
    with np.load(path, allow_pickle=False) as data:
        arrays = {name: data[name] for name in data.files}
    noise = np.random.default_rng(1).integers(0, 256, arrays["reconstruction"].shape, np.uint8)
    arrays["reconstruction"] = noise
    np.savez_compressed(path, **arrays)
    forged_mse = mse_of(arrays["original"] / 255.0, noise / 255.0)
    trials.loc[rows.index, "mse"] = forged_mse
    trials.loc[rows.index, "psnr"] = psnr_of(forged_mse)
    trials.loc[rows.index, ["ssim", "lpips"]] = [0.01, 0.6]
    trials.to_csv(out / "trials.csv", index=False)
    rescore_run_dir(out)
    return out


def test_the_forgery_is_consistent_so_the_board_alone_shows_it(runs) -> None:
    honest, forged = runs
    rows = build_board([honest, forged]).rows
    label = "gaussian sigma=0.0001"
    truth = rows[(rows["run_dir"] == str(honest)) & (rows["defense_label"] == label)]
    shown = rows[(rows["run_dir"] == str(forged)) & (rows["defense_label"] == label)]
    assert truth["leaked"].iloc[0] == 4 and shown["leaked"].iloc[0] == 0
    assert set(shown["verification"]) == {"not verified"}


def test_verify_disputes_the_forgery_in_at_least_19_of_20_draws(runs, tmp_path: Path) -> None:
    _, forged = runs
    ledger = tmp_path / "ledger.json"
    disputed = 0
    for draw in range(DRAWS):
        record = verify_entry(forged, ledger, share=0.1, seed=draw)
        broken = record["configurations"].get("gaussian sigma=0.0001", {})
        disputed += record["status"] == "disputed" and broken.get("status") == "disputed"
        # The honest configurations compared in the draw stay verified.
        assert record["configurations"]["none"]["status"] == "verified"
    print(f"consistent forgery disputed in {disputed} of {DRAWS} draws")
    assert disputed >= 19
    site = tmp_path / "site"
    result = run_cli("board", str(forged), "--out", str(site), "--ledger", str(ledger), "--quiet")
    assert result.code == 0, result.err
    rows = pd.read_csv(site / "board.csv").set_index("defense_label")
    assert rows.loc["gaussian sigma=0.0001", "verification"] == "disputed"
    assert read_ledger(ledger)[entry_sha256(forged)]["draw"] == DRAWS - 1


def test_a_fresh_draw_is_recorded_and_reproducible(runs, tmp_path: Path) -> None:
    honest, _ = runs
    ledger = tmp_path / "ledger.json"
    first = verify_entry(honest, ledger, share=0.1)
    assert first["status"] == "verified", first["summary"]
    again = verify_entry(honest, ledger, share=0.1, seed=first["draw"])
    assert again["draw"] == first["draw"] and again["compared"] == first["compared"]
    assert set(first["configurations"]) == {"none", "gaussian sigma=0.0001", "gaussian sigma=0.1"}
