"""The numbers of the generated passages on Flower (templates in `passages/`, filled by
`benchmarks/readme_numbers.py`)."""

from __future__ import annotations

from typing import Any

from passages import (
    Results,
    block,
    claim,
)


@block("flower-example", refill=False)
def flower_example(results: Results) -> dict[str, Any]:
    """What ``examples/flower/run_simulation.py`` printed for the two committed audits."""
    folder = results.root / "flower"
    return {
        run: (folder / run / "printed.txt").read_text(encoding="utf-8").rstrip("\n")
        for run in ("none", "gaussian")
    }


@block("flower-steady-state", refill=False)
def flower_steady_state(results: Results) -> dict[str, Any]:
    run = results.csv("perf/flower_steady_state.csv").iloc[0]
    naive = results.csv("perf/flower_steady_state_naive.csv").iloc[0]
    claim(bool(run["pass_all"]), "the committed Flower steady-state run does not pass")
    values = {"last": int(run["rounds"])}
    for when in ("round_1", "round_10", "final"):
        values[f"rss_{when}"] = f"{run[f'rss_mb_{when}']:.1f}"
        values[f"naive_rss_{when}"] = f"{naive[f'rss_mb_{when}']:.1f}"
        values[f"naive_mod_{when}"] = naive[f"mod_traces_{when}"]
        for key in ("mod", "client"):
            values[f"{key}_{when}"] = run[f"{key}_traces_{when}"]
    values["growth"] = f"{run['rss_growth_mb']:+.1f}"
    values["naive_growth"] = f"{naive['rss_growth_mb']:+.1f}"
    return values
