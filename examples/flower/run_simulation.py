"""Runs the digits Flower App (``digits_app.py``) in Flower's simulation engine and prints the
global model's accuracy and what the leakage audit recovered.

Four simulated clients train leakbench's DLG LeNet on their shares of the embedded digits (one
image each per round, one SGD step at 0.1: FedSGD); the auditor attacks client 0's update in
round 1 with ``idlg`` and writes ``trials.csv``, ``leaderboard.csv``, ``arrays/``,
``figures/``, ``audit.json`` and ``models/`` (round 1's global model and client 0's image, which
``leakbench.integrations.flower_checkpoints.attack_checkpoint`` attacks again) into ``--out``.
From the repository root::

    python examples/flower/run_simulation.py --defense gaussian --param sigma=0.1

A wrong defense or attack name, a parameter out of range or a model the attack cannot handle
is one line on stderr and exit status 2, before the simulation starts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# Quiet TensorFlow, and keep Ray's processes on the loopback interface (read when ray is
# imported, so before anything imports it).
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
sys.path.insert(0, str(Path(__file__).resolve().parent))


from leakbench.core.environment import import_tensorflow_quietly  # noqa: E402 (before TensorFlow)

import_tensorflow_quietly()

from leakbench import LeakbenchError  # noqa: E402


def _value(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--defense", default="none", help="a leakbench defense name")
    parser.add_argument(
        "--param", action="append", default=[], metavar="NAME=VALUE",
        help="a defense parameter (JSON value), repeatable",
    )  # fmt: skip
    parser.add_argument("--attack", default="idlg", help="the auditor's leakbench attack")
    parser.add_argument(
        "--attack-param", action="append", default=[], metavar="NAME=VALUE",
        help="an attack parameter (JSON value), repeatable",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--audit-rounds", default="1", help="comma-separated rounds")
    parser.add_argument("--audit-clients", default="0", help="comma-separated clients")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/flower-audit"))
    args = parser.parse_args(argv)
    for flag in ("param", "attack_param"):
        pairs = {}
        for item in getattr(args, flag):
            name, sep, value = item.partition("=")
            if not sep or not name:
                parser.error(f"--{flag.replace('_', '-')} must be NAME=VALUE, got {item!r}")
            pairs[name] = _value(value)
        setattr(args, flag, pairs)
    if args.rounds < 1 or args.clients < 1:
        parser.error("--rounds and --clients must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.perf_counter()
    try:
        from digits_app import Settings, make_apps

        settings = Settings(
            num_clients=args.clients,
            rounds=args.rounds,
            defense=args.defense,
            defense_params=args.param,
            seed=args.seed,
            audit_rounds=tuple(int(r) for r in args.audit_rounds.split(",")),
            audit_clients=tuple(int(c) for c in args.audit_clients.split(",")),
            attack=args.attack,
            attack_params=args.attack_param,
            out=str(args.out),
        )
        server, client, auditor = make_apps(settings)
    except ModuleNotFoundError as err:
        if not (err.name or "").startswith("flwr"):
            raise
        print(
            "run_simulation.py: error: Flower is not installed: pip install 'leakbench[flower]'",
            file=sys.stderr,
        )
        return 2
    except (LeakbenchError, ValueError) as err:
        print(f"run_simulation.py: error: {err}", file=sys.stderr)
        return 2

    from flwr.simulation import run_simulation

    from leakbench.integrations.flower import simulation_backend

    run_simulation(
        server_app=server,
        client_app=client,
        num_supernodes=settings.num_clients,
        backend_config=simulation_backend(num_cpus=min(2, os.cpu_count() or 1)),
    )
    result = json.loads((args.out / "flower_result.json").read_text())
    params = json.dumps(args.param, sort_keys=True)
    lines = [
        f"{settings.num_clients} clients, {settings.rounds} rounds, defense {args.defense} "
        f"{params} ({time.perf_counter() - began:.0f} s)"
    ]
    for rnd, accuracy in sorted(result["accuracy"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"  round {rnd}: global model test accuracy {accuracy:.3f}")
    for trial in result["audit"]:
        lines.append(
            f"  audit: round {trial['round']}, client {trial['client']}: {args.attack} "
            f"PSNR {trial['psnr']:.1f} dB, label accuracy {trial['label_acc']:.0f}"
        )
    lines.append(f"  tables, figures and audit.json in {args.out}")
    print("\n".join(lines))
    # What it printed, kept with the audit (README "Federated deployments with Flower").
    (args.out / "printed.txt").write_text("\n".join(lines) + "\n")
    if not auditor.trials:
        print("run_simulation.py: no audited update arrived", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
