"""The images the learned attack leaks where the default run's suite leaks none (its `holds` by
protocol 1; results/learned/README.md): for each such defense configuration of `defenses/`,
every leaked image's original, the learned reconstruction, and the label-only null (the public
split's mean image of the true label),
each reconstruction titled with its PSNR and LPIPS against the original.

Usage, from the repository root (after `bash results/learned/run.sh defenses`):

    python results/learned/leaks_figure.py  # defenses/figures/holds-leaks.png
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from leakbench.components.leakage import class_means  # noqa: E402
from leakbench.components.lpips import distance  # noqa: E402
from leakbench.datasets import load_dataset  # noqa: E402
from leakbench.outputs.arrays import load_cell, row_positions  # noqa: E402
from leakbench.outputs.naming import defense_label  # noqa: E402

HERE = Path(__file__).parent
RUN = HERE / "defenses"
DEFAULT = HERE.parent / "default"
OUT = RUN / "figures" / "holds-leaks.png"


def _holds() -> set[str]:
    """The defense configurations under which `results/default`'s suite leaked no image (its
    `holds` by protocol 1; the chain aside, protocol 2 finds them unconverged)."""
    board = pd.read_csv(DEFAULT / "leaderboard.csv")
    unleaked = board["suite_leaked"] == 0
    heads = board[board["strongest"].astype(bool) & unleaked & (board["defense"] != "none")]
    return {defense_label(d, p) for d, p in zip(heads["defense"], heads["defense_params"],
                                                strict=True)}  # fmt: skip


def _leaks(trials: pd.DataFrame, holds: set[str]) -> list[tuple[str, pd.DataFrame]]:
    """Per held defense configuration, the learned attack's leaked rows."""
    learned = trials[trials["attack"] == "learned"]
    out = []
    for (defense, params), rows in learned.groupby(["defense", "defense_params"], sort=False):
        label = defense_label(defense, params)
        leaked = rows[rows["leak_matched"] == 1]
        if label in holds and len(leaked):
            out.append((label, leaked))
    return out


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b) ** 2))
    return 10 * np.log10(1.0 / mse)


def main() -> None:
    trials = pd.read_csv(RUN / "trials.csv")
    digits = load_dataset("digits")
    means = class_means(digits, "test")
    groups = _leaks(trials, _holds())
    width = max(len(rows) for _, rows in groups)
    fig, axes = plt.subplots(3 * len(groups), width, figsize=(1.6 * width, 5.4 * len(groups)),
                             squeeze=False)  # fmt: skip
    for g, (label, rows) in enumerate(groups):
        cell = load_cell(RUN, rows.iloc[0])
        at = row_positions(cell, rows) if cell is not None else None
        if cell is None or at is None:
            raise SystemExit(f"{RUN}: no arrays for {label}; rerun `leakbench figures {RUN}`")
        for k in range(width):
            for r in range(3):
                axes[3 * g + r][k].axis("off")
            if k >= len(rows):
                continue
            row = rows.iloc[k]
            # The arrays hold uint8 levels (`leakbench.outputs.arrays`).
            original = cell.original[at[k]].astype(np.float32) / 255.0
            learned = cell.reconstruction[at[k]].astype(np.float32) / 255.0
            null = means[int(row["label"])].astype(np.float32)
            shown = [(original, f"image {int(row['image_index'])}"), (learned, "learned"),
                     (null, "class mean")]  # fmt: skip
            for r, (image, name) in enumerate(shown):
                ax = axes[3 * g + r][k]
                ax.imshow(np.clip(image[..., 0], 0, 1), cmap="gray", vmin=0, vmax=1)
                if r:
                    lpips = float(distance(original[None], image[None], "alex")[0])
                    name += f"\n{_psnr(original, image):.1f} dB, {lpips:.4f}"
                if r == 0 and k == 0:  # the row's first original names the defense
                    ax.set_title(f"{label}\n{name}", fontsize=7, loc="left")
                else:
                    ax.set_title(name, fontsize=7)
    fig.suptitle("learned leaks (protocol 2) where the suite leaks none:\noriginal, learned, "
                 "class mean (PSNR, LPIPS)", fontsize=9)  # fmt: skip
    fig.tight_layout(rect=(0, 0, 1, 0.985))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(OUT, dpi=120)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
