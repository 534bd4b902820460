"""Steady state of a Flower client under a leakbench defense: memory and traces over rounds.

A simulated federation (Flower's simulation engine, its own Ray instance on 127.0.0.1) of
``--clients`` clients trains leakbench's DLG LeNet on the embedded digits for ``--rounds``
rounds: each client takes ``--batch-size`` examples of its share per round, one SGD step at 0.1
(`leakbench.integrations.flower.LocalClient`), and its update passes through a
`leakbench.integrations.flower.DefenseMod` (``gaussian``, sigma 0.01 by default). All clients run in
one Ray actor, one after the other, so one process holds every client's model and traced functions.
After each client's reply is defended, an outer mod records that process's resident memory (VmRSS)
and two trace counts: the defense's function (`DefenseMod.tracing_count`) and the client's
local-training function (`LocalClient.tracing_count`). Flower builds the ClientApp anew for every
message, so both are looked up in the process's caches rather than held by the app.

``--naive`` runs the ANTI-PATTERN for contrast (not a criterion): the defense's traced function
is dropped before every message, as a mod holding its own ``tf.function`` would lose it when
Flower rebuilds the ClientApp, so every round traces it again.

What it checks: both trace counts are exactly 1 at the last round, and the client process's
resident memory grows by under 20 MB (10**6 bytes) from round 10 to the last round.

Writes one row to ``--out`` and the per-round series next to it (``<stem>_series.csv``: round,
the client process's RSS after the round's last client, the two trace counts), both
atomically. Exits 0 when every criterion passes, 1 when one fails, 2 on a usage error.

Run from the repository root::

    python benchmarks/flower_steady_state.py            # 50 rounds, 4 clients
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # Ray on the loopback only

import numpy as np  # noqa: E402

from leakbench.core.errors import LeakbenchError  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_outputs import write_summary_and_series  # noqa: E402

MB = 1e6
EARLY_ROUND = 10
RSS_LIMIT_MB = 20.0
COLUMNS = (
    "rounds", "clients", "batch_size", "defense", "defense_params", "naive", "flwr", "tensorflow",
    "seconds", "client_pids", "rss_mb_round_1", "rss_mb_round_10", "rss_mb_final",
    "rss_growth_mb", "mod_traces_round_1", "mod_traces_round_10", "mod_traces_final",
    "client_traces_round_1", "client_traces_round_10", "client_traces_final",
    "pass_rss", "pass_traces", "pass_all",
)  # fmt: skip
SERIES_COLUMNS = ("round", "rss_mb", "mod_traces", "client_traces")


def rss_mb() -> float:
    """This process's resident memory (VmRSS) in MB."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / MB
    return float("nan")


def build_apps(args: argparse.Namespace, rows: list[dict]) -> tuple:
    """The ServerApp (FedAvg, recording each reply's measurements into ``rows``) and the
    ClientApp (an outer measuring mod, the defense's mod, the leakbench client)."""
    from flwr.app import ConfigRecord, Context, Message
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg

    from leakbench.components.models import build_model
    from leakbench.core.federated import LocalTraining
    from leakbench.datasets import load_dataset
    from leakbench.integrations import flower as flower_module
    from leakbench.integrations.flower import (
        DefenseMod,
        LocalClient,
        client_number,
        model_record,
        server_round,
        train_config,
    )

    params = {"sigma": args.sigma} if args.defense in ("gaussian", "relative_noise") else {}
    defense = DefenseMod(args.defense, **params)  # checked here, before the simulation
    data = load_dataset("digits")
    local = LocalTraining(1, 0.1)
    clients, batch = args.clients, args.batch_size

    # The app is pickled to the client process with every message: it captures no data, and
    # reads the (cached) dataset and the process's LocalClient when it runs.
    def client_of() -> LocalClient:
        shape = load_dataset("digits").input_shape
        return LocalClient.shared("lenet", input_shape=shape, num_classes=10)

    def measure(msg: Message, context: Context, call_next) -> Message:
        if args.naive:
            # ANTI-PATTERN, for contrast only: what a mod holding its own tf.function does
            # when Flower rebuilds the ClientApp for every message (a new function, a new
            # trace, every round).
            flower_module._DEFENDERS.clear()
        reply = call_next(msg, context)
        reply.content["bench"] = ConfigRecord(
            {
                "pid": os.getpid(),
                "rss-mb": rss_mb(),
                "mod-traces": defense.tracing_count(),
                "client-traces": client_of().tracing_count(),
            }
        )
        return reply

    client_app = ClientApp(mods=[measure, defense])

    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        client, rnd = client_number(context), server_round(msg)
        train = load_dataset("digits").train
        share = np.arange(client, len(train), clients)
        start = ((rnd - 1) * batch) % len(share)
        idx = np.take(share, range(start, start + batch), mode="wrap")
        return client_of().reply(msg, context, train.x[idx], train.y[idx])

    class Recording(FedAvg):
        def aggregate_train(self, server_round: int, replies):
            replies = list(replies)
            for reply in replies:
                if reply.has_error():
                    raise RuntimeError(f"client error: {reply.error.reason}")
                bench = reply.content["bench"]
                rows.append(
                    {
                        "round": server_round,
                        "pid": int(bench["pid"]),
                        "rss_mb": float(bench["rss-mb"]),
                        "mod_traces": int(bench["mod-traces"]),
                        "client_traces": int(bench["client-traces"]),
                    }
                )
            return super().aggregate_train(server_round, replies)

    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        model = build_model("lenet", data.input_shape, 10, seed=0)
        strategy = Recording(
            fraction_evaluate=0.0, min_train_nodes=clients, min_available_nodes=clients
        )
        strategy.start(
            grid=grid,
            initial_arrays=model_record(model),
            num_rounds=args.rounds,
            train_config=train_config(local, batch),
        )

    return server_app, client_app, defense


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=50, help=f"rounds (>= {EARLY_ROUND})")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=8, help="examples per client and round")
    parser.add_argument("--defense", default="gaussian", help="a defense that acts on the update")
    parser.add_argument("--sigma", type=float, default=0.01, help="its sigma, if it has one")
    parser.add_argument(
        "--naive", action="store_true",
        help="contrast only: drop the traced defense before every message (retraces each round)",
    )  # fmt: skip
    parser.add_argument("--out", type=Path, default=Path("results/perf/flower_steady_state.csv"))
    args = parser.parse_args(argv)
    if args.rounds < EARLY_ROUND:
        parser.error(f"--rounds must be at least {EARLY_ROUND}, got {args.rounds}")
    if args.clients < 1 or args.batch_size < 1:
        parser.error("--clients and --batch-size must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rows: list[dict] = []
    try:
        server_app, client_app, defense = build_apps(args, rows)
    except LeakbenchError as err:
        print(f"flower_steady_state.py: error: {err}", file=sys.stderr)
        return 2
    import importlib.metadata

    import tensorflow as tf
    from flwr.simulation import run_simulation

    from leakbench.integrations.flower import simulation_backend

    began = time.perf_counter()
    run_simulation(
        server_app=server_app,
        client_app=client_app,
        num_supernodes=args.clients,
        backend_config=simulation_backend(num_cpus=min(2, os.cpu_count() or 1)),
    )
    seconds = time.perf_counter() - began
    if len({r["round"] for r in rows}) != args.rounds:
        print("flower_steady_state.py: the simulation did not finish its rounds", file=sys.stderr)
        return 1
    series = []
    for rnd in range(1, args.rounds + 1):
        last = [r for r in rows if r["round"] == rnd][-1]
        series.append((rnd, last["rss_mb"], last["mod_traces"], last["client_traces"]))
    at = {s[0]: s for s in series}
    final = series[-1]
    row = {
        "rounds": args.rounds,
        "clients": args.clients,
        "batch_size": args.batch_size,
        "defense": args.defense,
        "defense_params": json.dumps(defense.defense.params(), sort_keys=True),
        "naive": args.naive,
        "flwr": importlib.metadata.version("flwr"),
        "tensorflow": tf.__version__,
        "seconds": round(seconds, 1),
        "client_pids": len({r["pid"] for r in rows}),
        "rss_mb_round_1": at[1][1],
        "rss_mb_round_10": at[EARLY_ROUND][1],
        "rss_mb_final": final[1],
        "rss_growth_mb": final[1] - at[EARLY_ROUND][1],
        "mod_traces_round_1": at[1][2],
        "mod_traces_round_10": at[EARLY_ROUND][2],
        "mod_traces_final": final[2],
        "client_traces_round_1": at[1][3],
        "client_traces_round_10": at[EARLY_ROUND][3],
        "client_traces_final": final[3],
    }
    row["pass_rss"] = row["rss_growth_mb"] < RSS_LIMIT_MB
    row["pass_traces"] = row["mod_traces_final"] == 1 and row["client_traces_final"] == 1
    row["pass_all"] = row["pass_rss"] and row["pass_traces"]
    print(
        f"flower_steady_state: {args.clients} clients x {args.rounds} rounds, {args.defense} "
        f"{row['defense_params']}, batch {args.batch_size}, {len({r['pid'] for r in rows})} "
        f"client process(es), {seconds:.0f} s (flwr {row['flwr']}, TF {row['tensorflow']})"
    )
    print(f"  {'round':>5} {'client RSS (MB)':>16} {'defense traces':>15} {'client traces':>14}")
    for rnd in sorted({1, EARLY_ROUND, args.rounds}):
        _, rss, mod_traces, client_traces = at[rnd]
        print(f"  {rnd:>5} {rss:>16.1f} {mod_traces:>15} {client_traces:>14}")
    verdict = {True: "PASS", False: "FAIL"}
    print(
        f"  RSS growth, round {EARLY_ROUND} to {args.rounds}: {row['rss_growth_mb']:+.1f} MB "
        f"(< {RSS_LIMIT_MB:.0f} MB) {verdict[row['pass_rss']]}; traces exactly 1 "
        f"{verdict[row['pass_traces']]}"
    )
    write_summary_and_series(args.out, (COLUMNS, row), (SERIES_COLUMNS, series), __file__, argv)
    return 0 if row["pass_all"] else 1


if __name__ == "__main__":
    sys.exit(main())
