"""The numbers of the generated passages on ig against the PyTorch implementation of the reference
(templates in `passages/`, filled by `benchmarks/readme_numbers.py`)."""

from __future__ import annotations

from typing import Any

from passages import (
    Results,
    claim,
    span,
)

from leakbench.components.metrics import mean_ci95


@span("ig-reference")
def ig_reference(results: Results) -> dict[str, Any]:
    table = results.csv("ig_reference/per_image.csv")
    ours, theirs = (mean_ci95(table[f"psnr_{side}"].to_numpy()) for side in ("leakbench", "torch"))
    paired = mean_ci95((table["psnr_leakbench"] - table["psnr_torch"]).to_numpy())
    previous = mean_ci95(table["psnr_previous_defaults"].to_numpy())
    claim(ours[0] >= theirs[0] - theirs[1], "leakbench's ig is weaker than the PyTorch interval")
    claim(previous[0] < ours[0], "the previous defaults are no longer weaker")
    values = {}
    for name, (mean, half_width, _) in (
        ("ours", ours),
        ("torch", theirs),
        ("paired", paired),
        ("previous", previous),
    ):
        values[name], values[f"{name}_ci"] = f"{mean:.2f}", f"{half_width:.2f}"
    return values
