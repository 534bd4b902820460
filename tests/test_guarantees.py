"""Labels and the DP ceiling beside every verdict (`leakbench.outputs.guarantees`, issue 67),
on hand-built trial rows whose counts are known."""

from __future__ import annotations

import pandas as pd
import pytest

from leakbench.outputs.guarantees import guarantee_columns
from leakbench.outputs.tables import leaderboard

DP1 = '{"noise_multiplier":1.0,"norm":1.0}'


def _rows(defense: str, params: str, right: int, identified: int, n: int = 36) -> list[dict]:
    return [
        {
            "run": "r", "dataset": "d", "model": "m", "attack": "dlg", "attack_params": "{}",
            "defense": defense, "defense_params": params, "seed": 0, "batch_index": i,
            "position": 0, "image_index": i, "batch_size": 1, "label": 3,
            "predicted_label": 3 if i < right else 4, "mse": 0.1, "psnr": 10.0, "ssim": 0.0,
            "lpips": 0.5, "label_acc": float(i < right), "status": "ok", "seconds": 1.0,
            "identified": float(i < identified), "distractors": 999.0, "identified_null": 0.0,
        }
        for i in range(n)
    ]  # fmt: skip


def test_labels_beyond_chance_leak_and_a_few_do_not() -> None:
    """22 of 36 right among 10 classes is far beyond a guess (p ~ 1e-13); 5 of 36 is not
    (p = 0.27)."""
    facts = guarantee_columns(
        pd.DataFrame(_rows("gaussian", '{"sigma":0.1}', 22, 0) + _rows("none", "{}", 5, 0)),
        classes=10,
    ).set_index("defense")
    assert bool(facts.loc["gaussian", "labels_leak"])
    assert not facts.loc["none", "labels_leak"]
    assert facts.loc["gaussian", "label_right"] == 22 and facts.loc["gaussian", "label_n"] == 36
    assert facts.loc["gaussian", "label_chance"] == pytest.approx(0.1)
    assert "labels leak: 22/36 right by dlg" in facts.loc["gaussian", "note"]
    unknown = guarantee_columns(pd.DataFrame(_rows("none", "{}", 36, 0)), classes=None)
    assert unknown["labels_leak"].isna().all()


def test_the_dp_ceiling_is_the_closed_form_and_a_share_above_it_is_a_bug() -> None:
    """DP-SGD at z = 1 is 1-GDP per release: with 999 distractors the ceiling is
    Phi(Phi^-1(1/1000) + 1) = 1.83%. 5 identified of 36 (95% CI 4.7-29.5%) lies above it;
    1 of 36 (0.07-14.5%) does not. Four clients' noise adds up (z = 2: 0.48%); four local
    steps compose (2-GDP: 13.8%)."""
    above = guarantee_columns(pd.DataFrame(_rows("dpsgd", DP1, 0, 5)), classes=10)
    assert above["dp_ceiling"].iloc[0] == pytest.approx(0.01830, abs=1e-4)
    assert "above the DP ceiling: an implementation or accounting bug" in above["note"].iloc[0]
    within = guarantee_columns(pd.DataFrame(_rows("dpsgd", DP1, 0, 1)), classes=10)
    assert "bug" not in within["note"].iloc[0]
    assert "DP ceiling 1.83% identified per image" in within["note"].iloc[0]
    clients = guarantee_columns(pd.DataFrame(_rows("dpsgd", DP1, 0, 0)), 10, clients=4)
    assert clients["dp_ceiling"].iloc[0] == pytest.approx(0.004796, abs=1e-4)
    steps = guarantee_columns(pd.DataFrame(_rows("dpsgd", DP1, 0, 0)), 10, releases=4)
    assert steps["dp_ceiling"].iloc[0] == pytest.approx(0.1378, abs=1e-3)
    # Labels: z = 1 allows Phi(Phi^-1(0.1) + 1) = 39% for a guess among 10 classes.
    labels = guarantee_columns(pd.DataFrame(_rows("dpsgd", DP1, 34, 0)), classes=10)
    assert "above the DP ceiling 39% for a guess among the classes" in labels["note"].iloc[0]
    no_guarantee = guarantee_columns(pd.DataFrame(_rows("gaussian", '{"sigma":1.0}', 0, 0)), 10)
    assert no_guarantee["dp_ceiling"].isna().all()


def test_every_dp_row_of_a_protocol_2_leaderboard_prints_its_ceiling() -> None:
    trials = pd.DataFrame(_rows("none", "{}", 36, 36) + _rows("dpsgd", DP1, 12, 0))
    board = leaderboard(trials, 1e-3, classes=10)
    dp = board[board["defense"] == "dpsgd"]
    assert dp["dp_ceiling"].iloc[0] == pytest.approx(0.0183, abs=1e-4)
    assert "DP ceiling 1.83%" in dp["verdict_note"].iloc[0]
    assert "labels leak: 12/36" in dp["verdict_note"].iloc[0]
    old = leaderboard(trials, 1e-3, protocol=1, classes=10)  # protocol 1: columns, no note
    assert "DP ceiling" not in old.loc[old["defense"] == "dpsgd", "verdict_note"].iloc[0]
