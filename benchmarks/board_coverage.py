"""Runs the board's coverage cells (benchmarks/board/*.toml) and records what each one cost.

Each cell is one `leakbench run` into ``results/board/<cell>/``; a cell that was stopped resumes
where it stopped when it is run again (the run directory's store). Every invocation appends a
row to ``results/board/cost.csv``: the cell, when it started, its wall time, the CPU time of the
run and its workers (user + system, from the operating system's accounting of child
processes), its exit status and the machine's CPU model (a cell resumed on another machine
names each in its own row). A cell's cost is the sum of its rows.

    python benchmarks/board_coverage.py                    # every cell, in the order of ORDER
    python benchmarks/board_coverage.py mnist-lenet-init   # one cell
    python benchmarks/board_coverage.py CELL -- --shard 1/4  # the rest goes to leakbench run
    python benchmarks/board_coverage.py mnist-lenet-trained --trainings-from mnist-lenet-init

A utility training's store key holds everything that sets its numbers (data, model, seed,
defense, recipe) and not the attacked model's state, so a trained cell's trainings are those of
its initialisation cell: ``--trainings-from`` copies them into the cell's store before it runs
(their rows renamed to the cell's run), instead of training them again.

Run it from the project root, where ``../shared/data`` holds MNIST, CIFAR-10 and LFW. Then
rebuild the board (docs/board/submit.md). Stop a cell with ``kill -TERM`` on the driver (it
passes the signal on and writes the cost row). A cell that spans sessions commits its
``store.sqlite`` (the driver folds the journal into it) and ``partial/`` (the checkpoint of the
trial group in flight), with a .gitignore exception for the store, and resumes from them.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import os
import platform
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

from leakbench.core.environment import (
    cli_executable,
    describe_cpu,
    script_command,
    write_run_record,
)
from leakbench.core.versions import ENGINE_VERSION
from leakbench.run.config import load_config
from leakbench.run.store import Store

CELLS = Path("benchmarks/board")
OUT = Path("results/board")
# The cells in the order they are run: the cheap ones first (estimates in results/board/README.md).
ORDER = [
    "mnist-lenet-init",
    "mnist-lenet-trained",
    "mnist-lenet-mixup",
    "mnist-lenet-malicious",
    "lfw-lenet-malicious",
    "cifar10-resnet18-malicious",
    "cifar10-lenet-init",
    "cifar10-lenet-trained",
    "cifar10-convnet-init",
    "lfw-lenet-init",
    "cifar10-resnet18-init",
]
# A row's ``engine`` is the engine version that ran it: a cell rerun under a newer engine
# starts afresh, and its cost is the sum of its rows of the engine its run directory records.
COST_COLUMNS = [
    "cell", "started", "wall_s", "cpu_s", "returncode", "extra", "cpus", "machine", "engine",
]  # fmt: skip


def child_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def call(command: list[str]) -> int:
    """Runs ``command`` and returns its exit status. A SIGTERM or SIGHUP sent to the driver (a
    ``kill``, a closed terminal, a machine shutting down) is passed on to the run, which stops and
    resumes later from its store, and the driver goes on to write the cost row; a Ctrl-C reaches
    the run from the terminal itself and counts as exit 130."""
    started: list[subprocess.Popen[bytes]] = []
    stop: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        stop.append(signum)
        if started:
            started[0].send_signal(signum)

    kept = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        child = subprocess.Popen(command)
        started.append(child)
        if stop:  # a signal came between the fork and here
            child.send_signal(stop[0])
        try:
            return child.wait()
        except KeyboardInterrupt:  # stopped by hand: the run resumes later, its cost counts
            child.wait()
            return 130
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)


def fold_journal(store: Path) -> None:
    """Folds a stopped run's write-ahead journal (``store.sqlite-wal``) into its store, so that
    the store file alone holds every finished trial: a cell that takes several sessions commits
    it (.gitignore) and the next machine resumes from it. Closing the last connection does it."""
    if store.is_file():
        Store(store).close()


def run_cell(cell: str, extra: list[str], copied_from: str | None = None) -> int:
    """Runs one cell with ``leakbench run`` and appends its cost row; its exit status. The row's
    ``extra`` names ``copied_from``, the cell whose trainings it took (and whose row holds their
    cost), before the arguments passed on."""
    config = CELLS / f"{cell}.toml"
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    wall, cpu = time.perf_counter(), child_cpu()
    command = [cli_executable(), "run", str(config), "--out", str(OUT / cell), *extra]
    print(" ".join(command), flush=True)
    code = call(command)
    fold_journal(OUT / cell / "store.sqlite")
    row = {
        "cell": cell,
        "started": started,
        "wall_s": round(time.perf_counter() - wall, 1),
        "cpu_s": round(child_cpu() - cpu, 1),
        "returncode": code,
        "extra": " ".join([*(["--trainings-from", copied_from] if copied_from else []), *extra]),
        "cpus": os.cpu_count(),
        "machine": describe_cpu()["cpu"] or platform.machine(),
        "engine": ENGINE_VERSION,
    }
    cost = OUT / "cost.csv"
    OUT.mkdir(parents=True, exist_ok=True)
    fresh = not cost.exists()
    with cost.open("a", newline="") as handle:
        writer = csv.DictWriter(handle, COST_COLUMNS, lineterminator="\n")
        if fresh:
            writer.writeheader()
        writer.writerow(row)
    write_run_record(OUT, "cost.csv", script_command(__file__))
    print(f"{cell}: {row['wall_s']} s wall, {row['cpu_s']} s CPU, exit {code}", flush=True)
    return code


def copy_trainings(source: str, cell: str) -> int:
    """Copies the utility trainings of ``source``'s store that ``cell``'s store lacks, their
    ``run`` column renamed to ``cell``'s run; how many it copied. Keys the cell never plans are
    ignored by its run (it reads its rows by its own keys)."""
    path = OUT / source / "store.sqlite"
    if not path.is_file():
        raise FileNotFoundError(f"--trainings-from: {path} does not exist (run {source} first)")
    name = load_config(CELLS / f"{cell}.toml").name
    theirs = Store(path, readonly=True)
    (OUT / cell).mkdir(parents=True, exist_ok=True)
    mine = Store(OUT / cell / "store.sqlite")
    try:
        have = mine.keys("utility")
        keys = sorted(theirs.keys("utility") - have)
        items = [
            (key, [{**row, "run": name} for row in theirs.rows([key], "utility")]) for key in keys
        ]
        mine.add_many(items, "utility")
    finally:
        mine.close()
        theirs.close()
    return len(items)


def main(argv: list[str]) -> int:
    known = ORDER + sorted({p.stem for p in CELLS.glob("*.toml")} - set(ORDER))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cells", nargs="*", help=f"cells to run (default: all of {known})")
    parser.add_argument(
        "--trainings-from",
        metavar="CELL",
        choices=known,
        help="copy this cell's stored utility trainings into each cell's store first",
    )
    own, extra = _split(argv)
    args = parser.parse_args(own)
    unknown = [c for c in args.cells if c not in known]
    if unknown:
        print(f"cells: {unknown[0]} is not one of {', '.join(known)}", file=sys.stderr)
        return 2
    worst = 0
    for cell in args.cells or known:
        if args.trainings_from:
            try:
                copied = copy_trainings(args.trainings_from, cell)
            except FileNotFoundError as err:
                print(err, file=sys.stderr)
                return 2
            print(f"{cell}: {copied} utility trainings copied from {args.trainings_from}")
        code = run_cell(cell, extra, args.trainings_from)
        if code == 130:
            return code
        worst = max(worst, code)
    return worst


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """The driver's own arguments and those after ``--`` (passed to ``leakbench run``)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return argv, []


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
