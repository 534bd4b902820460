"""Runs the defended trainer on a loopback cluster and prints a JSON report (one line).

`test_distributed.py` runs it as a script, so that each run gets a fresh TensorFlow whose
threads and cluster can be set before anything starts:

* ``python tests/distributed_worker.py ps``: an in-process cluster on 127.0.0.1 (two workers
  and one parameter server as ``tf.distribute.Server`` instances, this process as the
  coordinator), ``ParameterServerStrategy`` and ``DefendedTrainer.schedule``.
* ``python tests/distributed_worker.py mwms`` with ``TF_CONFIG`` set: one worker of a
  ``MultiWorkerMirroredStrategy`` cluster (the test starts two).

The defense returns NaN on the steps t with t % PERIOD == PHASE, for one client only
(`Poison`). Every wait is bounded: past ``--timeout`` seconds the script prints its threads'
stacks to stderr and exits 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import hashlib
import json
import socket
from typing import ClassVar

import numpy as np
import tensorflow as tf

STEPS = 12
PERIOD, PHASE = 4, 2
BATCH = 32  # the global batch
SEED = 0
# DefendedTrainer gives replica r of a run with seed s the client number s * 65536 + r (plus the
# training stream tag 2**56, a multiple of CLIENTS: leakbench.core.seeds).
CLIENTS = 1 << 16


def _loopback_ports(n: int) -> list[str]:
    """``n`` distinct free addresses on 127.0.0.1 (held together while picked)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [f"127.0.0.1:{sock.getsockname()[1]}" for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def _state(model, optimizer) -> list[np.ndarray]:
    return [v.numpy().copy() for v in [*model.trainable_variables, *optimizer.variables]]


def _checksum(model) -> str:
    digest = hashlib.sha256()
    for v in model.trainable_variables:
        digest.update(np.ascontiguousarray(v.numpy()).tobytes())
    return digest.hexdigest()


def _batches(x: np.ndarray, y: np.ndarray, steps: int):
    """The same global batches on every worker (a generator seeded by SEED)."""
    rng = np.random.default_rng(SEED)
    for _ in range(steps):
        idx = rng.permutation(len(x))[:BATCH]
        yield tf.constant(x[idx]), tf.constant(y[idx])


def _setup(strategy):
    from leakbench.client.recipes import TrainingConfig
    from leakbench.client.training import DefendedTrainer
    from leakbench.components.models import build_model
    from leakbench.datasets import load_dataset
    from leakbench.defenses import Defense

    @dataclasses.dataclass(frozen=True)
    class Poison(Defense):
        """NaN on steps t % PERIOD == PHASE, for client ``client`` only (None: every client)."""

        name: ClassVar[str] = "poison"
        client: int | None = None

        def __call__(self, grads, *, seed):
            seed = tf.cast(seed, tf.int64)
            bad = tf.equal(tf.math.floormod(seed[1], PERIOD), PHASE)
            if self.client is not None:
                bad &= tf.equal(tf.math.floormod(seed[0], CLIENTS), self.client)
            return [tf.where(bad, g * float("nan"), g) for g in grads]

    data = load_dataset("digits")
    # Replica 1 under a synchronous strategy; under parameter servers each step is one client.
    client = 1 if strategy.num_replicas_in_sync > 1 else None
    with strategy.scope():
        model = build_model("lenet", data.input_shape, data.num_classes, seed=SEED)
        optimizer = TrainingConfig().make_optimizer()
        trainer = DefendedTrainer(
            model,
            Poison(client=client),
            optimizer,
            num_classes=data.num_classes,
            seed=SEED,
            strategy=strategy,
        )
    return data, model, optimizer, trainer


def run_parameter_servers() -> dict:
    addresses = _loopback_ports(4)
    cluster = {"worker": addresses[:2], "ps": addresses[2:3], "chief": addresses[3:]}
    spec = tf.train.ClusterSpec(cluster)
    server_config = tf.compat.v1.ConfigProto()
    server_config.intra_op_parallelism_threads = 1
    # In-process servers deadlock with fewer than workers + 1 inter-op threads (with 1 the first
    # scheduled step never returns); TensorFlow's own multi_worker_test_base sets the same floor.
    server_config.inter_op_parallelism_threads = len(cluster["worker"]) + 1
    for job in ("worker", "ps"):
        for index in range(len(cluster[job])):
            tf.distribute.Server(
                spec, job_name=job, task_index=index, protocol="grpc", config=server_config
            )
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec, rpc_layer="grpc", task_type="chief", task_id=0
    )
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    data, model, optimizer, trainer = _setup(strategy)
    batches = _batches(data.train.x, data.train.y, STEPS + 4)

    # Phase 1: STEPS steps in flight at once, spread over both workers.
    remote = [trainer.schedule(*next(batches)) for _ in range(STEPS)]
    coordinator.join()
    results = [r.fetch() for r in remote]
    report = {
        "skipped": [bool(r.skipped) for r in results],
        "finite_loss": all(np.isfinite(r.loss) for r in results),
        "steps": int(trainer.step_count.numpy()),
        "skipped_steps": int(trainer.skipped_steps.numpy()),
        "iterations": int(optimizer.iterations.numpy()),
        "variable_devices": sorted(
            {v.value.device for v in [*model.trainable_variables, *optimizer.variables]}
        ),
    }
    # Phase 2: one step at a time, each state compared bit for bit with the one before it.
    checked = []
    for _ in range(4):
        before = _state(model, optimizer)
        result = trainer.schedule(*next(batches)).fetch()
        after = _state(model, optimizer)
        unchanged = all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
        checked.append({"skipped": bool(result.skipped), "unchanged": unchanged})
    report.update(
        checked=checked,
        final_steps=int(trainer.step_count.numpy()),
        final_skipped_steps=int(trainer.skipped_steps.numpy()),
        finite_weights=all(np.all(np.isfinite(v.numpy())) for v in model.trainable_variables),
        traces=trainer.traces,
    )
    return report


def run_multi_worker() -> dict:
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.RING
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    data, model, optimizer, trainer = _setup(strategy)
    skipped, unchanged = [], []
    for images, labels in _batches(data.train.x, data.train.y, STEPS):
        before = _state(model, optimizer)
        result = trainer.step(images, labels)
        after = _state(model, optimizer)
        skipped.append(bool(result.skipped.numpy()))
        unchanged.append(all(np.array_equal(a, b) for a, b in zip(before, after, strict=True)))
    return {
        "replicas": strategy.num_replicas_in_sync,
        "skipped": skipped,
        "unchanged": unchanged,
        "steps": int(trainer.step_count.numpy()),
        "skipped_steps": int(trainer.skipped_steps.numpy()),
        "iterations": int(optimizer.iterations.numpy()),
        "checksum": _checksum(model),
        "finite_weights": all(np.all(np.isfinite(v.numpy())) for v in model.trainable_variables),
        "traces": trainer.traces,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["ps", "mwms"])
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.timeout, exit=True)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    report = run_parameter_servers() if args.mode == "ps" else run_multi_worker()
    faulthandler.cancel_dump_traceback_later()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
