"""benchmarks/paper.py: its experiments are valid configs with the papers' settings, and the
tables it writes compute what they say (checked against hand-computed values)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from scripts import load_script

from leakbench.run.config import parse_config

ROOT = Path(__file__).resolve().parents[1]


paper = load_script("paper")


@pytest.fixture(scope="module")
def configs():
    # Dataset paths are only resolved when a run loads them: any root parses.
    texts = paper.experiments(Path("/nonexistent"), 100, 50, lfw_images=20, ig_images=30)
    return {name: parse_config(text, source=name) for name, text in texts.items()}


def test_every_experiment_parses_with_its_image_count(configs) -> None:
    assert set(configs) == {
        "table1-mnist",
        "table1-cifar10",
        "table1-lfw",
        "section5-noise",
        "section5-prune",
        "ig-table1-lenet",
    }
    assert configs["table1-mnist"].images == 100
    assert configs["table1-lfw"].images == 20
    assert configs["section5-noise"].images == 50
    assert configs["ig-table1-lenet"].images == 30


def test_ig_table1_uses_the_papers_code_settings_in_pixel_units(configs) -> None:
    spec = configs["ig-table1-lenet"]
    assert spec.model == "lenet" and spec.threat_model.labels_known
    igs = [a.params for a in spec.attacks if a.name == "ig"]
    # 0.1 in normalised units is 0.025 in pixels; TV 1e-4 and 1e-2 (unpadded) divided by 0.2507.
    want = [1e-4 / 0.2507, 1e-2 / 0.2507]  # written with 4 significant digits
    assert [p["tv"] for p in igs] == pytest.approx(want, rel=1e-3)
    for params in igs:
        assert params["iterations"] == 4800 and params["lr"] == 0.025
        assert params["tv_padding"] == "none" and params["starts"] == 1
    (baseline,) = [a.params for a in spec.attacks if a.name == "dlg"]
    assert baseline["iterations"] == 10000 and baseline["line_search"] == "none"


def test_label_accuracy_interval_is_clopper_pearson() -> None:
    trials = pd.DataFrame({"attack": ["dlg"] * 10, "label_acc": [1.0] * 8 + [0.0] * 2})
    # Exact 95% interval of 8 successes in 10 (Clopper-Pearson): 0.4439 to 0.9748.
    assert paper.label_accuracy(trials, "dlg") == "80.0 (44.4-97.5)"
    assert paper.label_accuracy(trials, "idlg") == "not run"


def test_ig_table_reports_mean_population_std_and_t_interval(tmp_path: Path) -> None:
    params = json.dumps({"tv": 1e-4 / paper.IG_STD})
    baseline = json.dumps({"iterations": 10000})
    rows = [("ig", params, v, 0.01, "schedule") for v in (10.0, 12.0, 14.0, 16.0)]
    rows += [
        ("dlg", baseline, v, 1e-4, stop) for v, stop in ((20.0, "stalled"), (30.0, "converged"))
    ]
    run = tmp_path / "ig-table1-lenet"
    run.mkdir()
    pd.DataFrame(rows, columns=["attack", "attack_params", "psnr", "mse", "stop_reason"]).to_csv(
        run / "trials.csv", index=False
    )
    lines = paper.ig_table1_markdown(tmp_path)
    (ig_row,) = [line for line in lines if line.startswith("| proposed")]
    # mean 13, population std sqrt(5) = 2.24; t(0.975, 3) = 3.1824, sample std 2.582:
    # half-width 3.1824 * 2.582 / 2 = 4.108.
    assert (
        "| 4 | 13.00 +- 2.24 | 8.89 to 17.11 | 13.00 | 0 of 4 | schedule 4 | 18.00 +- 3.33 | no |"
        in ig_row
    )
    assert any("ours is 5.00 dB below the paper's mean, beyond our interval" in x for x in lines)
    (dlg_row,) = [line for line in lines if line.startswith("| Euclid")]
    assert "| 2 | 25.00 +- 5.00 |" in dlg_row and dlg_row.endswith(
        "| 2 of 2 | stalled 1, converged 1 | not found |  |"
    )
    assert math.isclose(paper.IG_PAPER_UNTRAINED_LENET[0], 18.00)


def test_tables_say_not_run_without_trials(tmp_path: Path) -> None:
    assert any("not run" in line for line in paper.ig_table1_markdown(tmp_path))
    assert any("| mnist | MNIST | not run" in line for line in paper.table1_markdown(tmp_path))


def test_a_run_still_in_progress_is_reported_from_its_store(tmp_path: Path) -> None:
    from leakbench.run.store import Store

    run = tmp_path / "table1-lfw"
    run.mkdir()
    text = paper.experiments(Path("/nonexistent"), 100, 50, lfw_images=20)["table1-lfw"]
    (run / "config.toml").write_text(text)
    store = Store(run / "store.sqlite")  # a fresh store records the current engine
    for i, (attack, label) in enumerate([("dlg", 1.0), ("idlg", 1.0), ("dlg", 0.0)]):
        row = {"attack": attack, "label_acc": label, "mse": 1e-5, "status": "ok"}
        row["stop_reason"] = "budget" if i == 2 else "converged"
        store.add(f"key{i}", [row])
    store.close()
    lines = paper.table1_markdown(tmp_path)
    (row,) = [line for line in lines if line.startswith("| lfw | LFW")]
    # 1 of 2 DLG labels right: exact interval 1.3-98.7; iDLG 1 of 1: 2.5-100.
    assert "| 2 (DLG), 1 (iDLG) of 20 (in progress) | 50.0 (1.3-98.7) |" in row
    assert "| 100.0 (2.5-100.0) | 100.0 |" in row
    (fig,) = [line for line in lines if line.startswith("| lfw | dlg |")]
    assert fig == "| lfw | dlg | 2 of 20 (in progress) | 1.00 | 1.00 | 1.00 | 0 | 1 |"


def test_section5_cells_give_success_with_its_exact_interval_and_the_median(tmp_path) -> None:
    run = tmp_path / "section5-prune"
    run.mkdir()
    rows = [("dlg", "{}", "prune", '{"ratio":0.3}', mse, psnr) for mse, psnr in
            ((1e-5, 50.0), (1e-2, 20.0), (1e-1, 10.0), (5e-4, 33.0))]  # fmt: skip
    columns = ["attack", "attack_params", "defense", "defense_params", "mse", "psnr"]
    pd.DataFrame(rows, columns=columns).to_csv(run / "trials.csv", index=False)
    lines = paper.section5_markdown(tmp_path)
    # 2 of 4 recovered: exact interval 0.068-0.932; median PSNR (20 + 33) / 2.
    assert "| prune 0.3 | 0.50 (0.07-0.93) / 26.5 dB |" in lines


@pytest.mark.parametrize("flag", ["--images", "--sweep-images", "--lfw-images", "--ig-images"])
def test_a_count_below_one_is_a_usage_error_before_anything_runs(
    flag: str, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "paper"
    with pytest.raises(SystemExit) as exit_info:
        paper.main(["--out", str(out), flag, "0"])
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .splitlines()[-1]
        .endswith(f"{flag} must be a positive count, got 0")
    )
    assert not out.exists()
