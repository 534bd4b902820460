"""Command line: ``leakbench run`` and ``leakbench list``.

Errors a user can cause print one line on stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

# TensorFlow's C++ start-up chatter would bury the one-line messages this CLI promises.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from leakbench.errors import LeakbenchError  # noqa: E402

SHOWN_COLUMNS = [
    "attack", "defense", "defense_params", "n", "psnr_mean", "psnr_ci95", "ssim_mean",
    "label_acc", "success_rate", "strongest", "test_accuracy", "accuracy_drop", "epsilon",
]  # fmt: skip


class _Parser(argparse.ArgumentParser):
    """An argument parser whose usage errors are one line and exit status 2, like every other
    user error of this CLI (argparse would print the whole usage block first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"leakbench: error: {message} (see `{self.prog} --help`)\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="leakbench",
        description="Gradient-leakage attacks against gradient defenses (TensorFlow 2 / Keras 3).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run (or resume) a benchmark and print its leaderboard")
    run.add_argument("config", nargs="?", help="TOML config (default: the built-in benchmark)")
    run.add_argument("--out", help="run directory (default: runs/<name>)")
    run.add_argument(
        "--extend",
        action="store_true",
        help="add this config's trials to a run directory that holds a different config",
    )
    run.add_argument("--quiet", action="store_true", help="no progress bar, no leaderboard")
    sub.add_parser("list", help="list datasets, models, attacks and defenses with parameters")
    return parser


def _import_tensorflow_quietly() -> None:
    """Imports TensorFlow and initialises its devices with the C++ stderr muted.

    TensorFlow's native start-up lines ("Could not find cuda drivers", "failed call to cuInit")
    are written before its logging is configured, so ``TF_CPP_MIN_LOG_LEVEL`` cannot hide them.
    Python-level errors still surface: they are raised after stderr is restored.
    """
    if "tensorflow" in sys.modules:
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            import tensorflow as tf

            tf.config.list_physical_devices()
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    _import_tensorflow_quietly()
    try:
        if args.command == "run":
            return _run(args)
        return _list()
    except LeakbenchError as err:
        print(f"leakbench: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("leakbench: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    import pandas as pd

    from leakbench.config import load_config
    from leakbench.runner import run_benchmark

    spec = load_config(args.config)
    out = args.out or os.path.join("runs", spec.name)
    result = run_benchmark(spec, out, extend=args.extend, progress=not args.quiet)
    if not args.quiet:
        with pd.option_context("display.width", 200, "display.max_columns", 20):
            print(result.leaderboard[SHOWN_COLUMNS].to_string(index=False, float_format="%.3g"))
    print(
        f"{result.ran} trials run, {result.reused} reused; {result.trained} trainings run, "
        f"{result.training_reused} reused; {result.seconds:.1f} s; wrote {result.out_dir}/"
        "{trials,utility,leaderboard}.csv"
    )
    return 0


def _list() -> int:
    import dataclasses

    from leakbench.attacks import ATTACKS
    from leakbench.datasets import DATASETS, FILE_SOURCES
    from leakbench.defenses import DEFENSES
    from leakbench.models import MODELS

    def summary(obj: object) -> str:
        return (obj.__doc__ or "").strip().splitlines()[0] if obj.__doc__ else ""

    def params(cls: type) -> str:
        parts = []
        for f in dataclasses.fields(cls):
            default = "required" if f.default is dataclasses.MISSING else repr(f.default)
            parts.append(f"{f.name}={default}")
        return ", ".join(parts) or "no parameters"

    print("datasets:")
    for name in DATASETS:
        print(f"  {name:14} {summary(DATASETS.get(name))}")
    for name in FILE_SOURCES:
        print(f"  {name + ':PATH':14} {summary(FILE_SOURCES.get(name))}")
    print("models:")
    for name in MODELS:
        print(f"  {name:14} {summary(MODELS.get(name))}")
    print("attacks:")
    for name in ATTACKS:
        cls = ATTACKS.get(name)
        print(f"  {name:14} {summary(cls)}\n  {'':14} {params(cls)}")
    print("defenses:")
    for name in DEFENSES:
        cls = DEFENSES.get(name)
        print(f"  {name:14} {summary(cls)}\n  {'':14} {params(cls)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
