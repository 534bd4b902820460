"""The numbers of the generated passages on the batch-size sweep (templates in `passages/`, filled
by `benchmarks/readme_numbers.py`)."""

from __future__ import annotations

from typing import Any

from passages import (
    Results,
    acc,
    block,
    claim,
    span,
    table_row,
)


@block("batch-size-labels", refill=False)
def batch_size_labels(results: Results) -> dict[str, Any]:
    labels = results.csv("batch_size/batch_size_labels.csv")
    cells = []
    for _, row in labels.iterrows():
        text = acc(row["label_acc"])
        if row["label_acc_ci95"] > 0:
            text += f" +- {100 * row['label_acc_ci95']:.1f}"
        cells.append(text)
    sizes = [str(size) for size in labels["batch_size"]]
    return {
        "sizes": " | ".join(sizes),
        "rule": table_row(["---"] * (len(sizes) + 1)),
        "accuracies": " | ".join(cells),
    }


@span("batch-size-labels-largest")
def batch_size_labels_largest(results: Results) -> dict[str, Any]:
    labels = results.csv("batch_size/batch_size_labels.csv")
    largest = labels.loc[labels["batch_size"].idxmax()]
    size, share = int(largest["batch_size"]), acc(largest["label_acc"])
    return {"size": size, "share": share}


@span("batch-size-images")
def batch_size_images(results: Results) -> dict[str, Any]:
    curve = results.csv("batch_size/batch_size.csv").set_index("batch_size")
    claim((curve["success_rate"] == 0).all(), "`ig` recovers an image at some batch size")
    sizes = curve.index
    return {
        "low": f"{curve['psnr_mean'].min():.1f}",
        "high": f"{curve['psnr_mean'].max():.1f}",
        "smallest": sizes.min(),
        "largest": sizes.max(),
        "at_1": f"{curve.loc[1, 'psnr_mean']:.1f}",
        "at_8": f"{curve.loc[8, 'psnr_mean']:.1f}",
        "at_64": f"{curve.loc[64, 'psnr_mean']:.1f}",
        "labels_low": f"{100 * curve['label_acc'].min():.1f}",
        "labels_high": acc(curve["label_acc"].max()),
    }
