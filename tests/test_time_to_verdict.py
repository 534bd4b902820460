"""`benchmarks/time_to_verdict.py`: a usage error is one line and exit code 2, and the pure parts
(the CSV rows, the stages read from a run directory's tables and from a profile, the figures
read from attack_speed.csv) are right. The cases themselves are a benchmark, not a test."""

from __future__ import annotations

import marshal
import math
import sys
from pathlib import Path

import pytest
from scripts import load_script

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ttv = load_script("time_to_verdict")


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["--cases", "foo"],
            "--cases: unknown 'foo'; allowed: cli, default, cifar8, dlg256, roofline",
        ),
        (["--cases", " , "], "--cases must name at least one of"),
        (["--profile", "--cases", "roofline"], "--profile profiles the default run"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--quick", "extra"], "unrecognized arguments: extra"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        ttv.main(argv)
    assert stop.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("time_to_verdict: error: ")
    assert line in lines[0]
    assert captured.out == ""


def test_bad_folders_exit_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "default").mkdir()
    for argv, line in [
        (["--out", str(tmp_path)], "is a folder; give the CSV file's path"),
        (["--keep", str(kept)], "must be a new or empty folder"),
    ]:
        with pytest.raises(SystemExit) as stop:
            ttv.main(argv)
        assert stop.value.code == 2
        lines = capsys.readouterr().err.splitlines()
        assert len(lines) == 1 and lines[0].startswith("time_to_verdict: error: ")
        assert line in lines[0]


def test_good_arguments_are_resolved(tmp_path: Path) -> None:
    args = ttv.parse_args(["--cases", "roofline,default,roofline", "--out", "x.csv"])
    assert args.cases == ["roofline", "default"]
    assert args.out.is_absolute() and args.data_root.is_absolute()
    assert ttv.parse_args(["--keep", str(tmp_path / "new"), "--profile"]).profile


def machine() -> object:
    return ttv.Machine("Test CPU", 2, (0.1, 0.2, 0.3), (1.0, 2.0, 3.0), "python 3", "2026-12-07")


def test_csv_rows_carry_each_measure_and_the_machine() -> None:
    measures = [
        ttv.Measure("default", "wall_seconds", 293.5, "s"),
        ttv.Measure("cifar8", "skipped", math.nan, note="no data"),
        ttv.Measure("default", "stage_seconds", 12.0, "s", "attacks/dlg", "trials.csv", "3 trials"),
    ]
    rows = [
        dict(zip(ttv.COLUMNS, row, strict=True)) for row in ttv.csv_rows(measures, machine(), True)
    ]
    assert len(rows) == 3
    assert rows[0]["case"] == "default" and rows[0]["value"] == 293.5 and rows[0]["unit"] == "s"
    assert rows[0]["source"] == "measured" and rows[0]["cores"] == 2
    assert rows[1]["metric"] == "skipped" and rows[1]["note"] == "no data"
    assert rows[2]["name"] == "attacks/dlg" and rows[2]["source"] == "trials.csv"
    assert {r["load_start"] for r in rows} == {"0.10 0.20 0.30"}
    assert {r["load_end"] for r in rows} == {"1.00 2.00 3.00"}
    assert {r["cpu"] for r in rows} == {"Test CPU"} and {r["quick"] for r in rows} == {True}


def trial(attack: str, batch: int, seconds: float, escalations: int = 0, pos: int = 0) -> dict:
    return {
        "attack": attack,
        "attack_params": "{}",
        "defense": "prune",
        "defense_params": '{"ratio":0.5}',
        "seed": "0",
        "batch_index": str(batch),
        "position": str(pos),
        "seconds": str(seconds),
        "escalations": str(escalations),
    }


def test_recorded_stages_count_each_trial_once() -> None:
    trials = [
        trial("dlg", 0, 2.0, pos=0),
        trial("dlg", 0, 2.0, pos=1),  # the same trial's second image
        trial("dlg", 1, 3.0, escalations=2),
        trial("ig", 0, 10.0),
    ]
    utility = [
        {"recipe": "default", "steps": "11", "seconds_per_step": "0.5", "learning_rates": "[1,2]"},
        {"recipe": "dp", "steps": "101", "seconds_per_step": "0.1", "learning_rates": "[4.0]"},
    ]
    stages = {m.name: m for m in ttv.training_stages("x", utility) + ttv.attack_stages("x", trials)}
    assert stages["trainings/default recipe"].value == pytest.approx(10.0)  # 0.5 * 10 * 2
    assert stages["trainings/dp recipe"].value == pytest.approx(10.0)
    assert stages["trainings"].value == pytest.approx(20.0)
    assert stages["attacks/dlg"].value == pytest.approx(5.0)
    assert stages["attacks/dlg"].note == "2 trials"
    assert stages["attacks/ig"].value == pytest.approx(10.0)
    assert stages["attacks"].value == pytest.approx(15.0)
    assert stages["attacks/escalated trials"].value == pytest.approx(3.0)
    assert "2 escalation rounds" in stages["attacks/escalated trials"].note
    assert {m.metric for m in stages.values()} == {"stage_seconds"}
    assert ttv.attack_stages("x", []) == [] and ttv.training_stages("x", []) == []


def entry(cumulative: float, callers: dict | None = None) -> tuple:
    return (1, 1, 0.0, cumulative, callers or {})


def fake_stats() -> dict:
    """A profile as `pstats.Stats.stats` holds it: ``(file, line, function) -> (calls,
    primitive calls, own time, cumulative time, {caller: (the same four)})``."""
    root = "/site/leakbench/"
    group = (root + "run/execute.py", 218, "attack_group")
    settle = (root + "run/judge.py", 300, "settle")
    leaked = (root + "run/judge.py", 258, "leaked")
    rows = (root + "run/execute.py", 485, "trial_rows")
    return {
        # The interpreter's own time: the profile's total (`pstats.Stats.total_tt`).
        ("~", 0, "<built-in method builtins.exec>"): (1, 1, 300.0, 300.0, {}),
        ("/repo/bench/core/environment.py", 158, "import_tensorflow_quietly"): entry(7.0),
        (root + "run/execute.py", 73, "train_one"): entry(100.0),
        (root + "client/training.py", 133, "sampled_step"): entry(40.0),
        (root + "attacks/base.py", 286, "attack_many"): entry(
            80.0, {group: (1, 1, 0.0, 60.0), settle: (1, 1, 0.0, 20.0)}
        ),
        settle: entry(30.0),
        (root + "run/judge.py", 218, "losses_at"): entry(6.0),
        (root + "components/metrics.py", 107, "score_batch"): entry(
            9.0, {rows: (1, 1, 0.0, 7.0), leaked: (1, 1, 0.0, 2.0)}
        ),
        (root + "components/metrics.py", 55, "ssim"): entry(3.0),
        (root + "components/lpips.py", 181, "distance"): entry(4.0),
        (root + "run/identification.py", 114, "add_flags"): entry(8.0),
        (root + "components/lpips.py", 159, "embed"): entry(5.0),
        (root + "run/rundir.py", 102, "export_tables"): entry(11.0),
        ("/repo/bench/cli.py", 485, "_write_run_report"): entry(2.0),
        # Same function names elsewhere: never counted.
        ("/other/pkg/execute.py", 1, "train_one"): entry(1000.0),
        ("/other/run/judge.py.bak", 1, "settle"): entry(1000.0),
    }


EXPECTED_STAGES = {
    "startup (TensorFlow import)": 7.0,
    "trainings": 100.0,
    "trainings/DP-SGD steps": 40.0,
    "attacks, first pass": 60.0,
    "judge": 30.0 - 20.0 - 2.0,
    "judge/losses at the truth and the result": 6.0,
    "escalation": 20.0,
    "scoring": 9.0,
    "scoring/SSIM": 3.0,
    "scoring/LPIPS": 4.0,
    "identification": 8.0,
    "identification/LPIPS embeddings": 5.0,
    "LPIPS, all (scoring and identification)": 9.0,
    "export, figures and report": 11.0 + 2.0 - 8.0,
}


def test_stages_are_attributed_from_a_profile() -> None:
    stages = dict(ttv.attribute(fake_stats(), 300.0))
    assert stages.pop("other") == pytest.approx(300.0 - 7 - 100 - 60 - 8 - 20 - 9 - 8 - 5)
    assert stages == pytest.approx(EXPECTED_STAGES)


def test_stages_are_read_from_a_profile_file(tmp_path: Path) -> None:
    path = tmp_path / "run.prof"
    path.write_bytes(marshal.dumps(fake_stats()))
    measures = ttv.profile_measures("default", path)
    by_name = {m.name: m.value for m in measures}
    assert by_name.pop("total") == pytest.approx(300.0)  # the sum of the own times
    assert by_name.pop("other") == pytest.approx(83.0)
    assert by_name == pytest.approx(EXPECTED_STAGES)
    assert {(m.case, m.metric, m.source) for m in measures} == {
        ("default", "profile_seconds", "cProfile")
    }


def speed_row(implementation: str, budget: str, width: int, attacks: int, **values: str) -> dict:
    return {
        "dataset": "mnist",
        "implementation": implementation,
        "budget": budget,
        "width": str(width),
        "attacks": str(attacks),
        "seconds_per_attack": "0.25",
        "successes": "230",
        "gflops": "20.0",
        "matmul_gflops": "160.0",
        **values,
    }


def test_dlg_ratio_and_the_leakbench_side_alone() -> None:
    rows = [
        speed_row("leakbench", "default-300", 1, 1),
        speed_row("leakbench", "paper-6000", 256, 256),
        speed_row("pytorch-reference", "paper-6000", 1, 256, seconds_per_attack="4.0"),
    ]
    out = {(m.metric, m.name): m for m in ttv.dlg_measures(rows, torch=True)}
    mine = "leakbench dlg, paper budget, N=256"
    assert out[("attack_seconds", mine)].value == pytest.approx(64.0)
    assert out[("attack_seconds", "PyTorch reference")].value == pytest.approx(1024.0)
    assert out[("successes", mine)].value == 230
    assert out[("speedup", "PyTorch / leakbench")].value == pytest.approx(16.0)
    alone = {m.metric: m for m in ttv.dlg_measures(rows[:2], torch=False)}
    assert math.isnan(alone["speedup"].value)
    assert "PyTorch is not importable" in alone["speedup"].note
    assert ttv.dlg_measures(rows[:1], torch=False) == []


def test_roofline_reads_gflops_and_the_matmul_peak() -> None:
    rows = [
        speed_row("leakbench", "default-300", 1, 32, gflops="8.0"),
        speed_row("leakbench", "default-300", 256, 256, gflops="40.0"),
        speed_row("leakbench", "paper-6000", 256, 256, gflops="99.0"),
    ]
    out = {(m.metric, m.name): m.value for m in ttv.roofline_measures(rows)}
    assert out[("matmul_gflops", "dense matmul 2048x2048 float32")] == 160.0
    assert out[("gflops", "mnist N=1")] == 8.0 and out[("gflops", "mnist N=256")] == 40.0
    assert out[("peak_share", "mnist N=256")] == pytest.approx(0.25)
    assert len(out) == 5  # the paper-budget row is not the roofline's


def test_attack_speed_arguments() -> None:
    full = ttv.attack_speed_args("dlg256", quick=False, torch=False, cifar=True)
    assert full[full.index("--torch-images") + 1] == "256" and "--no-torch" in full
    assert full[full.index("--paper-widths") + 1] == "256"
    assert "--no-torch" not in ttv.attack_speed_args("dlg256", quick=True, torch=True, cifar=True)
    roof = ttv.attack_speed_args("roofline", quick=False, torch=True, cifar=True)
    assert roof[roof.index("--widths") + 1] == "1,32,256"
    assert roof[roof.index("--datasets") + 1] == "cifar10,mnist"
    assert roof[roof.index("--torch-images") + 1] == "0"
    quick = ttv.attack_speed_args("roofline", quick=True, torch=True, cifar=True)
    assert quick[quick.index("--widths") + 1] == "1" and "mnist" in quick


def test_commands(tmp_path: Path) -> None:
    run = ttv.run_command(tmp_path / "out", ["images=2"])
    assert run[1:4] == ["-m", "leakbench.cli", "run"] and "--quiet" in run
    assert run[-2:] == ["--set", "images=2"]
    profiled = ttv.profile_command(tmp_path / "p", tmp_path / "p.prof", ())
    assert profiled[1:5] == ["-m", "cProfile", "-o", str(tmp_path / "p.prof")]
    assert profiled[5:7] == ["-m", "leakbench.cli"] and profiled[-2:] == ["--workers", "1"]


def test_the_cifar8_config_is_the_suite_on_two_defenses() -> None:
    doc = tomllib.loads(ttv.CIFAR8_CONFIG.format(npz="/data/cifar10-test.npz", images=8))
    assert doc["dataset"] == "npz:/data/cifar10-test.npz" and doc["images"] == 8
    assert doc["model"] == "lenet" and doc["suite"] == "standard" and "attack" not in doc
    assert doc["defense"] == [{"name": "none"}, {"name": "prune", "ratio": 0.5}]
    assert doc["training"] == {"enabled": False}


def test_the_summary_prints_every_case(capsys: pytest.CaptureFixture[str]) -> None:
    measures = [
        *ttv.usage_measures("default", ttv.Usage(300.0, 500.0, 2048.0, 0)),
        ttv.Measure("default", "stage_seconds", 150.0, "s", "attacks", "trials.csv"),
        ttv.Measure("default", "stage_seconds", 50.0, "s", "attacks/ig", "trials.csv"),
        *ttv.skipped("cifar8", "no data"),
        *ttv.usage_measures("roofline", ttv.Usage(10.0, 12.0, 900.0, 3)),
    ]
    ttv.print_summary(measures, machine())
    out = capsys.readouterr().out
    assert "5 min 00.0 s" in out and "skipped" in out and "failed: exit code 3" in out
    assert "50.0%" in out and "16.7%" in out  # shares of the default run's wall time


def test_the_cli_case_times_three_answers_and_checks_their_exit_codes(tmp_path: Path) -> None:
    """``--help`` and ``list`` exit 0 and the bad config 2 (a wrong exit code would be noted
    as a failure); the times themselves are the benchmark's to report, not this test's."""
    measures = ttv.run_cli(None, tmp_path)
    assert [(m.case, m.metric, m.name) for m in measures] == [
        ("cli", "wall_seconds", "--help"),
        ("cli", "wall_seconds", "list"),
        ("cli", "wall_seconds", "bad config"),
    ]
    assert all(m.note == "" and m.value > 0 for m in measures)
