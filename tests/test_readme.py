"""The README's numbers against the committed results they quote."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
TRIALS = ROOT / "results" / "default" / "trials.csv"


def _script():
    spec = importlib.util.spec_from_file_location(
        "readme_numbers", ROOT / "benchmarks" / "readme_numbers.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_printed_leaderboard_excerpt_is_the_committed_runs() -> None:
    script = _script()
    assert script.readme_excerpt(README) == script.default_excerpt(), (
        "README.md disagrees with results/default: run benchmarks/readme_numbers.py"
    )


def test_the_quoted_losses_of_dlgs_unrecovered_images_are_the_committed_ones() -> None:
    trials = pd.read_csv(TRIALS)
    plain = trials[(trials["attack"] == "dlg") & (trials["defense"] == "none")]
    plain = plain[~plain["attack_params"].str.contains("cosine")]
    missed = plain[plain["mse"] > 1e-3]
    recovered = plain[plain["mse"] <= 1e-3]
    match = re.search(
        r"DLG (\d+) of (\d+) \(the other\s+two stop at a gradient-matching loss of ([\d.]+) and "
        r"([\d.]+),.*?against at most ([\d.e-]+) for the",
        README,
        re.S,
    )
    assert match is not None, "the README no longer quotes DLG's unrecovered images"
    assert (int(match.group(1)), int(match.group(2))) == (len(recovered), len(plain))
    assert len(missed) == 2
    assert [float(match.group(3)), float(match.group(4))] == [
        round(float(x), 2) for x in missed["loss"]
    ]
    assert float(match.group(5)) >= recovered["loss"].max()
    assert float(match.group(5)) < 10 * recovered["loss"].max()
