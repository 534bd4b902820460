"""The calibration behind `leakbench.components.leakage`'s ``recognisable`` threshold: committed
reconstructions of several attacks and defenses, shown with their scores, to be read by eye.

From the committed run directories named below it takes every scored image (the 8-bit
original and reconstruction of ``arrays/``, the PSNR and LPIPS of ``trials.csv``), draws a
seeded sample stratified by PSNR (``--per-bin`` images in each bin of `BINS`), and writes under
``--out``:

- ``sample.csv``: one row per drawn image (run, cell, seed, batch, position, attack, defense,
  PSNR, LPIPS) with an empty ``reading`` column, to be filled by a person looking at the sheet
  (``yes``: a person who knew the original would say it is this image; ``no``);
- ``sheet-<dataset>.png``: the drawn pairs (original above, reconstruction below) in PSNR
  order, each captioned with its row number, PSNR and LPIPS.

``--readings FILE`` reads a filled-in ``sample.csv`` back and prints, for each threshold on
PSNR and on LPIPS, how many images read as recognisable fall on each side:

    PYTHONSAFEPATH=1 python benchmarks/recognisable_calibration.py --out results/calibration
    PYTHONSAFEPATH=1 python benchmarks/recognisable_calibration.py --out results/calibration \\
        --readings results/calibration/readings.csv
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from leakbench.components.leakage import (  # noqa: E402
    RECOGNISABLE_LPIPS,
    RECOGNISABLE_PSNR,
    distractor_pool,
    recognisable,
)
from leakbench.core.environment import script_command, write_run_record  # noqa: E402
from leakbench.core.errors import LeakbenchError  # noqa: E402
from leakbench.datasets import load_dataset  # noqa: E402
from leakbench.run.config import load_record  # noqa: E402
from leakbench.run.identification import identified_cells  # noqa: E402

RUNS = (
    "results/default",
    "results/cifar10",
    "results/cited_defenses/soteria_precode",
    "results/cited_defenses/mixup",
    "results/paper/table1-mnist",
    "results/paper/table1-lfw",
    "results/paper/section5-noise",
    "results/paper/ig-table1-lenet",
    "results/convergence/cifar10-defaults",
)
BINS = (0.0, 10.0, 14.0, 17.0, 20.0, 23.0, 27.0, 35.0, 101.0)
DATASET_NAMES = {"digits": "digits", "mnist": "mnist", "cifar10": "cifar10", "lfw": "lfw"}


def dataset_kind(name: str) -> str:
    """A short name for a dataset spec (``npz:../cifar10/cifar10-test.npz`` -> ``cifar10``)."""
    for key in DATASET_NAMES:
        if key in name.lower():
            return key
    return name


def collect(runs: tuple[str, ...]) -> tuple[pd.DataFrame, dict[int, tuple[np.ndarray, ...]]]:
    """Every image row of the runs that kept arrays, its identification flag against the
    run's distractor pool (`leakbench.components.leakage`), and its (original, reconstruction)."""
    rows, images = [], {}
    for run in runs:
        trials_path = Path(run) / "trials.csv"
        if not trials_path.is_file():
            continue
        trials = pd.read_csv(trials_path)
        spec = load_record(Path(run) / "config.toml")
        try:
            dataset = load_dataset(spec.dataset, spec.image_size)
        except LeakbenchError as err:
            print(f"{run}: skipped ({err})", file=sys.stderr)
            continue
        pool = distractor_pool(dataset, spec.threat_model.private_split)
        for group, cell, at, flags in identified_cells(trials, run, pool, spec.lpips):
            for k, (_, row) in enumerate(group.iterrows()):
                i = at[k]
                images[len(rows)] = (cell.original[i], cell.reconstruction[i])
                rows.append(
                    {
                        "run": run,
                        "dataset": dataset_kind(str(row["dataset"])),
                        "attack": row["attack"],
                        "attack_params": row["attack_params"],
                        "defense": row["defense"],
                        "defense_params": row["defense_params"],
                        "seed": int(row["seed"]),
                        "batch_index": int(row["batch_index"]),
                        "position": int(row["position"]),
                        "psnr": float(row["psnr"]),
                        "lpips": float(row["lpips"]),
                        "identified": bool(flags[k]),
                        "distractors": len(pool),
                    }
                )
    return pd.DataFrame(rows), images


def draw_sample(frame: pd.DataFrame, per_bin: int, seed: int) -> pd.DataFrame:
    """``per_bin`` rows per (dataset, PSNR bin), seeded, in PSNR order within each dataset."""
    rng = np.random.default_rng(seed)
    frame = frame.assign(bin=pd.cut(frame["psnr"], BINS, right=False, labels=False))
    picked = []
    for _, group in frame.groupby(["dataset", "bin"], sort=True):
        take = min(per_bin, len(group))
        picked.extend(rng.choice(group.index.to_numpy(), take, replace=False).tolist())
    sample = frame.loc[picked].sort_values(["dataset", "psnr"], kind="mergesort")
    return sample.drop(columns="bin")


def draw_sheet(sample: pd.DataFrame, images: dict, path: Path) -> None:
    """Originals above their reconstructions, ten pairs a row, captioned."""
    per_row = 10
    rows = -(-len(sample) // per_row)
    fig, axes = plt.subplots(2 * rows, per_row, figsize=(per_row * 1.3, rows * 2.9))
    axes = np.atleast_2d(axes)
    for ax in axes.ravel():
        ax.axis("off")
    for k, (index, row) in enumerate(sample.iterrows()):
        original, reconstruction = images[index]
        r, c = divmod(k, per_row)
        for ax, image in ((axes[2 * r, c], original), (axes[2 * r + 1, c], reconstruction)):
            ax.imshow(
                image.squeeze(),
                cmap="gray" if image.shape[-1] == 1 else None,
                vmin=0,
                vmax=255,
                interpolation="nearest",
            )
        axes[2 * r, c].set_title(f"#{row['row']}", fontsize=7)
        axes[2 * r + 1, c].set_title(f"{row['psnr']:.1f} dB {row['lpips']:.3f}", fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summarise(readings: pd.DataFrame) -> str:
    """For each threshold, the images read as recognisable (yes) and not (no) on each side."""
    lines = []
    yes = readings["reading"].str.strip().str.lower() == "yes"
    rule = recognisable(readings["lpips"], readings["psnr"])
    either = rule | readings["identified"].astype(bool)
    lines.append(
        f"the rule (PSNR >= {RECOGNISABLE_PSNR:g} dB or LPIPS <= {RECOGNISABLE_LPIPS:g}): "
        f"yes {int((rule & yes).sum())}/{int(yes.sum())}, no {int((rule & ~yes).sum())}/"
        f"{int((~yes).sum())}; recognisable or identified: yes {int((either & yes).sum())}/"
        f"{int(yes.sum())}, no {int((either & ~yes).sum())}/{int((~yes).sum())}"
    )
    for dataset, group in readings.groupby("dataset"):
        g_yes = yes.loc[group.index]
        lines.append(f"{dataset}: {int(g_yes.sum())} of {len(group)} read as recognisable")
        for threshold in (14.0, 16.0, 18.0, 20.0, 22.0, 25.0):
            above = group["psnr"] >= threshold
            lines.append(
                f"  PSNR >= {threshold:4.1f}: yes {int((above & g_yes).sum())}/{int(g_yes.sum())}"
                f", no {int((above & ~g_yes).sum())}/{int((~g_yes).sum())}"
            )
        ident = group["identified"].astype(bool)
        lines.append(
            f"  identified: yes {int((ident & g_yes).sum())}/{int(g_yes.sum())}, "
            f"no {int((ident & ~g_yes).sum())}/{int((~g_yes).sum())}"
        )
        for threshold in (0.02, 0.05, 0.08, 0.1, 0.15):
            below = group["lpips"] <= threshold
            lines.append(
                f"  LPIPS <= {threshold:4.2f}: yes {int((below & g_yes).sum())}/"
                f"{int(g_yes.sum())}, no {int((below & ~g_yes).sum())}/{int((~g_yes).sum())}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/calibration"))
    parser.add_argument("--per-bin", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--readings", type=Path, help="a filled-in sample.csv to summarise")
    args = parser.parse_args(argv)
    if args.readings is not None:
        readings = pd.read_csv(args.readings)
        text = summarise(readings)
        print(text)
        (args.out / "summary.txt").write_text(text + "\n", encoding="utf-8")
        write_run_record(args.out, "summary.txt", script_command("recognisable_calibration.py"))
        return 0
    frame, images = collect(RUNS)
    if frame.empty:
        print("no committed arrays found; run from the repository root", file=sys.stderr)
        return 2
    sample = draw_sample(frame, args.per_bin, args.seed)
    sample.insert(0, "row", range(1, len(sample) + 1))
    sample["reading"] = ""
    args.out.mkdir(parents=True, exist_ok=True)
    for dataset, group in sample.groupby("dataset"):
        draw_sheet(group, images, args.out / f"sheet-{dataset}.png")
    sample.to_csv(args.out / "sample.csv", index=False)
    counts = json.dumps(sample.groupby("dataset").size().to_dict())
    print(f"{len(sample)} images drawn from {len(frame)} ({counts}); sheets in {args.out}")
    write_run_record(
        args.out, "sample.csv, sheet-*.png", script_command("recognisable_calibration.py")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
