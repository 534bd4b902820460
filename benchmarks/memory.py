"""Peak memory and time of one trial against image size and batch, for the malicious server's
imprint and an honest attack (issue 45; the figures of `results/perf/memory.md`).

Each point is one `leakbench run` in a fresh process (`--workers 1`: the trial runs in that
process, so its peak resident memory is the run's), on a `folder:` dataset of real photos
(`benchmarks/photo_folder.py`: 224 x 224 crops, resized by the loader to each size), with one
trial (``images`` = the batch) and identification against the usual 999-image pool:

- ``imprint``: 128 bins (Robbing the Fed's ImageNet setting), model ``lenet`` (the block does not
  depend on the model behind it; the model's own training memory is a separate row);
- ``ig``: Inverting Gradients with 10 Adam steps (``suite = "listed"``, so the judge's doubled
  schedule runs too), model ``lenet``: memory is the steady state of its iterations, time
  grows with them.

It writes one row per point to ``--out`` (CSV) as it goes, so an interrupted sweep keeps what
it measured, and skips points already there. Made for the committed table by:

    PYTHONSAFEPATH=1 python benchmarks/photo_folder.py /tmp/photos224 --test 30
    PYTHONSAFEPATH=1 python benchmarks/memory.py --photos /tmp/photos224
    PYTHONSAFEPATH=1 python benchmarks/memory.py --photos /tmp/photos224 --attacks imprint \\
        --sizes 32,224 --batches 256
    PYTHONSAFEPATH=1 python benchmarks/memory.py --photos /tmp/photos224 --attacks imprint \\
        --model convnet --sizes 224 --batches 16,64

Each invocation's command is recorded in the folder's ``run.json``.
"""

from __future__ import annotations

import argparse
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from leakbench.core.environment import cli_executable, script_command, write_run_record

COLUMNS = (
    "attack", "model", "image_size", "batch", "bins", "iterations", "peak_rss_mb", "run_seconds",
    "attack_seconds", "exact", "leaked",
)  # fmt: skip


def config(attack: str, model: str, size: int, batch: int, photos: Path) -> str:
    """The TOML of one point."""
    head = (
        f'name = "memory-{attack}-{size}-b{batch}"\ndataset = "folder:{photos}"\n'
        f'model = "{model}"\nimage_size = [{size}, {size}]\nimages = {batch}\n'
        f"batch_size = {batch}\n"
    )
    if attack == "imprint":
        body = (
            '[threat_model]\nserver = "malicious"\nclients = 1\n\n'
            '[[attack]]\nname = "imprint"\nbins = 128\n'
        )
    else:
        body = 'suite = "listed"\n\n[[attack]]\nname = "ig"\niterations = 10\n'
    return head + body + '\n[[defense]]\nname = "none"\n\n[training]\nenabled = false\n'


def measure(attack: str, model: str, size: int, batch: int, photos: Path) -> dict:
    """Runs one point in a child process and returns its row."""
    with tempfile.TemporaryDirectory(prefix="leakbench-memory-") as tmp:
        path = Path(tmp) / "point.toml"
        path.write_text(config(attack, model, size, batch, photos))
        command = [cli_executable(), "run", str(path), "--out", f"{tmp}/out", "--quiet"]
        command += ["--workers", "1"]
        start = time.perf_counter()
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
        error = child.stderr.read().decode() if child.stderr else ""
        if status != 0:
            sys.exit(f"{attack} {size} b{batch} failed:\n{error[-2000:]}")
        trials = pd.read_csv(f"{tmp}/out/trials.csv")
    return {
        "attack": attack,
        "model": model,
        "image_size": size,
        "batch": batch,
        "bins": 128 if attack == "imprint" else "",
        "iterations": "" if attack == "imprint" else 10,
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "run_seconds": round(seconds, 1),
        "attack_seconds": round(float(trials["seconds"].iloc[0]), 1),
        "exact": int((trials["mse"] <= 1e-3).sum()),
        "leaked": int((trials["leaked"] == 1).sum()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--photos", type=Path, required=True, help="benchmarks/photo_folder.py's")
    parser.add_argument("--out", type=Path, default=Path("results/perf/memory/memory.csv"))
    parser.add_argument("--sizes", default="32,64,128,224")
    parser.add_argument("--batches", default="1,16,64")
    parser.add_argument("--attacks", default="imprint,ig")
    parser.add_argument("--model", default="lenet")
    args = parser.parse_args()
    done = set()
    if args.out.is_file():
        old = pd.read_csv(args.out)
        done = {
            (a, m, s, b) for a, m, s, b in old[["attack", "model", "image_size", "batch"]].values
        }
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("w", newline="") as file:
            csv.writer(file).writerow(COLUMNS)
    for attack in args.attacks.split(","):
        for size in (int(s) for s in args.sizes.split(",")):
            for batch in (int(b) for b in args.batches.split(",")):
                if (attack, args.model, size, batch) in done:
                    continue
                row = measure(attack, args.model, size, batch, args.photos.resolve())
                with args.out.open("a", newline="") as file:
                    csv.writer(file).writerow([row[c] for c in COLUMNS])
                print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    sweep = (
        f"{args.out.name}: {args.attacks}, {args.model}, sizes {args.sizes}, batches {args.batches}"
    )
    write_run_record(args.out.parent, sweep, script_command(__file__))


if __name__ == "__main__":
    main()
