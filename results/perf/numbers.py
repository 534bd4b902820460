"""The numbers of the generated passages on the measured speeds: attacks, Inverting Gradients' loop
and the trainer's steady state (templates in `passages/`, filled by
`benchmarks/readme_numbers.py`)."""

from __future__ import annotations

from typing import Any

import pandas as pd
from passages import (
    ReadmeError,
    Results,
    block,
    claim,
    count,
    one,
    recovered,
    span,
    table_row,
    whole_range,
)

# Today's default budget on CIFAR-10, which attack-speed-today quotes.
CONVERGENCE = "convergence/cifar10-defaults"
SPEED = "perf/attack_speed.csv"
SPEED_DATA = {"cifar10": "CIFAR-10", "mnist": "MNIST"}
SPEED_ROWS = (
    ("pytorch-reference", "paper-6000", "PyTorch reference, paper (300 steps, <= 6,000 evals)"),
    ("leakbench", "paper-6000", 'leakbench `dlg`, `line_search = "none"`, 300 steps'),
    ("leakbench", "default-300", "leakbench `dlg` default (300 iterations)"),
)


def _speed(
    results: Results, dataset: str, implementation: str, budget: str, path: str = SPEED
) -> pd.DataFrame:
    table = results.csv(path)
    return table[
        (table["dataset"] == dataset)
        & (table["implementation"] == implementation)
        & (table["budget"] == budget)
    ].sort_values("width", kind="mergesort")


def _speed_at(
    results: Results, dataset: str, implementation: str, budget: str, width: int, path: str = SPEED
) -> pd.Series:
    rows = _speed(results, dataset, implementation, budget, path)
    rows = rows[rows["width"] == width]
    if len(rows) != 1:
        raise ReadmeError(f"{path}: no single {dataset} {implementation} {budget} at {width}")
    return rows.iloc[0]


def _ratio(value: float) -> str:
    return "1" if value == 1 else f"{value:.3f}"


@block("attack-speed", refill=False)
def attack_speed(results: Results) -> dict[str, Any]:
    lines = []
    for dataset, name in SPEED_DATA.items():
        for implementation, budget, label in SPEED_ROWS:
            rows = _speed(results, dataset, implementation, budget)
            data = f"{name} {rows['input_shape'].iloc[0]}"
            if budget == "paper-6000":
                for _, row in rows.iterrows():
                    lines.append(
                        table_row(
                            [
                                data,
                                label,
                                str(row["width"]),
                                f"{row['seconds_per_attack']:#.3g}",
                                count(row["evaluations_per_attack"]),
                                count(row["evaluations_per_second"]),
                                f"{row['successes']}/{row['attacks']}",
                                _ratio(row["torch_ratio"]),
                            ]
                        )
                    )
                continue
            if (rows["successes"] == 0).all():
                success = "0 of " + ", ".join(str(n) for n in rows["attacks"])
            else:
                success = ", ".join(
                    f"{k}/{n}" for k, n in zip(rows["successes"], rows["attacks"], strict=True)
                )
            lines.append(
                table_row(
                    [
                        data,
                        label,
                        " / ".join(str(width) for width in rows["width"]),
                        " / ".join(f"{s:.2f}" for s in rows["seconds_per_attack"]),
                        f"~{5 * round(rows['evaluations_per_attack'].mean() / 5)}",
                        " / ".join(count(e) for e in rows["evaluations_per_second"]),
                        success,
                        "",
                    ]
                )
            )
    return {"rows": "\n".join(lines)}


def _paper_budget(results: Results, dataset: str, width: int, path: str = SPEED) -> pd.Series:
    return _speed_at(results, dataset, "leakbench", "paper-6000", width, path)


def _reference(results: Results, dataset: str, path: str = SPEED) -> pd.Series:
    return _speed_at(results, dataset, "pytorch-reference", "paper-6000", 1, path)


@span("attack-speed-criterion-1")
def attack_speed_criterion_1(results: Results) -> dict[str, Any]:
    single = {d: _paper_budget(results, d, 1) for d in SPEED_DATA}
    for dataset, row in single.items():
        claim(row["torch_ratio"] <= 1 / 3, f"criterion 1 fails on {dataset}: slower than a third")
        claim(
            row["successes"] >= _reference(results, dataset)["successes"],
            f"criterion 1 fails on {dataset}: fewer images than the reference",
        )
    cifar, mnist = single["cifar10"], single["mnist"]
    return {
        "cifar_ratio": f"{cifar['torch_ratio']:.3f}",
        "mnist_ratio": f"{mnist['torch_ratio']:.3f}",
        "cifar": f"{cifar['successes']}/{cifar['attacks']}",
        "mnist": f"{mnist['successes']}/{mnist['attacks']}",
    }


@span("attack-speed-criterion-2")
def attack_speed_criterion_2(results: Results) -> dict[str, Any]:
    batched = {d: _paper_budget(results, d, 32) for d in SPEED_DATA}
    claim(all(row["torch_ratio"] <= 0.1 for row in batched.values()), "criterion 2 fails")
    return {
        "cifar_ratio": f"{batched['cifar10']['torch_ratio']:.3f}",
        "mnist_ratio": f"{batched['mnist']['torch_ratio']:.3f}",
    }


@span("attack-speed-steps")
def attack_speed_steps(results: Results) -> dict[str, Any]:
    cifar, mnist = _paper_budget(results, "cifar10", 1), _paper_budget(results, "mnist", 1)
    ref_cifar, ref_mnist = _reference(results, "cifar10"), _reference(results, "mnist")
    claim(
        cifar["evaluations_per_attack"] < ref_cifar["evaluations_per_attack"]
        and mnist["evaluations_per_attack"] < ref_mnist["evaluations_per_attack"],
        "leakbench no longer needs fewer evaluations than PyTorch",
    )
    return {
        "cifar_evals": count(cifar["evaluations_per_attack"]),
        "cifar_reference": count(ref_cifar["evaluations_per_attack"]),
        "mnist_evals": count(mnist["evaluations_per_attack"]),
        "mnist_reference": count(ref_mnist["evaluations_per_attack"]),
        "cifar": cifar["successes"],
        "cifar_attacks": cifar["attacks"],
        "mnist": mnist["successes"],
        "mnist_attacks": mnist["attacks"],
    }


@span("attack-speed-lanes")
def attack_speed_lanes(results: Results) -> dict[str, Any]:
    batched = _paper_budget(results, "cifar10", 32)
    return {"evals_per_second": count(batched["evaluations_per_second"])}


@span("attack-speed-alone")
def attack_speed_alone(results: Results) -> dict[str, Any]:
    single, batched = _paper_budget(results, "cifar10", 1), _paper_budget(results, "cifar10", 32)
    claim(
        single["evaluations_per_attack"] == batched["evaluations_per_attack"],
        "a CIFAR-10 trial no longer computes the same at N = 1 and N = 32",
    )
    return {"evals": count(single["evaluations_per_attack"])}


@span("attack-speed-reference")
def attack_speed_reference(results: Results) -> dict[str, Any]:
    return {"seconds": f"{_reference(results, 'cifar10')['seconds_per_attack']:.1f}"}


@span("attack-speed-gflops")
def attack_speed_gflops(results: Results) -> dict[str, Any]:
    table = results.csv(SPEED)
    gflops = table[table["implementation"] == "leakbench"]["gflops"]
    return {"gflops": whole_range(list(gflops))}


@span("attack-speed-old-default")
def attack_speed_old_default(results: Results) -> dict[str, Any]:
    mnist = _speed(results, "mnist", "leakbench", "default-300")
    cifar = _speed(results, "cifar10", "leakbench", "default-300")
    mnist, cifar = mnist[mnist["attacks"] == 32], cifar[cifar["attacks"] == 32]
    claim(mnist["successes"].nunique() == 1, "the old budget's MNIST successes vary with N")
    claim(cifar["successes"].nunique() == 1, "the old budget's CIFAR-10 successes vary with N")
    seconds = mnist["seconds_per_attack"]
    return {
        "mnist": mnist["successes"].iloc[0],
        "fastest": f"{seconds.min():.2f}",
        "slowest": f"{seconds.max():.2f}",
        "cifar": cifar["successes"].iloc[0],
    }


@span("attack-speed-today")
def attack_speed_today(results: Results) -> dict[str, Any]:
    board = results.csv(f"{CONVERGENCE}/leaderboard.csv")
    dlg, idlg = one(board, attack="dlg"), one(board, attack="idlg")
    return {"dlg": recovered(dlg), "images": dlg["n"], "idlg": recovered(idlg)}


IG_MODELS = {
    "convnet": "`convnet` (width 8)",
    "convnet64": "`convnet64` (the paper's width)",
    "resnet18": "`resnet18`",
}


def _ig_speed(results: Results, model: str) -> dict[tuple[str, int], float]:
    table = results.csv("perf/ig_speed.csv")
    rows = table[table["model"] == model]
    return {
        (row["implementation"], row["threads"]): row["ms_per_iteration"]
        for _, row in rows.iterrows()
    }


@block("ig-speed", refill=False)
def ig_speed(results: Results) -> dict[str, Any]:
    table = results.csv("perf/ig_speed.csv")
    lines = []
    for model, label in IG_MODELS.items():
        times = _ig_speed(results, model)
        ours = times[("leakbench", 2)]
        parameters = table[table["model"] == model]["parameters"].iloc[0]
        lines.append(
            table_row(
                [
                    label,
                    count(parameters),
                    f"{ours:.1f}",
                    f"{times[('pytorch', 1)]:.1f}",
                    f"{times[('pytorch', 2)]:.1f}",
                    f"{ours / times[('pytorch', 1)]:.2f}",
                ]
            )
        )
    return {"rows": "\n".join(lines)}


@span("ig-speed-finding")
def ig_speed_finding(results: Results) -> dict[str, Any]:
    for model in IG_MODELS:
        times = _ig_speed(results, model)
        ours = times[("leakbench", 2)]
        claim(
            ours < times[("pytorch", 1)] and ours < times[("pytorch", 2)],
            f"leakbench is no longer faster than PyTorch on {model}",
        )
    return {}


def _steady(results: Results) -> pd.Series:
    return results.csv("perf/train_steady_state.csv").iloc[0]


@block("steady-state", refill=False)
def steady_state(results: Results) -> dict[str, Any]:
    run = _steady(results)
    nodes = (
        f"{count(run['graph_nodes_10'])} nodes"
        if run["graph_nodes_10"] == run["graph_nodes_final"]
        else f"{count(run['graph_nodes_10'])} / {count(run['graph_nodes_final'])} nodes"
    )
    return {
        "early_ms": f"{run['early_ms_mean']:.2f}",
        "late_ms": f"{run['late_ms_mean']:.2f}",
        "time_ratio": f"{run['time_ratio']:.2f}",
        "steps": count(run["steps"]),
        "rss_1000": f"{run['rss_mb_at_1000']:.1f}",
        "rss_final": f"{run['rss_mb_final']:.1f}",
        "rss_growth": f"{run['rss_growth_mb']:+.1f}",
        "traces": run["traces"],
        "graph_10": count(run["graph_bytes_10"]),
        "graph_final": count(run["graph_bytes_final"]),
        "nodes": nodes,
        "checkpoint_10": count(run["checkpoint_bytes_10"]),
        "checkpoint_2000": count(run["checkpoint_bytes_2000"]),
    }


@span("steady-state-naive")
def steady_state_naive(results: Results) -> dict[str, Any]:
    run = _steady(results)
    per_step = (run["naive_ms_first10"], run["naive_ms_last10"])
    return {
        "steps": run["naive_steps"],
        "traces": run["naive_traces"],
        "fastest": f"{min(per_step):.0f}",
        "slowest": f"{max(per_step):.0f}",
        "times": f"{run['naive_ms_last10'] / run['late_ms_mean']:.0f}",
        "growth": f"{run['naive_rss_growth_mb'] / run['naive_steps']:+.1f}",
    }
