"""DP-SGD's test accuracy on the embedded digits under the old recipe and under the DP recipe.

The old recipe is what every defense trained with before engine version 4: Adam at 1e-3,
batches of 32, 30 epochs, no search. The DP recipe is plain SGD with batches of 128 and a
learning-rate search on the validation split (`leakbench.client.training.DPRecipe`), once as the
default run configures it (10 epochs, as many as every other defense, rates 4 and 8) and once
with the recipe's defaults (30 epochs, rates 2, 4 and 8); each search goes on past a winning
edge of its grid (engine 9, `leakbench.client.selection.beyond_edge`). Every model is trained
by the runner's own unit (`leakbench.run.execute.train_one`) on the training split less its
validation split, with 3 seeds (replicates of run seed 0), under the default run's two DP-SGD
configurations.

    PYTHONSAFEPATH=1 python benchmarks/dp_recipe.py --out results/dp_recipe

writes ``dp_recipe.csv`` (one row per trained model, ``compared`` naming the recipe compared, then
the columns of ``utility.csv`` and the wall time) and ``summary.csv`` (per recipe compared and
configuration: the mean test accuracy over the seeds and its 95% Student-t half-width, the rates
chosen, the epsilon of the chosen model's training and that of the whole learning-rate search).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from leakbench.components.metrics import mean_ci95
from leakbench.core.environment import script_command, write_run_record
from leakbench.datasets import load_dataset
from leakbench.run.config import parse_config
from leakbench.run.execute import train_one
from leakbench.run.plan import plan_training

RECIPES = {
    "old (adam 1e-3, batch 32, 30 epochs)": """
[training]
epochs = 30
batch_size = 32
optimizer = "adam"
learning_rates = [1e-3]
[training.dp]
enabled = false
""",
    "dp, default run (sgd, batch 128, 10 epochs, rates 4, 8)": """
[training]
epochs = 10
learning_rates = [1e-2, 3e-2]
[training.dp]
batch_size = 128
optimizer = "sgd"
learning_rates = [4.0, 8.0]
""",
    "dp, defaults (sgd, batch 128, 30 epochs, rates 2, 4, 8)": """
[training.dp]
""",
}

RUN = """
name = "dp-recipe"
dataset = "digits"
images = 1
seeds = [0]
[[attack]]
name = "idlg"
[[defense]]
name = "dpsgd"
norm = 1.0
noise_multiplier = [0.5, 1.0]
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the two CSVs")
    parser.add_argument("--seeds", type=int, default=3, help="replicates per configuration")
    args = parser.parse_args()
    data = load_dataset("digits")
    rows = []
    for label, table in RECIPES.items():
        spec = parse_config(_with_seeds(RUN + table, args.seeds))
        for job in plan_training(spec):
            start = time.perf_counter()
            (row,) = train_one(spec.model, data, job)
            rows.append({"compared": label, **row, "seconds": time.perf_counter() - start})
            print(label, row["defense_params"], row["replicate"], row["learning_rate"],
                  f"{row['test_accuracy']:.3f}", flush=True)  # fmt: skip
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "dp_recipe.csv", index=False)
    summary = [
        {
            "compared": label,
            "defense_params": params,
            "models": len(group),
            "test_accuracy": mean_ci95(group["test_accuracy"].to_numpy(float))[0],
            "test_accuracy_ci95": mean_ci95(group["test_accuracy"].to_numpy(float))[1],
            "learning_rates_chosen": " ".join(str(v) for v in group["learning_rate"]),
            "epsilon": group["epsilon"].max(),
            "epsilon_search": group["epsilon_search"].max(),
        }
        for (label, params), group in frame.groupby(["compared", "defense_params"], sort=False)
    ]
    pd.DataFrame(summary).to_csv(args.out / "summary.csv", index=False)
    # What made these rows, the engine version included (tests/test_committed_results.py).
    write_run_record(
        args.out,
        "dp_recipe.csv, summary.csv",
        script_command(__file__),
    )
    print(pd.DataFrame(summary).to_string(index=False))


def _with_seeds(text: str, seeds: int) -> str:
    """``text`` with ``[training] seeds`` set (a [training] table added when it has none)."""
    if "[training]\n" in text:
        return text.replace("[training]\n", f"[training]\nseeds = {seeds}\n", 1)
    return text.replace("[training.dp]\n", f"[training]\nseeds = {seeds}\n[training.dp]\n", 1)


if __name__ == "__main__":
    main()
