"""A Flower App on leakbench's embedded digits: Keras clients under a leakbench defense, and a
leakage audit on the server.

Each of ``num_clients`` clients holds a disjoint share of the digits training split (a seeded
permutation dealt round-robin); in round ``r`` it takes the next ``batch_size`` examples of
its share, runs ``local_steps`` plain SGD steps at ``local_lr`` on them (leakbench's
`leakbench.integrations.flower.LocalClient`) and replies with its weights. The defense sits where it
belongs: a `leakbench.integrations.flower.DefenseMod` on the ClientApp for defenses that act on the
update, the client's training step for the others (``dpsgd``, ``soteria``, ``mixup``). The server
runs FedAvg wrapped in a `leakbench.integrations.flower.LeakageAuditor` that attacks the audited
clients' updates in the audited rounds, and reports the global model's accuracy on the test split.
The auditor keeps each audited round's global model and the audited clients' examples in
``OUT/models/`` (``save_models``), so that the round can be attacked again as a benchmark run
(`leakbench.integrations.flower_checkpoints.attack_checkpoint`).

Two ways in:

* `make_apps(Settings(...))` builds a ``ServerApp`` and a ``ClientApp`` (every name and
  parameter checked while they are built) for ``flwr.simulation.run_simulation``, as
  ``run_simulation.py`` next to this file does;
* ``server_app`` and ``client_app`` below read the same settings from the run config
  (``[tool.flwr.app.config]`` in this folder's ``pyproject.toml``, or ``flwr run --run-config``)
  for a deployment with ``flwr run`` on a SuperLink and its SuperNodes.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from leakbench import LocalTraining, build_model, load_dataset, make_defense
from leakbench.client.training import evaluate
from leakbench.integrations.flower import (
    DefenseMod,
    LeakageAuditor,
    LocalClient,
    acts_on_update,
    client_number,
    mark_undefended,
    model_record,
    record_arrays,
    set_trainable,
    train_config,
)

logger = logging.getLogger("flwr")
DATASET, MODEL = "digits", "lenet"
RESULT_FILE = "flower_result.json"


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a run of this app is: the federation, the clients' defense and the audit."""

    num_clients: int = 4
    rounds: int = 2
    defense: str = "none"
    defense_params: dict[str, Any] = dataclasses.field(default_factory=dict)
    seed: int = 0
    batch_size: int = 1
    local_steps: int = 1
    local_lr: float = 0.1
    audit_rounds: tuple[int, ...] = (1,)
    audit_clients: tuple[int, ...] = (0,)
    attack: str = "idlg"
    attack_params: dict[str, Any] = dataclasses.field(default_factory=dict)
    out: str = "runs/flower-audit"
    deployment: str = "flower-digits"
    # Keep each audited round's global model and the audited clients' examples in out/models/
    # (`leakbench.integrations.flower_checkpoints.attack_checkpoint` attacks them again).
    save_models: bool = True

    @property
    def local(self) -> LocalTraining:
        return LocalTraining(self.local_steps, self.local_lr)

    @classmethod
    def from_run_config(cls, config: dict[str, Any]) -> Settings:
        """The settings a run config gives (keys with dashes; JSON text for the parameter
        tables, comma-separated lists for the audited rounds and clients)."""
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            key = field.name.replace("_", "-")
            if key not in config:
                continue
            value = config[key]
            if field.name.endswith("_params"):
                value = json.loads(value) if value else {}
            elif field.name.startswith("audit_"):
                value = tuple(int(v) for v in str(value).split(",") if v.strip())
            values[field.name] = value
        return cls(**values)


def shares(settings: Settings) -> list[np.ndarray]:
    """Each client's indices into the training split."""
    train = load_dataset(DATASET).train
    order = np.random.default_rng(settings.seed).permutation(len(train))
    return [order[c :: settings.num_clients] for c in range(settings.num_clients)]


def client_batch(settings: Settings, client: int, rnd: int) -> tuple[np.ndarray, ...]:
    """The examples client ``client`` trains on in round ``rnd``: images, labels and their
    indices in the training split (what the auditor compares its reconstruction with)."""
    train = load_dataset(DATASET).train
    share = shares(settings)[client]
    start = ((rnd - 1) * settings.batch_size) % len(share)
    indices = np.take(share, range(start, start + settings.batch_size), mode="wrap")
    return train.x[indices], train.y[indices], indices


def _defense_is_a_mod(settings: Settings) -> bool:
    return acts_on_update(make_defense(settings.defense, **settings.defense_params))


def client_mods(settings: Settings) -> list[Any]:
    """The ClientApp's mods: the defense as a mod when it acts on the update alone."""
    if settings.defense != "none" and _defense_is_a_mod(settings):
        return [DefenseMod(settings.defense, seed=settings.seed, **settings.defense_params)]
    return []


def local_client(settings: Settings) -> LocalClient:
    """The process's client: the defense in its training step unless it is a mod."""
    data = load_dataset(DATASET)
    in_step = settings.defense != "none" and not _defense_is_a_mod(settings)
    return LocalClient.shared(
        MODEL,
        input_shape=data.input_shape,
        num_classes=data.num_classes,
        **(
            {"defense": settings.defense, "seed": settings.seed, **settings.defense_params}
            if in_step
            else {}
        ),
    )


def train_handler(settings_of: Callable[[Context], Settings]) -> Callable:
    """The ClientApp's train function: local training on this round's batch."""

    def train(msg: Message, context: Context) -> Message:
        settings = settings_of(context)
        client = client_number(context)
        config = msg.content["config"]
        x, y, _ = client_batch(settings, client, int(config["server-round"]))
        reply = local_client(settings).reply(msg, context, x, y)
        return mark_undefended(reply, context, msg)

    return train


def make_auditor(settings: Settings) -> LeakageAuditor:
    """FedAvg over every client, wrapped in the leakage audit (checked now)."""
    strategy = FedAvg(
        fraction_train=1.0,
        fraction_evaluate=0.0,
        min_train_nodes=settings.num_clients,
        min_available_nodes=settings.num_clients,
    )
    return LeakageAuditor(
        strategy,
        out=settings.out,
        private_data=lambda client, rnd: client_batch(settings, client, rnd),
        dataset=DATASET,
        model=MODEL,
        attack=settings.attack,
        attack_params=settings.attack_params,
        rounds=settings.audit_rounds,
        clients=settings.audit_clients,
        local=settings.local,
        batch_size=settings.batch_size,
        deployment=settings.deployment,
        save_models=settings.save_models,
    )


def run_server(grid: Grid, settings: Settings, auditor: LeakageAuditor) -> dict[str, Any]:
    """The server's rounds; returns (and writes into ``out``) the accuracies and the audit."""
    data = load_dataset(DATASET)
    model = build_model(MODEL, data.input_shape, data.num_classes, seed=settings.seed)

    def accuracy(rnd: int, arrays: ArrayRecord) -> MetricRecord:
        set_trainable(model, record_arrays(arrays))
        return MetricRecord({"accuracy": evaluate(model, data.test.x, data.test.y)})

    result = auditor.start(
        grid=grid,
        initial_arrays=model_record(model),
        num_rounds=settings.rounds,
        train_config=train_config(settings.local, settings.batch_size),
        evaluate_fn=accuracy,
    )
    summary = {
        "settings": dataclasses.asdict(settings),
        "accuracy": {
            int(r): float(m["accuracy"]) for r, m in result.evaluate_metrics_serverapp.items()
        },
        "audit": [dataclasses.asdict(t) for t in auditor.trials],
        "out": str(Path(settings.out)),
    }
    Path(settings.out, RESULT_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def make_apps(settings: Settings) -> tuple[ServerApp, ClientApp, LeakageAuditor]:
    """A ServerApp and a ClientApp for ``run_simulation``; the defense, the attack and the
    audit are built (so checked) here, before any round."""
    mods = client_mods(settings)
    auditor = make_auditor(settings)
    client = ClientApp(mods=mods)
    client.train()(train_handler(lambda context: settings))
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        run_server(grid, settings, auditor)

    return server, client, auditor


# --- The deployment entry points (`flwr run`): settings from the run config. ---------------


def _run_config_mod(msg: Message, context: Context, call_next: Callable) -> Message:
    mods = client_mods(Settings.from_run_config(dict(context.run_config)))
    return mods[0](msg, context, call_next) if mods else call_next(msg, context)


client_app = ClientApp(mods=[_run_config_mod])
client_app.train()(train_handler(lambda context: Settings.from_run_config(context.run_config)))
server_app = ServerApp()


@server_app.main()
def _deployment_main(grid: Grid, context: Context) -> None:
    settings = Settings.from_run_config(dict(context.run_config))
    client_mods(settings)  # refuses a bad defense before any round
    summary = run_server(grid, settings, make_auditor(settings))
    logger.info("leakbench example: %s", json.dumps(summary))
