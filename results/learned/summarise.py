"""Tables of results/learned from its run directories, printed as markdown (README.md's tables).

Reads the run directories that `run.sh` writes here, results/default (the standard suite on the
same 36 digits images, for the comparison) and each run's inverter records and `time -v` log.
Usage, from the repository root:

    python results/learned/summarise.py > results/learned/summary.md
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from leakbench.components.leakage import exact_interval
from leakbench.outputs.naming import attack_label, defense_label

HERE = Path(__file__).parent
DEFAULT = HERE.parent / "default"


def _leaked_images(run: Path, attack: str | None = None) -> pd.DataFrame:
    """Per (defense configuration, image): whether any attack (or ``attack``) leaked it."""
    trials = pd.read_csv(run / "trials.csv")
    if attack is not None:
        trials = trials[trials["attack"] == attack]
    pairs = zip(trials["defense"], trials["defense_params"], strict=True)
    trials = trials.assign(setting=[defense_label(d, p) for d, p in pairs])
    return trials.groupby(["setting", "image_index"])["leak_matched"].max().astype(bool)


def _share(count: int, n: int) -> str:
    low, high = exact_interval(count, n)
    return f"{count}/{n} ({100 * low:.1f}-{100 * high:.1f}%)"


def _cost(run: Path) -> tuple[str, str, str]:
    """Pair and training seconds of the run's inverters (median over them) and the run's wall
    time and peak memory from its `time -v` log."""
    records = [json.loads(p.read_text()) for p in sorted((run / "inverters").glob("*.json"))]
    pairs = pd.Series([r["pair_seconds"] for r in records]).median() if records else float("nan")
    fit = pd.Series([r["fit_seconds"] for r in records]).median() if records else float("nan")
    path = run.parent / f"{run.name}.time.txt"
    log = path.read_text() if path.is_file() else ""
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", log)
    peak = re.search(r"Maximum resident set size \(kbytes\): (\d+)", log)
    memory = f"{int(peak.group(1)) / 2**20:.2f} GiB" if peak else "?"
    return (
        f"{pairs:.0f} s / {fit:.0f} s ({len(records)} inverters)",
        wall.group(1) if wall else "?",
        memory,
    )


def defenses_table() -> str:
    """The learned attack against each default defense setting, beside the suite."""
    learned = _leaked_images(HERE / "defenses")
    suite = _leaked_images(DEFAULT)
    board = pd.read_csv(DEFAULT / "leaderboard.csv")
    heads = board[board["strongest"]]
    rows = zip(heads["defense"], heads["defense_params"], heads["verdict"], strict=True)
    verdicts = {defense_label(d, p): v for d, p, v in rows}
    lines = ["| defense | suite (protocol 2) | suite verdict | learned | suite or learned |",
             "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for setting in learned.index.get_level_values(0).unique():
        ours, theirs = learned[setting], suite[setting]
        both = ours | theirs.reindex(ours.index, fill_value=False)
        lines.append(f"| {setting} | {_share(int(theirs.sum()), len(theirs))} | "
                     f"{verdicts.get(setting, '?')} | {_share(int(ours.sum()), len(ours))} | "
                     f"{_share(int(both.sum()), len(both))} |")  # fmt: skip
    return "\n".join(lines)


def attacks_table(runs: list[str]) -> str:
    """Each attack of each run: leaked share, exact recoveries, median PSNR and iterations."""
    lines = ["| run | attack | leaked (95% CI) | recovered | median PSNR | label accuracy | "
             "median iterations |", "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for name in runs:
        run = HERE / name
        if not (run / "trials.csv").is_file():
            continue
        trials = pd.read_csv(run / "trials.csv")
        for (attack, params), rows in trials.groupby(["attack", "attack_params"], sort=False):
            leaked = int(rows["leak_matched"].sum())
            lines.append(
                f"| {name} | {attack_label(attack, params)} | {_share(leaked, len(rows))} | "
                f"{int((rows['mse'] <= 1e-3).sum())} | {rows['psnr'].median():.1f} dB | "
                f"{rows['label_acc'].mean():.2f} | {rows['iterations_used'].median():.0f} |"
            )
    return "\n".join(lines)


def cost_table(runs: list[str]) -> str:
    lines = ["| run | pairs / training per inverter (median) | wall (whole run) | peak memory |",
             "| --- | --- | --- | --- |"]  # fmt: skip
    for name in runs:
        if (HERE / name / "inverters").is_dir():
            pairs, wall, memory = _cost(HERE / name)
            lines.append(f"| {name} | {pairs} | {wall} | {memory} |")
    return "\n".join(lines)


def main() -> None:
    runs = ["scramble", "none-digits", "none-mnist", "none-cifar10", "none-cifar10-pairs7500",
            "convnet-cifar10", "convnet-cifar10-pairs7500",
            "convnet-cifar10-pairs7500-sketch16384", "user-cnn-b1", "user-cnn-b4",
            "defenses"]  # fmt: skip
    print("## Against the default run's defenses\n")
    print(defenses_table())
    print("\n## Every attack of every run\n")
    print(attacks_table(runs))
    print("\n## Cost\n")
    print(cost_table(runs))


if __name__ == "__main__":
    main()
