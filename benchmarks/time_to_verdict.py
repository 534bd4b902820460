"""Time to a verdict (issue 66): what a user waits for, side by side in one invocation.

Five cases. ``cli``: ``leakbench --help``, ``leakbench list`` and a config with an unknown defense,
each the best wall time of three fresh processes (answered before TensorFlow loads). The other
four each run in a child process whose wall time, CPU time (user + system) and peak resident
memory are measured (the resource usage of the child and its descendants, such as the run's
worker processes, as `resource.getrusage(RUSAGE_CHILDREN)` adds them up, read per child with
``os.wait4``; the peak is that of the largest single process):

* ``default``: the built-in benchmark, ``python -m leakbench.cli run --out DIR --quiet`` (its
  ``--workers auto``: 2 worker processes on a 2-core machine);
* ``cifar8``: the standard suite on 8 CIFAR-10 test images (``../shared/data/cifar10``; skipped
  with the reason printed when absent), LeNet at initialisation, the defenses ``none`` and
  ``prune`` (``ratio = 0.5``), utility training off (`CIFAR8_CONFIG`: a verdict rests on the
  attacks; the library's default ``[training]``, 30 epochs x 3 rates x 3 seeds on 7,500
  images, would add about a quarter of an hour of trainings at the step times of
  ``results/cifar10``, and the default run measures trainings already);
* ``dlg256``: DLG at the paper's budget on 256 MNIST test images, leakbench (256 in flight)
  against the PyTorch reference, by ``benchmarks/attack_speed.py`` (``--torch-images 256
  --paper-widths 256``); the leakbench side only when PyTorch is not importable;
* ``roofline``: the attack loop's achieved GFLOP/s at N = 1, 32 and 256 trials in flight (the
  300-iteration DLG throughput rows of ``attack_speed.py``, MNIST and, when present, CIFAR-10)
  against the dense-matmul peak that script measures in the same process.

Where the time goes. A run directory records the seconds of two stages: ``trials.csv`` each
trial's attack time (its wall share of the compiled group it ran in, escalations included) and
``utility.csv`` each training's ``seconds_per_step`` of the kept learning rate, first (tracing)
step excluded; the table sums them per attack family and per training recipe (times the rates
searched, an estimate that leaves out tracing and evaluation). With several worker processes
these sums can exceed the wall time. Nothing records the judge, escalation alone, scoring,
LPIPS or identification, so ``--profile`` runs the default run once more in one process
(``--workers 1``) under ``python -m cProfile`` and gives each stage the cumulative time of
these functions (`STAGES`; a caller in brackets: only the calls from it; cProfile follows the
main thread, which waits while the attack lanes' threads compute):

=====================================  =================================================
stage                                  functions (module: function)
=====================================  =================================================
startup (TensorFlow import)            core/environment.py: import_tensorflow_quietly
trainings                              run/execute.py: train_one
  DP-SGD steps                         client/training.py: sampled_step (Poisson batches)
attacks, first pass (every family)     attacks/base.py: attack_many [run/execute.py:
                                       attack_group]
judge                                  run/judge.py: settle, less its escalations and its
                                       leak checks' scoring (components/metrics.py:
                                       score_batch [run/judge.py: leaked])
  losses at the truth and the result   run/judge.py: losses_at
escalation                             attacks/base.py: attack_many [run/judge.py: settle]
scoring (MSE, PSNR, SSIM, LPIPS)       components/metrics.py: score_batch
  SSIM                                 components/metrics.py: ssim
  LPIPS                                components/lpips.py: distance
identification                         run/identification.py: add_flags
  LPIPS embeddings                     components/lpips.py: embed
LPIPS, all (overlaps the two above)    components/lpips.py: distance and embed
export, figures and report             run/rundir.py: export_tables and cli.py:
                                       _write_run_report, less identification
other                                  the rest: imports, dataset, planning, the store
=====================================  =================================================

Prints the machine (CPU model, cores, load average at the start and the end; the timings mean
something only on an idle machine, and a 1-minute load above 0.5 at the start is warned about),
each case's measurements and the stage tables. Writes ``--out`` (default
``results/perf/time_to_verdict.csv``, one measurement a row) atomically and a run record beside
it; exits 2 on a usage error, 1 when a case failed.

Run from the repository root. On the 2-core machine today that is about an hour or more: the
default run about 5 minutes (10 more with ``--profile``), the CIFAR-10 run over half an hour
(issue 66: it did not finish in 30 minutes on a shared machine), the PyTorch reference about
20 minutes, leakbench's DLG and the roofline a few. ``--quick``, a tiny smoke configuration of
every case (2 images, width 1, one short training), takes a few minutes::

    python benchmarks/time_to_verdict.py --profile
    python benchmarks/time_to_verdict.py --cases default --keep runs/ttv   # keep the run folders
    python benchmarks/time_to_verdict.py --quick --cases default --out /tmp/ttv.csv
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime
import importlib.metadata
import importlib.util
import json
import math
import os
import pstats
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from leakbench.core.environment import (
    describe_cpu,
    import_tensorflow_quietly,
    script_command,
    write_run_record,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_outputs import write_rows  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ATTACK_SPEED = REPO / "benchmarks" / "attack_speed.py"
CASES = ("cli", "default", "cifar8", "dlg256", "roofline")
# What issue 66 asks of each case (printed beside the measurements).
TARGETS = {
    "cli": "each <= 2 s (--help, list, a bad config)",
    "default": "<= 3 min wall, idle machine",
    "cifar8": "<= 10 min wall, idle machine",
    "dlg256": ">= x25 the PyTorch reference",
    "roofline": "N = 256: >= 2x today's GFLOP/s",
}
IDLE_LOAD = 0.5
ROOFLINE_WIDTHS = (1, 32, 256)
DLG_IMAGES = 256
CIFAR8_CONFIG = """\
# The 8-image CIFAR-10 LeNet suite run of issue 66 (benchmarks/time_to_verdict.py).
name = "cifar8"
dataset = "npz:{npz}"
model = "lenet"
images = {images}
seeds = [0]
suite = "standard"

[[defense]]
name = "none"

[[defense]]
name = "prune"
ratio = 0.5

[training]
enabled = false
"""
# --quick: the default run on 2 images, two defenses, one short training per configuration.
QUICK_DEFAULT = (
    "images=2",
    "training.epochs=1",
    "training.dp.epochs=1",
    "training.seeds=1",
    "training.learning_rates=[0.01]",
    "training.dp.learning_rates=[4.0]",
    'defense=[{name = "none"}, {name = "prune", ratio = 0.5}]',
)
COLUMNS = [
    "case",
    "metric",
    "name",
    "value",
    "unit",
    "source",
    "note",
    "cpu",
    "cores",
    "load_start",
    "load_end",
    "versions",
    "date",
    "quick",
]


@dataclasses.dataclass(frozen=True)
class Measure:
    """One row of the CSV: ``metric`` of ``case`` (``name``: which stage, width, ...)."""

    case: str
    metric: str
    value: float
    unit: str = ""
    name: str = ""
    source: str = "measured"
    note: str = ""


@dataclasses.dataclass
class Machine:
    """Where the cases ran: CPU model, cores, load averages (1, 5, 15 min), versions, date."""

    cpu: str
    cores: int
    load_start: tuple[float, float, float]
    load_end: tuple[float, float, float] | None = None
    versions: str = ""
    date: str = ""


@dataclasses.dataclass(frozen=True)
class Usage:
    """What a child process cost: wall, CPU (user + system) seconds and peak RSS."""

    wall: float
    cpu: float
    peak_rss_mb: float
    returncode: int


@dataclasses.dataclass(frozen=True)
class Site:
    """Calls of ``function`` in a module whose path ends with ``path`` (every call, or only
    those from ``caller``, a ``(path, function)``)."""

    path: str
    function: str
    caller: tuple[str, str] | None = None


@dataclasses.dataclass(frozen=True)
class Stage:
    """A stage of the profile: the cumulative time of ``plus`` less that of ``minus``. A name
    ``parent/child`` is part of ``parent``; ``counted`` false: it overlaps other stages and is
    left out of "other"."""

    name: str
    plus: tuple[Site, ...]
    minus: tuple[Site, ...] = ()
    counted: bool = True


ESCALATION = Site("attacks/base.py", "attack_many", ("run/judge.py", "settle"))
IDENTIFICATION = Site("run/identification.py", "add_flags")
STAGES: tuple[Stage, ...] = (
    Stage(
        "startup (TensorFlow import)", (Site("core/environment.py", "import_tensorflow_quietly"),)
    ),
    Stage("trainings", (Site("run/execute.py", "train_one"),)),
    Stage("trainings/DP-SGD steps", (Site("client/training.py", "sampled_step"),)),
    Stage(
        "attacks, first pass",
        (Site("attacks/base.py", "attack_many", ("run/execute.py", "attack_group")),),
    ),
    Stage(
        "judge",
        (Site("run/judge.py", "settle"),),
        (ESCALATION, Site("components/metrics.py", "score_batch", ("run/judge.py", "leaked"))),
    ),
    Stage("judge/losses at the truth and the result", (Site("run/judge.py", "losses_at"),)),
    Stage("escalation", (ESCALATION,)),
    Stage("scoring", (Site("components/metrics.py", "score_batch"),)),
    Stage("scoring/SSIM", (Site("components/metrics.py", "ssim"),)),
    Stage("scoring/LPIPS", (Site("components/lpips.py", "distance"),)),
    Stage("identification", (IDENTIFICATION,)),
    Stage("identification/LPIPS embeddings", (Site("components/lpips.py", "embed"),)),
    Stage(
        "LPIPS, all (scoring and identification)",
        (Site("components/lpips.py", "distance"), Site("components/lpips.py", "embed")),
        counted=False,
    ),
    Stage(
        "export, figures and report",
        (Site("run/rundir.py", "export_tables"), Site("cli.py", "_write_run_report")),
        (IDENTIFICATION,),
    ),
)


class _Parser(argparse.ArgumentParser):
    """Usage errors as one line, ``time_to_verdict: error: ...``, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"time_to_verdict: error: {' '.join(message.split())}\n")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _Parser(prog="time_to_verdict", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(CASES), help=f"some of {', '.join(CASES)}")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("results/perf/time_to_verdict.csv"),
        help="the CSV written (a run record, run.json, beside it)",
    )
    parser.add_argument("--keep", type=Path, help="keep the run folders in this new folder")
    parser.add_argument("--quick", action="store_true", help="a tiny smoke configuration")
    parser.add_argument(
        "--profile", action="store_true", help="also the default run under cProfile, per stage"
    )
    parser.add_argument(
        "--data-root",
        type=Path,
        default=Path("../shared/data"),
        help="the shared data (cifar10/cifar10-test.npz, mnist/)",
    )
    args = parser.parse_args(argv)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if not cases:
        parser.error(f"--cases must name at least one of {', '.join(CASES)}")
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        parser.error(f"--cases: unknown {unknown[0]!r}; allowed: {', '.join(CASES)}")
    args.cases = list(dict.fromkeys(cases))
    if args.profile and "default" not in args.cases:
        parser.error("--profile profiles the default run: add default to --cases")
    if args.out.is_dir():
        parser.error(f"--out {args.out} is a folder; give the CSV file's path")
    if args.out.parent.exists() and not args.out.parent.is_dir():
        parser.error(f"--out {args.out}: {args.out.parent} is not a folder")
    keep = args.keep
    if keep is not None and keep.exists() and (not keep.is_dir() or any(keep.iterdir())):
        parser.error(
            f"--keep {keep} must be a new or empty folder (a run folder that holds a run "
            "would be resumed, not timed)"
        )
    args.out, args.data_root = args.out.resolve(), args.data_root.resolve()
    return args


def machine_now() -> Machine:
    """The machine and its load now (`Machine.load_end` is filled in at the end)."""
    versions = [f"python {sys.version.split()[0]}"]
    for package in ("leakbench", "tensorflow", "torch"):
        try:
            versions.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return Machine(
        cpu=describe_cpu().get("cpu") or "unknown CPU",
        cores=os.cpu_count() or 1,
        load_start=os.getloadavg(),
        versions="; ".join(versions),
        date=datetime.date.today().isoformat(),
    )


def load_text(load: tuple[float, float, float] | None) -> str:
    return "" if load is None else " ".join(f"{x:.2f}" for x in load)


def print_machine(machine: Machine) -> None:
    print(f"{machine.cpu}, {machine.cores} cores; {machine.versions}")
    print(f"load average (1, 5, 15 min) at the start: {load_text(machine.load_start)}")
    if machine.load_start[0] > IDLE_LOAD:
        print(
            f"warning: the 1-minute load average is {machine.load_start[0]:.2f} (> {IDLE_LOAD}): "
            "other work is running, so these timings are not an idle machine's",
            flush=True,
        )


def run_timed(command: Sequence[str], quiet: bool = False) -> Usage:
    """Runs ``command`` from the repository root and measures it (its descendants included);
    ``quiet``: its output is not shown."""
    print(f"$ {shlex.join(command)}", flush=True)
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    start = time.perf_counter()
    sink = subprocess.DEVNULL if quiet else None
    proc = subprocess.Popen(list(command), cwd=REPO, env=env, stdout=sink, stderr=sink)
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    return Usage(wall, cpu, usage.ru_maxrss / 1024.0, proc.returncode)  # Linux: kilobytes


def usage_measures(case: str, usage: Usage, name: str = "") -> list[Measure]:
    """Wall, CPU and peak RSS of a child (``name``: which, when the case ran several)."""
    note = "" if usage.returncode == 0 else f"failed: exit code {usage.returncode}"
    return [
        Measure(case, "wall_seconds", usage.wall, "s", name, note=note),
        Measure(case, "cpu_seconds", usage.cpu, "s", name, note=note),
        Measure(case, "peak_rss_mb", usage.peak_rss_mb, "MB", name, note=note),
    ]


def skipped(case: str, reason: str) -> list[Measure]:
    print(f"{case}: skipped, {reason}", flush=True)
    return [Measure(case, "skipped", math.nan, note=reason)]


def run_command(out: Path, settings: Iterable[str], config: Path | None = None) -> list[str]:
    """``leakbench run`` of ``config`` (None: the built-in benchmark) into ``out``."""
    command = [sys.executable, "-m", "leakbench.cli", "run"]
    command += [] if config is None else [str(config)]
    command += ["--out", str(out), "--quiet"]
    for setting in settings:
        command += ["--set", setting]
    return command


def read_table(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file (none when it is missing)."""
    if not path.is_file():
        return []
    with open(path, newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def _number(text: str | None) -> float:
    try:
        return float(text) if text not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _stage(case: str, seconds: float, name: str, source: str, note: str = "") -> Measure:
    return Measure(case, "stage_seconds", seconds, "s", name, source, note)


def training_stages(case: str, utility: list[dict[str, str]]) -> list[Measure]:
    """Training seconds per recipe from ``utility.csv`` rows: ``seconds_per_step`` x (steps - 1)
    of the kept rate, times the rates searched (tracing and evaluation are not recorded)."""
    recipes: dict[str, list[float]] = {}
    for row in utility:
        rates = len(json.loads(row.get("learning_rates") or "[0]"))
        seconds = _number(row["seconds_per_step"]) * max(_number(row["steps"]) - 1, 0) * rates
        recipes.setdefault(row.get("recipe") or "default", []).append(seconds)
    if not recipes:
        return []
    note = "steps of every rate searched; tracing and evaluation not recorded"
    total = sum(sum(v) for v in recipes.values())
    out = [_stage(case, total, "trainings", "utility.csv", note)]
    for name, values in recipes.items():
        out.append(
            _stage(
                case,
                sum(values),
                f"trainings/{name} recipe",
                "utility.csv",
                f"{len(values)} trainings",
            )
        )
    return out


TRIAL_KEY = ("attack", "attack_params", "defense", "defense_params", "seed", "batch_index")


def attack_stages(case: str, trials: list[dict[str, str]]) -> list[Measure]:
    """Attack seconds per family from ``trials.csv`` rows (a trial's images share its seconds,
    counted once; escalations included), and those of the trials that escalated."""
    families: dict[str, list[float]] = {}
    escalated, rounds, seen = 0.0, 0.0, set()
    for row in trials:
        key = tuple(row.get(k, "") for k in TRIAL_KEY)
        if key in seen:
            continue
        seen.add(key)
        seconds = _number(row["seconds"])
        families.setdefault(row["attack"], []).append(seconds)
        if _number(row.get("escalations")) > 0:
            escalated += seconds
            rounds += _number(row.get("escalations"))
    if not families:
        return []
    note = "escalations included; the judge, scoring and LPIPS are not recorded"
    total = sum(sum(v) for v in families.values())
    out = [_stage(case, total, "attacks", "trials.csv", note)]
    for name, values in sorted(families.items()):
        out.append(
            _stage(case, sum(values), f"attacks/{name}", "trials.csv", f"{len(values)} trials")
        )
    note = f"their first pass and {rounds:.0f} escalation rounds"
    return out + [_stage(case, escalated, "attacks/escalated trials", "trials.csv", note)]


def recorded_stages(case: str, folder: Path) -> list[Measure]:
    """The stage seconds the run directory ``folder`` records (`training_stages`,
    `attack_stages`)."""
    utility = read_table(folder / "utility.csv")
    return training_stages(case, utility) + attack_stages(case, read_table(folder / "trials.csv"))


def _matches(key: tuple[str, int, str], path: str, function: str) -> bool:
    file = key[0].replace("\\", "/")
    return key[2] == function and (file == path or file.endswith("/" + path))


def site_seconds(stats: Mapping[Any, Any], site: Site) -> float:
    """Cumulative seconds of ``site`` in ``stats`` (`pstats.Stats.stats`: ``(file, line,
    function) -> (calls, primitive calls, own time, cumulative time, callers)``, where each
    caller maps to the same four numbers for its calls alone)."""
    total = 0.0
    for key, (_, _, _, cumulative, callers) in stats.items():
        if not _matches(key, site.path, site.function):
            continue
        if site.caller is None:
            total += cumulative
            continue
        total += sum(v[3] for c, v in callers.items() if _matches(c, *site.caller))
    return total


def attribute(
    stats: Mapping[Any, Any], total: float, stages: Sequence[Stage] = STAGES
) -> list[tuple[str, float]]:
    """``(stage, seconds)`` of each of ``stages``, then ``other``: ``total`` less the stages
    at the top level (no ``/`` in the name) that count."""
    out = []
    top = 0.0
    for stage in stages:
        seconds = sum(site_seconds(stats, s) for s in stage.plus)
        seconds -= sum(site_seconds(stats, s) for s in stage.minus)
        out.append((stage.name, seconds))
        if stage.counted and "/" not in stage.name:
            top += seconds
    out.append(("other", total - top))
    return out


def profile_measures(case: str, path: Path) -> list[Measure]:
    """The stages of the profile written to ``path`` (`attribute`)."""
    stats = pstats.Stats(str(path))
    table = getattr(stats, "stats", {})
    total = float(getattr(stats, "total_tt", 0.0))
    out = [Measure(case, "profile_seconds", total, "s", "total", "cProfile")]
    for name, seconds in attribute(table, total):
        out.append(Measure(case, "profile_seconds", seconds, "s", name, "cProfile"))
    return out


def profile_command(out: Path, profile: Path, settings: Iterable[str]) -> list[str]:
    """`run_command` of the built-in benchmark under cProfile, in one process."""
    leakbench = run_command(out, settings)[1:]  # -m leakbench.cli run ...
    return [sys.executable, "-m", "cProfile", "-o", str(profile), *leakbench, "--workers", "1"]


def run_default(args: argparse.Namespace, work: Path) -> list[Measure]:
    settings = QUICK_DEFAULT if args.quick else ()
    usage = run_timed(run_command(work / "default", settings))
    out = usage_measures("default", usage) + recorded_stages("default", work / "default")
    if not args.profile:
        return out
    profile = work / "default.prof"
    usage = run_timed(profile_command(work / "default-profile", profile, settings))
    out += usage_measures("default", usage, name="profiled run (cProfile, --workers 1)")
    if usage.returncode == 0 and profile.is_file():
        out += profile_measures("default", profile)
    return out


# The answers a user waits for before any work (issue 66): each timed CLI_REPEATS times in a
# fresh process, the best kept (the first may also pay for cold file caches).
CLI_REPEATS = 3
BAD_CONFIG = 'dataset = "digits"\n[[defense]]\nname = "gauss"\n'


def run_cli(args: argparse.Namespace | None, work: Path) -> list[Measure]:
    """``leakbench --help``, ``leakbench list`` and a config with an unknown defense (which
    must exit 2): wall seconds, best of `CLI_REPEATS`."""
    bad = work / "bad.toml"
    bad.write_text(BAD_CONFIG, "utf-8")
    cli = [sys.executable, "-m", "leakbench.cli"]
    commands = {"--help": ["--help"], "list": ["list"], "bad config": ["run", str(bad)]}
    expected = {"--help": 0, "list": 0, "bad config": 2}
    out = []
    for name, tail in commands.items():
        runs = [run_timed([*cli, *tail], quiet=True) for _ in range(CLI_REPEATS)]
        best = min(runs, key=lambda u: u.wall)
        wrong = [u.returncode for u in runs if u.returncode != expected[name]]
        note = f"failed: exit code {wrong[0]}" if wrong else ""
        out.append(Measure("cli", "wall_seconds", best.wall, "s", name, note=note))
    return out


def run_cifar8(args: argparse.Namespace, work: Path) -> list[Measure]:
    npz = args.data_root / "cifar10" / "cifar10-test.npz"
    if not npz.is_file():
        return skipped("cifar8", f"no {npz} (the CIFAR-10 test images of ../shared/data)")
    folder = work / "cifar8-config"
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "cifar8.toml"
    config.write_text(CIFAR8_CONFIG.format(npz=npz, images=2 if args.quick else 8), "utf-8")
    usage = run_timed(run_command(work / "cifar8", (), config))
    return usage_measures("cifar8", usage) + recorded_stages("cifar8", work / "cifar8")


def attack_speed_args(case: str, quick: bool, torch: bool, cifar: bool) -> list[str]:
    """``attack_speed.py``'s arguments for ``case`` (``dlg256`` or ``roofline``)."""
    if case == "dlg256":
        n = 2 if quick else DLG_IMAGES
        # One throughput attack (the script always runs some), then the paper's budget.
        args = ["--datasets", "mnist", "--widths", "1", "--images", "1"]
        args += ["--torch-images", str(n), "--paper-widths", str(n)]
        return args + ([] if torch else ["--no-torch"])
    widths = (1,) if quick else ROOFLINE_WIDTHS
    datasets = "mnist" if quick or not cifar else "cifar10,mnist"
    args = ["--datasets", datasets, "--widths", ",".join(str(w) for w in widths)]
    return args + ["--images", "2" if quick else "32", "--torch-images", "0", "--no-torch"]


def run_attack_speed(case: str, args: argparse.Namespace, work: Path, torch: bool) -> list[Measure]:
    if not (args.data_root / "mnist").is_dir():
        return skipped(case, f"no {args.data_root / 'mnist'} (the MNIST test images)")
    cifar = (args.data_root / "cifar10" / "cifar10-test.npz").is_file()
    table = work / case / "attack_speed.csv"
    command = [
        sys.executable,
        str(ATTACK_SPEED),
        *attack_speed_args(case, args.quick, torch, cifar),
    ]
    command += ["--data-root", str(args.data_root), "--out", str(table)]
    usage = run_timed(command)
    out = usage_measures(case, usage)
    rows = read_table(table)
    if usage.returncode == 0 and rows:
        out += dlg_measures(rows, torch) if case == "dlg256" else roofline_measures(rows)
    return out


def _speed(case: str, metric: str, value: float, unit: str, name: str, note: str = "") -> Measure:
    return Measure(case, metric, value, unit, name, "attack_speed.csv", note)


def dlg_measures(rows: list[dict[str, str]], torch: bool) -> list[Measure]:
    """Same-budget DLG from ``attack_speed.csv`` rows: each side's total seconds and successes
    over the images, and the reference's time over leakbench's (its speed-up)."""
    paper = [r for r in rows if r["budget"] == "paper-6000" and r["implementation"] == "leakbench"]
    if not paper:
        return []
    mine = max(paper, key=lambda r: int(r["width"]))
    n = int(mine["attacks"])
    mine_total = _number(mine["seconds_per_attack"]) * n
    label = f"leakbench dlg, paper budget, N={mine['width']}"
    out = [
        _speed("dlg256", "attack_seconds", mine_total, "s", label, f"{n} {mine['dataset']} images"),
        _speed("dlg256", "successes", _number(mine["successes"]), "images", label, f"of {n}"),
    ]
    reference = [r for r in rows if r["implementation"] == "pytorch-reference"]
    ratio = "PyTorch / leakbench"
    if not reference:
        why = "no PyTorch row" if torch else "PyTorch is not importable: the leakbench side only"
        return out + [_speed("dlg256", "speedup", math.nan, "x", ratio, why)]
    ref, name = reference[0], "PyTorch reference"
    ref_total = _number(ref["seconds_per_attack"]) * int(ref["attacks"])
    count = f"{ref['attacks']} images, one at a time"
    return out + [
        _speed("dlg256", "attack_seconds", ref_total, "s", name, count),
        _speed("dlg256", "successes", _number(ref["successes"]), "images", name, count),
        _speed("dlg256", "speedup", ref_total / mine_total, "x", ratio),
    ]


def roofline_measures(rows: list[dict[str, str]]) -> list[Measure]:
    """The attack loop's GFLOP/s per dataset and width (the 300-iteration throughput rows of
    ``attack_speed.csv``), the matmul peak measured in the same process and their ratio."""
    loops = [r for r in rows if r["budget"] == "default-300" and r["implementation"] == "leakbench"]
    if not loops:
        return []
    peak = _number(loops[0]["matmul_gflops"])
    matmul = "dense matmul 2048x2048 float32"
    note = "the better of eager and XLA, in the same process"
    out = [_speed("roofline", "matmul_gflops", peak, "GFLOP/s", matmul, note)]
    for row in loops:
        name, gflops = f"{row['dataset']} N={row['width']}", _number(row["gflops"])
        attacks = f"{row['attacks']} attacks"
        out.append(_speed("roofline", "gflops", gflops, "GFLOP/s", name, attacks))
        out.append(_speed("roofline", "peak_share", gflops / peak, "", name, "of the matmul peak"))
    return out


def csv_rows(measures: Sequence[Measure], machine: Machine, quick: bool) -> list[list[Any]]:
    """The CSV rows (`COLUMNS`): each measure with the machine it ran on and whether it was
    the ``--quick`` configuration."""
    common = [
        machine.cpu,
        machine.cores,
        load_text(machine.load_start),
        load_text(machine.load_end),
        machine.versions,
        machine.date,
        quick,
    ]
    return [
        [m.case, m.metric, m.name, m.value, m.unit, m.source, m.note, *common] for m in measures
    ]


def minutes(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    return (
        f"{int(seconds // 60)} min {seconds % 60:04.1f} s" if seconds >= 60 else f"{seconds:.1f} s"
    )


def print_summary(measures: Sequence[Measure], machine: Machine) -> None:
    """The side-by-side table of the cases, then each case's details."""
    print(
        f"\ntime to verdict on {machine.cpu}, {machine.cores} cores (load "
        f"{load_text(machine.load_start)} at the start, {load_text(machine.load_end)} at the end)"
    )
    print(f"  {'case':<9} {'wall':>14} {'CPU':>14} {'peak RSS':>10}  target (issue 66)")
    for case in dict.fromkeys(m.case for m in measures):
        of = {m.metric: m for m in measures if m.case == case and not m.name}
        if "skipped" in of:
            print(f"  {case:<9} {'skipped':>14}  {of['skipped'].note}")
            continue
        if case == "cli":  # three commands: the slowest answer against the target
            slowest = max(m.value for m in measures if m.case == case)
            print(f"  {case:<9} {minutes(slowest):>14} {'-':>14} {'-':>10}  {TARGETS[case]}")
            continue
        wall, cpu, rss = (of[k].value for k in ("wall_seconds", "cpu_seconds", "peak_rss_mb"))
        note = of["wall_seconds"].note
        print(
            f"  {case:<9} {minutes(wall):>14} {minutes(cpu):>14} {rss:7.0f} MB  "
            f"{TARGETS[case]}{'  ' + note if note else ''}"
        )
    for case in dict.fromkeys(m.case for m in measures):
        wall = next((m.value for m in measures if m.case == case and m.metric == "wall_seconds"), 0)
        print_details(case, [m for m in measures if m.case == case and m.name], wall)


def print_details(case: str, measures: Sequence[Measure], wall: float) -> None:
    """A case's named measurements: the stage tables (shares of the run's wall time, or of the
    profile's total), then one line per other measurement."""
    titles = {
        "stage_seconds": "where the time goes, as the run directory records it",
        "profile_seconds": "where the time goes under cProfile (one process, --workers 1)",
    }
    for metric in dict.fromkeys(m.metric for m in measures):
        rows = [m for m in measures if m.metric == metric]
        if metric in titles:
            print(f"\n{case}: {titles[metric]}")
            total = next((m.value for m in rows if m.name == "total"), wall)
            for m in rows:
                depth = m.name.count("/")
                label = "  " * depth + m.name.rsplit("/", 1)[-1]
                share = f"{m.value / total:6.1%}" if total > 0 and m.name != "total" else ""
                print(f"  {label:<44} {m.value:9.1f} s {share:>7}  {m.note}")
            continue
        for m in rows:
            value = "-" if math.isnan(m.value) else f"{m.value:.3g}"
            value = f"{m.value:.1f}" if abs(m.value) >= 100 else value
            print(f"{case}: {metric} {m.name}: {value} {m.unit}  {m.note}".rstrip())


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    machine = machine_now()
    print_machine(machine)
    torch = importlib.util.find_spec("torch") is not None
    if "dlg256" in args.cases and not torch:
        print("PyTorch is not importable: dlg256 reports the leakbench side only")
    keep = args.keep is not None
    work = args.keep.resolve() if keep else Path(tempfile.mkdtemp(prefix="time-to-verdict-"))
    work.mkdir(parents=True, exist_ok=True)
    print(
        f"cases: {', '.join(args.cases)}{' (quick)' if args.quick else ''}; run folders in "
        f"{work}{'' if keep else ' (removed at the end)'}",
        flush=True,
    )
    measures: list[Measure] = []
    try:
        for case in args.cases:
            print(f"\n== {case}", flush=True)
            if case == "cli":
                measures += run_cli(args, work)
            elif case == "default":
                measures += run_default(args, work)
            elif case == "cifar8":
                measures += run_cifar8(args, work)
            else:
                measures += run_attack_speed(case, args, work, torch)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    machine.load_end = os.getloadavg()
    print_summary(measures, machine)
    write_rows(args.out, COLUMNS, csv_rows(measures, machine, args.quick))
    import_tensorflow_quietly()  # the run record names TensorFlow's devices
    write_run_record(args.out.parent, args.out.name, script_command(__file__, argv))
    print(f"\nwrote {args.out}")
    failed = any(m.note.startswith("failed") for m in measures)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
