"""leakbench inside a Flower deployment: defenses on the clients, a leakage audit on the server.

Needs the ``flower`` extra (``pip install 'leakbench[flower]'``); the rest of leakbench never
imports this module, so it works without Flower.

What travels. A client replies to a train message with its trainable weights after local
training, ``w_S``, as one ``ArrayRecord`` keyed like the record it received (Flower's usual
reply; `model_record` writes one from a Keras model, in ``model.trainable_variables`` order).
The update a leakbench defense sees is the weight change ``w_0 - w_S``: what leakbench's
FedAvg client defends (`leakbench.client.defended_update`), and with one local SGD step at
rate ``lr`` it is ``lr`` times the gradient. Non-trainable state (BatchNorm's moving
statistics) does not travel here.

Two places for a defense, both running leakbench's own code:

* `DefenseMod`, a Flower client-side mod (``ClientApp(mods=[DefenseMod("gaussian",
  sigma=0.1)])``): any registered defense that acts on the update alone (batch level, no
  `Defense.prepare`, no `Defense.needs_view`, no `Defense.architecture`), built-in or plugin,
  with the parameters of a ``[[defense]]`` table. It replaces the reply's weights by ``w_0 -
  defense(w_0 - w_S)``.
* `LocalClient`, the client's local step itself (``defense=`` given): every defense, including
  the example-level ones (``dpsgd`` clips each example's gradient, so it must act inside the
  training step, not on the finished update), Soteria, MixUp and PRECODE's extended model,
  through `leakbench.client.observer`, the function that computes the benchmark's observed
  update. Under FedSGD (one local step) the client then shares ``w_0 - lr * defended
  gradient``, under FedAvg ``w_0 - defended change``.

Seeds. The defense's draw for client ``c`` in round ``r`` is keyed by
``leakbench.core.seeds.client_draw(seed, r, c)`` (`round_draw`): the draw of a benchmark trial
with run seed ``seed`` and batch ``r`` for client 0, with ``c`` folded in for the others. The
client number is the node's ``partition-id`` (Flower's simulation sets it; give it to a
SuperNode with ``--node-config "partition-id=0"``), else its node id. The key is a tensor
passed to one ``tf.function`` per defense configuration and process, cached at module level
because Flower builds the ``ClientApp`` (and its mods) anew for each message: nothing retraces
from round to round (`DefenseMod.tracing_count`).

The audit. `LeakageAuditor` wraps any message-API strategy (``flwr.serverapp.strategy``).
In the rounds and for the clients chosen it runs a leakbench attack on the update the server
received (weights sent minus weights returned, attacked as leakbench's FedAvg threat model:
the attack simulates the clients' known local steps), scores the reconstruction against the
client's real examples (``private_data``: the audit needs them, as a benchmark does) and writes
``trials.csv``, ``utility.csv`` (empty), ``leaderboard.csv``, ``arrays/`` and ``figures/``
through leakbench's own writers, with ``audit.json`` naming the deployment, rounds and clients.
In those tables ``seed`` holds the client and ``batch_index`` the round. With
``save_models=True`` it also keeps each audited round's global model and the audited clients'
examples in ``models/``, which `leakbench.integrations.flower_checkpoints.attack_checkpoint`
attacks again as a benchmark run, with the auditor's numbers.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import logging
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pandas as pd
import tensorflow as tf

from leakbench.attacks import Attack, AttackTarget, attacks_of, make_attack
from leakbench.attacks.suite import PROTOCOL
from leakbench.client.update import check_model, local_weights, observer
from leakbench.client.weights import acts_on_update
from leakbench.components.lpips import DEFAULT_VARIANT
from leakbench.components.lpips_weights import VARIANTS
from leakbench.components.models import build_model
from leakbench.components.saved_models import model_sha256
from leakbench.core.canonical import canonical_json
from leakbench.core.environment import ENVIRONMENT_FILE, describe_environment
from leakbench.core.errors import ConfigError
from leakbench.core.federated import LocalTraining
from leakbench.core.files import write_text
from leakbench.core.seeds import MAX_SEED, attack_seed, client_draw
from leakbench.core.versions import ENGINE_VERSION
from leakbench.datasets import load_dataset
from leakbench.defenses import DEFENSES, Defense, NoDefense, make_defense
from leakbench.integrations.flower_checkpoints import attack_checkpoint, save_batch, save_model
from leakbench.outputs.arrays import encode_trial, export_arrays
from leakbench.outputs.figures import write_figures
from leakbench.outputs.tables import (
    LEADERBOARD_COLUMNS,
    TRIAL_COLUMNS,
    UTILITY_COLUMNS,
    leaderboard,
    write_csv,
)
from leakbench.run.config import check_values, record_text, threat_table
from leakbench.run.execute import trial_rows
from leakbench.run.plan import Setting, Trial
from leakbench.run.reading import read_components, read_threat_model
from leakbench.run.rundir import writable_dir

FLOWER_MISSING = (
    "the Flower integration needs the flower extra: pip install 'leakbench[flower]' "
    "(flwr[simulation])"
)

try:
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType
    from flwr.serverapp.strategy import Strategy
except ImportError:
    raise ConfigError(FLOWER_MISSING) from None

# The ConfigRecord a leakbench client adds to its train reply: who it is, which round, which
# defense and seed (FedAvg and the other message-API strategies ignore extra ConfigRecords).
RECORD = "leakbench"
# Train-config keys the server sends and `LocalClient` reads (`train_config` writes them).
LOCAL_STEPS, LOCAL_LR, LOCAL_BATCH = "local-steps", "local-lr", "local-batch-size"
BATCH_SIZE = "batch-size"
ROUND = "server-round"  # what Flower's strategies put into every train config
AUDIT_FILE = "audit.json"
# One local SGD step at 0.1: the clients' local training unless the server says otherwise.
FEDSGD = LocalTraining()
# A node without a partition-id is numbered by its node id, reduced into int64 range.
_NODE_MOD = 1 << 62

logger = logging.getLogger("flwr")


def flower_version() -> str:
    """The installed flwr's version."""
    return importlib.metadata.version("flwr")


# ---------------------------------------------------------------------------------------------
# Both sides: the wire format and the keys of the draws.


def model_record(model: keras.Model) -> ArrayRecord:
    """The model's trainable weights as an ``ArrayRecord`` keyed by variable path, in
    ``model.trainable_variables`` order (what the clients and the auditor exchange)."""
    return ArrayRecord({v.path: Array(np.asarray(v.numpy())) for v in model.trainable_variables})


def record_arrays(record: ArrayRecord) -> list[np.ndarray]:
    """The arrays of a record, in its order."""
    return [array.numpy() for array in record.values()]


def set_trainable(model: keras.Model, arrays: Sequence[np.ndarray]) -> None:
    """Assigns ``arrays`` (in ``model.trainable_variables`` order) to the model's trainable
    variables; a ``ValueError`` names the first that does not fit."""
    variables = model.trainable_variables
    if len(arrays) != len(variables):
        raise ValueError(
            f"{len(arrays)} arrays for the {len(variables)} trainable variables of {model.name}"
        )
    for variable, array in zip(variables, arrays, strict=True):
        if tuple(array.shape) != tuple(variable.shape):
            raise ValueError(
                f"array of shape {tuple(array.shape)} for {variable.path} of shape "
                f"{tuple(variable.shape)}"
            )
        variable.assign(array)


def round_draw(seed: int, server_round: int, client: int) -> tf.Tensor:
    """The stateless key of client ``client``'s defense draw in round ``server_round``
    (`leakbench.core.seeds.client_draw` with the round as the batch), as int64 whatever the client
    (a folded key comes back as int32, and a second dtype would be a second trace; the
    defenses cast their key to int64 anyway, so the draws are the same)."""
    return tf.cast(client_draw(seed, server_round, client), tf.int64)


def client_number(context: Any) -> int:
    """The node's client number: its ``partition-id`` node config if it has one, else its
    node id (reduced below 2**62)."""
    partition = context.node_config.get("partition-id")
    if partition is not None:
        return int(partition)
    return int(context.node_id) % _NODE_MOD


def server_round(msg: Message) -> int:
    """The round a train message belongs to (Flower's strategies send ``server-round``)."""
    for record in msg.content.config_records.values():
        if ROUND in record:
            return _record_int(record[ROUND], f"the train message's {ROUND!r}")
    raise ValueError(f"the train message carries no {ROUND!r} in a ConfigRecord")


def _record_int(value: object, what: str) -> int:
    """A ConfigRecord value read as an integer (a record may also hold bytes and lists)."""
    if not isinstance(value, int | float | str):
        raise ValueError(f"{what} is {value!r}, not a number")
    return int(value)


def _check_seed(seed: Any, owner: str) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
        raise ConfigError(f"{owner}: seed must be an integer in [0, {MAX_SEED}], got {seed!r}")
    return seed


def _build_defense(defense: str | Defense, params: dict[str, Any], owner: str) -> Defense:
    if isinstance(defense, Defense):
        if params:
            raise ConfigError(f"{owner}: give parameters with a defense name, not an instance")
        return defense
    if not isinstance(defense, str):
        raise ConfigError(f"{owner}: defense must be a registered name, got {defense!r}")
    return make_defense(defense, **params)


def _defense_record(defense: Defense, seed: int, client: int, rnd: int, where: str) -> dict:
    return {
        "client": client,
        "round": rnd,
        "defense": defense.name,
        "defense-params": canonical_json(defense.params()),
        "seed": seed,
        "where": where,
        "engine": ENGINE_VERSION,
    }


def _single_array_record(content: Any, what: str) -> tuple[str, ArrayRecord]:
    records = content.array_records
    if len(records) != 1:
        raise ValueError(f"{what} must carry exactly one ArrayRecord, found {len(records)}")
    return next(iter(records.items()))


# ---------------------------------------------------------------------------------------------
# The client side.


# One traced function per defense configuration in this process (Flower rebuilds the
# ClientApp, and so every mod, for each message, so an instance's own tf.function would be
# traced anew every round).
_DEFENDERS: dict[str, Any] = {}
# Traces of each configuration's function in this process, counted by the trace itself (a
# Python side effect runs once per trace, never per call), so a dropped function's traces count.
_TRACES: dict[str, int] = {}


def _key(defense: Defense) -> str:
    return canonical_json([defense.name, defense.params()])


def _defender(defense: Defense) -> Any:
    key = _key(defense)
    if key not in _DEFENDERS:

        def defend(
            sent: list[tf.Tensor], returned: list[tf.Tensor], seed: tf.Tensor
        ) -> tuple[list[tf.Tensor], list[tf.Tensor]]:
            _TRACES[key] = _TRACES.get(key, 0) + 1
            change = [w0 - w for w0, w in zip(sent, returned, strict=True)]
            defended = list(defense.apply(change, seed=seed))
            return defended, [w0 - d for w0, d in zip(sent, defended, strict=True)]

        _DEFENDERS[key] = tf.function(defend)
    return _DEFENDERS[key]


class DefenseMod:
    """A Flower client-side mod that passes the client's update through a leakbench defense.

    ``DefenseMod("gaussian", sigma=0.1)`` takes a registered defense name and the parameters a
    ``[[defense]]`` table would give (validated now, so a wrong name or value is one
    `leakbench.core.errors.LeakbenchError` line before any round), or a `Defense` instance. For a
    train message it lets the ClientApp run, then replaces the weights ``w_S`` of its reply by
    ``w_0 - defense(w_0 - w_S)``, keyed by `round_draw` (``seed``, the round, the client), and
    adds the ``leakbench`` ConfigRecord that tells the auditor what the client did. Other
    messages pass through untouched.

    Defenses that need more than the update (``dpsgd`` and other example-level ones, Soteria,
    MixUp, PRECODE) are refused: give them to `LocalClient`, which runs them inside the
    client's training step.
    """

    def __init__(self, defense: str | Defense, /, *, seed: int = 0, **params: Any) -> None:
        owner = "DefenseMod"
        self.defense = _build_defense(defense, params, owner)
        self.seed = _check_seed(seed, owner)
        if not acts_on_update(self.defense):
            raise ConfigError(
                f"{owner}: defense {self.defense.name} acts on more than the finished update "
                "(per example, on the batch or on the model); give it to LocalClient(defense=...) "
                "so that it runs inside the client's training step"
            )
        _defender(self.defense)

    def tracing_count(self) -> int:
        """How often this process has traced the defense's function (1 after the first
        round, whatever the number of rounds, for updates of one shape)."""
        return _TRACES.get(_key(self.defense), 0)

    def defend(
        self, sent: Sequence[np.ndarray], returned: Sequence[np.ndarray], client: int, rnd: int
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """The defended change ``defense(w_0 - w_S)`` and the weights ``w_0 - defended`` the
        client sends instead of ``returned``."""
        defended, weights = _defender(self.defense)(
            [tf.constant(a) for a in sent],
            [tf.constant(a) for a in returned],
            round_draw(self.seed, rnd, client),
        )
        return [np.asarray(d) for d in defended], [np.asarray(w) for w in weights]

    def __call__(self, msg: Message, context: Any, call_next: Callable) -> Message:
        if msg.metadata.message_type.split(".")[0] != MessageType.TRAIN:
            return call_next(msg, context)
        sent_key, sent = _single_array_record(msg.content, "a train message")
        reply = call_next(msg, context)
        if reply.has_error():
            return reply
        key, returned = _single_array_record(reply.content, "the ClientApp's train reply")
        if list(returned.keys()) != list(sent.keys()):
            raise ValueError(
                f"DefenseMod: the reply's ArrayRecord {key!r} must have the keys of the "
                f"{sent_key!r} record the server sent, in its order"
            )
        client, rnd = client_number(context), server_round(msg)
        _, weights = self.defend(record_arrays(sent), record_arrays(returned), client, rnd)
        reply.content[key] = ArrayRecord(
            {k: Array(w) for k, w in zip(returned.keys(), weights, strict=True)}
        )
        reply.content[RECORD] = ConfigRecord(
            _defense_record(self.defense, self.seed, client, rnd, "mod")
        )
        return reply


def train_config(local: LocalTraining = FEDSGD, batch_size: int = 1, **extra: Any) -> ConfigRecord:
    """The train ConfigRecord that tells `LocalClient` its local training and batch size (the
    server knows them, as leakbench's FedAvg threat model assumes)."""
    return ConfigRecord(
        {
            LOCAL_STEPS: local.steps,
            LOCAL_LR: float(local.lr),
            LOCAL_BATCH: local.batch_size,
            BATCH_SIZE: batch_size,
            **extra,
        }
    )


def local_training(msg: Message) -> LocalTraining:
    """The local training a train message asks for (`train_config`'s keys; FedSGD at 0.1 by
    default)."""
    config: dict[str, Any] = {}
    for record in msg.content.config_records.values():
        config.update(record)
    return LocalTraining(
        int(config.get(LOCAL_STEPS, 1)),
        float(config.get(LOCAL_LR, 0.1)),
        int(config.get(LOCAL_BATCH, 0)),
    )


# (model name, shape, classes, defense) -> LocalClient, one per process (see _DEFENDERS).
_CLIENTS: dict[str, LocalClient] = {}


class LocalClient:
    """A Keras client's local training through leakbench's own client code.

    ``train(sent, images, labels, local, client, rnd)`` starts from the weights ``sent``,
    runs the local training and returns the weights to send back:

    * without a defense (`NoDefense`, for use under `DefenseMod`): ``w_S`` after
      ``local.steps`` plain SGD steps (`leakbench.client.local_weights`), so that the mod's
      ``w_0 - w_S`` is leakbench's `leakbench.client.local_change` bit for bit;
    * with a defense: the defended update of `leakbench.client.observer` (the benchmark's
      observed update, every defense supported), sent as ``w_0 - lr * defended gradient``
      under FedSGD and ``w_0 - defended change`` under FedAvg.

    `shared` returns one instance per configuration and process, whose functions are traced
    once per batch shape.
    """

    def __init__(
        self,
        model: str = "lenet",
        *,
        input_shape: tuple[int, int, int],
        num_classes: int,
        defense: str | Defense = "none",
        seed: int = 0,
        **params: Any,
    ) -> None:
        owner = "LocalClient"
        self.defense = _build_defense(defense, params, owner)
        self.seed = _check_seed(seed, owner)
        if self.defense.architecture is not None:
            raise ConfigError(
                f"{owner}: defense {self.defense.name} changes the model, which the server's "
                "model and the auditor's would have to follow; not supported in Flower yet"
            )
        self.model_name = model
        self.model = build_model(model, input_shape, num_classes, seed=0)
        self.num_classes = num_classes
        self._functions: dict[LocalTraining, Any] = {}

    @classmethod
    def shared(
        cls,
        model: str = "lenet",
        *,
        input_shape: tuple[int, int, int],
        num_classes: int,
        defense: str | Defense = "none",
        seed: int = 0,
        **params: Any,
    ) -> LocalClient:
        """The process's `LocalClient` of this configuration (built on first use), so that a
        ClientApp rebuilt for every message keeps one model and its traced functions."""
        built = _build_defense(defense, params, "LocalClient")
        key = canonical_json(
            [model, list(input_shape), num_classes, built.name, built.params(), seed]
        )
        if key not in _CLIENTS:
            _CLIENTS[key] = cls(
                model, input_shape=input_shape, num_classes=num_classes, defense=built, seed=seed
            )
        return _CLIENTS[key]

    def _function(self, local: LocalTraining) -> Any:
        if local not in self._functions:
            if isinstance(self.defense, NoDefense):
                self._functions[local] = tf.function(
                    lambda x, y, seed: local_weights(self.model, x, y, local)
                )
            else:
                self._functions[local] = observer(self.defense, self.model, local)
        return self._functions[local]

    def tracing_count(self) -> int:
        """How often this client's local-training functions have been traced in all."""
        return sum(int(f.experimental_get_tracing_count()) for f in self._functions.values())

    def train(
        self,
        sent: Sequence[np.ndarray],
        images: np.ndarray,
        labels: np.ndarray,
        local: LocalTraining,
        client: int,
        rnd: int,
    ) -> list[np.ndarray]:
        """The weights the client sends back after its local training on ``images``."""
        check_model(self.model, [self.defense], len(images), local)
        if self.defense.level == "example" and not local.fedsgd:
            raise ConfigError(
                f"LocalClient: defense {self.defense.name} acts per example, which leakbench's "
                "client supports under FedSGD (local-steps = 1) only"
            )
        set_trainable(self.model, sent)
        step = self._function(local)
        out = step(
            tf.constant(images, tf.float32),
            tf.one_hot(np.asarray(labels, np.int64), self.num_classes),
            round_draw(self.seed, rnd, client),
        )
        if isinstance(self.defense, NoDefense):
            return [np.asarray(w) for w in out]
        start = [tf.constant(a) for a in sent]
        if local.fedsgd:
            return [np.asarray(w0 - local.lr * g) for w0, g in zip(start, out, strict=True)]
        return [np.asarray(w0 - c) for w0, c in zip(start, out, strict=True)]

    def reply(self, msg: Message, context: Any, images: np.ndarray, labels: np.ndarray) -> Message:
        """The train reply to ``msg``: the weights after local training on ``images`` (the
        local training `local_training` reads from the message), ``num-examples`` and, with a
        defense, the ``leakbench`` ConfigRecord."""
        from flwr.app import MetricRecord, RecordDict

        key, sent = _single_array_record(msg.content, "a train message")
        client, rnd = client_number(context), server_round(msg)
        weights = self.train(record_arrays(sent), images, labels, local_training(msg), client, rnd)
        content: dict[str, ArrayRecord | MetricRecord | ConfigRecord] = {
            key: ArrayRecord({k: Array(w) for k, w in zip(sent.keys(), weights, strict=True)}),
            "metrics": MetricRecord({"num-examples": len(images)}),
        }
        if not isinstance(self.defense, NoDefense):
            content[RECORD] = ConfigRecord(
                _defense_record(self.defense, self.seed, client, rnd, "client step")
            )
        return Message(RecordDict(content), reply_to=msg)


def mark_undefended(reply: Message, context: Any, msg: Message) -> Message:
    """Adds the ``leakbench`` ConfigRecord of a client without a leakbench defense (defense
    ``none``), so that the auditor knows which client sent ``reply``."""
    if RECORD not in reply.content.config_records:
        reply.content[RECORD] = ConfigRecord(
            _defense_record(NoDefense(), 0, client_number(context), server_round(msg), "none")
        )
    return reply


# ---------------------------------------------------------------------------------------------
# The server side: the auditor.


@dataclasses.dataclass(frozen=True)
class _Declared:
    """A defense as a client declared it (name and parameters), for the tables' columns."""

    name: str
    declared: str  # canonical JSON
    architecture: Any = None

    def params(self) -> dict[str, Any]:
        return json.loads(self.declared)


@dataclasses.dataclass
class AuditedTrial:
    """One audited update: its round, client, node, defense and headline scores."""

    round: int
    client: int
    node_id: int
    defense: str
    defense_params: str
    psnr: float
    label_acc: float
    seconds: float
    # What reproduces it (`leakbench.integrations.flower_checkpoints`): the client's defense
    # seed, where its defense ran, and with save_models the files of the round's model and batch.
    defense_seed: int = 0
    where: str = ""
    model_file: str | None = None
    batch_file: str | None = None


class LeakageAuditor(Strategy):
    """A strategy wrapper that attacks chosen clients' updates in chosen rounds.

    Every call goes to ``strategy``; in the audited ``rounds`` the auditor keeps the weights
    the server sends (`configure_train`) and, before ``strategy`` aggregates the replies, runs
    ``attack`` on the update of each audited client (``clients``, numbered as `client_number`
    numbers them, read from the reply's ``leakbench`` record) and writes the tables into
    ``out`` (see the module docstring). Everything is checked when the auditor is built, before
    any round: the names and parameters, the model against the attack, ``out``.

    Args:
        strategy: The deployment's message-API strategy (``flwr.serverapp.strategy``).
        out: The audit's directory (created; one holding a `leakbench run` is refused).
        private_data: ``(client, round) -> (images, labels)`` or ``(images, labels, indices)``:
            the examples behind the client's update in that round, which the scores compare
            the reconstruction with (NHWC float in [0, 1], int labels).
        dataset: The leakbench dataset the clients' examples come from (its shape and
            classes; its name fills the ``dataset`` column).
        model: The leakbench model name the deployment trains.
        attack: An attack name (with ``attack_params``) or an `Attack`.
        rounds: The rounds audited (1 is the first).
        clients: The clients audited.
        local: The clients' local training, which the server knows (`train_config`).
        batch_size: Examples behind each audited update.
        deployment: A name for the deployment (letters, digits, - and _): the ``run`` column.
        labels_known: Whether the attack is given the private labels.
        lpips: The LPIPS backbone of the scores, or "none".
        success_mse: The MSE at or below which a reconstruction counts as recovered.
        figures: Whether to draw `leakbench.outputs.figures` after the last audited round.
        save_models: Whether to keep each audited round's inputs in ``out/models/``: the global
            model the server sent (``round-<r>.keras``) and each audited client's examples
            (``round-<r>-client-<c>.npz``), each written atomically, for
            `leakbench.integrations.flower_checkpoints.attack_checkpoint`.
    """

    def __init__(
        self,
        strategy: Strategy,
        *,
        out: str | Path,
        private_data: Callable[[int, int], tuple[np.ndarray, ...]],
        dataset: str = "digits",
        model: str = "lenet",
        attack: str | Attack = "idlg",
        attack_params: dict[str, Any] | None = None,
        rounds: Iterable[int] = (1,),
        clients: Iterable[int] = (0,),
        local: LocalTraining = FEDSGD,
        batch_size: int = 1,
        deployment: str = "flower",
        labels_known: bool = False,
        lpips: str = "none",
        success_mse: float = 1e-3,
        figures: bool = True,
        save_models: bool = False,
    ) -> None:
        owner = "LeakageAuditor"
        if not isinstance(strategy, Strategy):
            raise ConfigError(f"{owner}: strategy must be a flwr.serverapp.strategy.Strategy")
        if not callable(private_data):
            raise ConfigError(f"{owner}: private_data must be a function (client, round)")
        if isinstance(attack, Attack):
            if attack_params:
                raise ConfigError(f"{owner}: give attack_params with an attack name")
            self.attack = attack
        else:
            self.attack = make_attack(attack, **(attack_params or {}))
        self.rounds = _positive_ints(rounds, f"{owner}: rounds", 1)
        self.clients = _positive_ints(clients, f"{owner}: clients", 0)
        _check_arguments(deployment, lpips, success_mse, batch_size, save_models)
        self.attack.check_batch_size(batch_size)
        self.strategy = strategy
        self.private_data = private_data
        self.local = local
        self.batch_size = batch_size
        self.deployment = deployment
        self.labels_known = bool(labels_known)
        self.lpips = lpips
        self.success_mse = float(success_mse)
        self.draw_figures = figures
        self.save_models = save_models
        self._model_files: dict[int, str] = {}
        data = load_dataset(dataset)
        self.dataset = dataset
        self.input_shape = data.input_shape
        self.num_classes = data.num_classes
        self.model_name = model
        self.model = build_model(model, self.input_shape, self.num_classes, seed=0)
        self.attack.check_model(self.model, self.input_shape)
        self.out = Path(out)
        _prepare_audit_dir(self.out)
        # The audit's threat model as ``[threat_model]`` keys (`_record`).
        self._threat = {
            "labels_known": self.labels_known,
            "local_steps": local.steps,
            "local_lr": local.lr,
            "local_batch_size": local.batch_size,
        }
        self._sent: dict[int, tuple[list[str], list[np.ndarray]]] = {}
        self._checked = False
        self._rows: list[dict[str, Any]] = []
        self._blobs: dict[tuple[int, int, str], bytes] = {}
        self._defenses: dict[str, _Declared] = {}
        self.trials: list[AuditedTrial] = []
        self.skipped_figures: dict[str, str] = {}
        self.figures: list[Path] = []
        self._record()  # the audit's record is checked before any round

    # The Strategy interface: everything goes to the wrapped strategy.

    def summary(self) -> None:
        self.strategy.summary()
        logger.info(
            "leakbench audit: %s (%s) on rounds %s, clients %s, into %s",
            self.attack.name,
            canonical_json(self.attack.params()),
            list(self.rounds),
            list(self.clients),
            self.out,
        )

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Any
    ) -> Iterable[Message]:
        if not self._checked:
            # The first weights the server sends must fit the model the attack attacks.
            try:
                set_trainable(self.model, record_arrays(arrays))
            except ValueError as err:
                raise ConfigError(
                    f"LeakageAuditor: the deployment's weights do not fit model "
                    f"{self.model_name}: {err}"
                ) from None
            self._checked = True
        if server_round in self.rounds:
            self._sent[server_round] = (list(arrays.keys()), record_arrays(arrays))
            if self.save_models:
                set_trainable(self.model, self._sent[server_round][1])
                self._model_files[server_round] = save_model(self.model, self.out, server_round)
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> Any:
        replies = list(replies)
        if server_round in self._sent:
            self._audit(server_round, replies)
            del self._sent[server_round]
            if server_round == max(self.rounds) and self.draw_figures:
                self._write_figures()
        return self.strategy.aggregate_train(server_round, replies)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Any
    ) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> Any:
        return self.strategy.aggregate_evaluate(server_round, replies)

    # The audit.

    def _audit(self, rnd: int, replies: list[Message]) -> None:
        keys, sent = self._sent[rnd]
        for reply in replies:
            if reply.has_error():
                continue
            declared = reply.content.config_records.get(RECORD)
            node = int(reply.metadata.src_node_id)
            if declared is None:
                logger.warning(
                    "leakbench audit: the reply of node %d carries no %r record (no DefenseMod, "
                    "LocalClient or mark_undefended): not audited",
                    node,
                    RECORD,
                )
                continue
            client = _record_int(declared["client"], f"node {node}'s declared 'client'")
            if client not in self.clients:
                continue
            _, returned = _single_array_record(reply.content, "a train reply")
            if list(returned.keys()) != keys:
                raise ValueError(f"leakbench audit: node {node} replied with other arrays")
            observed = [a - b for a, b in zip(sent, record_arrays(returned), strict=True)]
            defense = _Declared(str(declared["defense"]), str(declared["defense-params"]))
            seed = _record_int(declared["seed"], f"node {node}'s declared 'seed'")
            origin = (seed, str(declared["where"]))
            self._attack_one(rnd, client, node, sent, observed, defense, origin)
        self._write_tables()

    def _attack_one(
        self,
        rnd: int,
        client: int,
        node: int,
        sent: list[np.ndarray],
        observed: list[np.ndarray],
        defense: _Declared,
        origin: tuple[int, str],
    ) -> None:
        data = self.private_data(client, rnd)
        x, y = np.asarray(data[0], np.float32), np.asarray(data[1], np.int64)
        indices = tuple(int(i) for i in (data[2] if len(data) > 2 else range(len(x))))
        if x.shape != (self.batch_size, *self.input_shape) or y.shape != (self.batch_size,):
            raise ValueError(
                f"leakbench audit: private_data({client}, {rnd}) gave images {x.shape} and "
                f"labels {y.shape}; expected {self.batch_size} examples of {self.input_shape}"
            )
        set_trainable(self.model, sent)
        target = AttackTarget(
            model=self.model,
            gradients=tuple(tf.constant(o) for o in observed),
            input_shape=self.input_shape,
            batch_size=self.batch_size,
            num_classes=self.num_classes,
            labels=y if self.labels_known else None,
            local=self.local,
        )
        (rec,) = self.attack.attack_many([target], [attack_seed(client, rnd)])
        self._defenses.setdefault(canonical_json([defense.name, defense.declared]), defense)
        self._record()  # a declared defense the record cannot hold is refused before its rows
        trial = Trial(self._setting(), client, rnd, indices, defense, self.attack, self.batch_size)  # type: ignore[arg-type]
        rows, matched = trial_rows(trial, y, x, rec, lpips=self.lpips)
        self._rows += rows
        self._blobs[(client, rnd, trial.cell_id)] = encode_trial(x, matched, rec.loss_history)
        psnr = float(np.mean([r["psnr"] for r in rows]))
        files: tuple[str | None, str | None] = (None, None)
        if self.save_models:
            files = (self._model_files[rnd], save_batch(self.out, rnd, client, x, y, indices))
        self.trials.append(
            AuditedTrial(
                rnd, client, node, defense.name, defense.declared, psnr,
                float(rows[0]["label_acc"]), float(rec.seconds), *origin, *files,
            )
        )  # fmt: skip
        logger.info(
            "leakbench audit: round %d, client %d (node %d, %s %s): %s PSNR %.1f dB, label "
            "accuracy %.2f, %s in %.1f s",
            rnd, client, node, defense.name, defense.declared, self.attack.name, psnr,
            rows[0]["label_acc"], rec.status, rec.seconds,
        )  # fmt: skip

    def _record(self) -> dict[str, Any]:
        """The audit written as a leakbench run's resolved config, what ``config.toml`` holds:
        the keys, in the order and with the defaults, that `RunSpec.to_toml` writes for the
        run of these settings. Each part is checked by the config's own readers (the values
        by their declared kinds, the threat model as ``[threat_model]``, the attack and the
        clients' declared defenses as ``[[attack]]`` and ``[[defense]]`` tables, defaults
        filled in); nothing checks them together, as for a run that leakbench plans, and no
        `RunSpec` is built: this is a record of what the auditor ran."""
        values = check_values(
            {
                "name": self.deployment,
                "dataset": self.dataset,
                "model": self.model_name,
                "images": max(1, len(self.trials)) * self.batch_size,
                "batch_size": self.batch_size,
                "seeds": list(self.clients),
                "success_mse": self.success_mse,
                "parallel_trials": 1,
                "lpips": self.lpips,
            }
        )
        threat = read_threat_model(self._threat)
        attack = [_as_toml({"name": self.attack.name, **self.attack.params()})]
        declared = [_as_toml({"name": d.name, **d.params()}) for d in self._defenses.values()]
        attacks = read_components(attack, "attack", attacks_of("image"))
        defenses = read_components(declared or [{"name": "none"}], "defense", DEFENSES)
        return {
            "name": values["name"],
            "dataset": values["dataset"],
            "model": values["model"],
            "images": values["images"],
            "batch_size": values["batch_size"],
            "seeds": list(values["seeds"]),
            "success_mse": values["success_mse"],
            "parallel_trials": values["parallel_trials"],
            # Written only when not the default, as a run's record writes it.
            **({"lpips": values["lpips"]} if values["lpips"] != DEFAULT_VARIANT else {}),
            "suite": "standard",  # the default suite, whose protocol a run's record states
            "protocol": PROTOCOL,
            "attack": [{"name": c.name, **c.params} for c in attacks],
            "defense": [{"name": c.name, **c.params} for c in defenses],
            "training": {"enabled": False},
            "threat_model": threat_table(threat),
        }

    def _setting(self) -> Setting:
        """What every audited trial shares (its rows' ``run``, ``dataset`` and ``model``, its
        cell's key): the deployment, its data and model, the threat model's departures from
        the default (`leakbench.run.plan.Setting`)."""
        changes = read_threat_model(self._threat).changes()
        return Setting(
            self.deployment,
            self.dataset,
            self.model_name,
            tuple(sorted(changes.items())),
            model_sha256(self.model_name),
        )

    def manifest(self) -> dict[str, Any]:
        """What ``audit.json`` holds."""
        return {
            "kind": "leakbench audit of a Flower deployment",
            "deployment": self.deployment,
            "note": "an audit of the updates this deployment's clients sent, not a leakbench "
            "benchmark run: seed = the audited client, batch_index = the round",
            "rounds": list(self.rounds),
            "clients": list(self.clients),
            "attack": {"name": self.attack.name, "params": self.attack.params()},
            "threat_model": {
                "update": "weights sent minus weights returned (FedAvg)",
                "local_steps": self.local.steps,
                "local_lr": self.local.lr,
                "local_batch_size": self.local.batch_size,
                "labels_known": self.labels_known,
            },
            "dataset": self.dataset,
            "model": self.model_name,
            "batch_size": self.batch_size,
            "lpips": self.lpips,
            "success_mse": self.success_mse,
            "flwr": flower_version(),
            "engine_version": ENGINE_VERSION,
            "trials": [dataclasses.asdict(t) for t in self.trials],
            "figures": [p.name for p in self.figures],
            "figures_skipped": self.skipped_figures,
        }

    def _write_tables(self) -> None:
        record = self._record()
        frame = pd.DataFrame(self._rows, columns=TRIAL_COLUMNS)
        board = leaderboard(frame, self.success_mse)
        write_csv(frame, self.out / "trials.csv", TRIAL_COLUMNS)
        write_csv(pd.DataFrame(columns=UTILITY_COLUMNS), self.out / "utility.csv", UTILITY_COLUMNS)
        write_csv(board, self.out / "leaderboard.csv", LEADERBOARD_COLUMNS)
        export_arrays(frame, self._blobs, self.out)
        header = (
            f"# leakbench audit of the Flower deployment {self.deployment!r} (see {AUDIT_FILE}):"
            "\n# the attack and threat model of the audit, written as a run config.\n"
        )
        write_text(self.out / "config.toml", header + record_text(record))
        environment = {**describe_environment(), "flwr": flower_version()}
        write_text(self.out / ENVIRONMENT_FILE, json.dumps(environment, indent=2) + "\n")
        self._write_manifest()

    def _write_manifest(self) -> None:
        text = json.dumps(self.manifest(), indent=2, sort_keys=False, default=_plain)
        write_text(self.out / AUDIT_FILE, text + "\n")

    def _write_figures(self) -> None:
        if not self._rows:
            return
        written, skipped = write_figures(self.out)
        self.figures = [p for p in written if p.suffix == ".png"]
        self.skipped_figures = skipped
        for name, why in skipped.items():
            logger.info("leakbench audit: figure %s skipped: %s", name, why)
        self._write_manifest()


def _as_toml(value: Any) -> Any:
    """``value`` as a TOML document holds it (as a config's reader gets it): mappings as dicts,
    tuples as lists."""
    if isinstance(value, Mapping):
        return {key: _as_toml(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_as_toml(item) for item in value]
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    raise TypeError(f"{type(value).__name__} is not JSON")


def _check_arguments(
    deployment: str, lpips: str, success_mse: float, batch_size: int, save_models: bool
) -> None:
    """Refuses a `LeakageAuditor` argument in one line naming it."""
    owner = "LeakageAuditor"
    if not deployment or not all(ch.isalnum() or ch in "-_" for ch in deployment):
        raise ConfigError(
            f"{owner}: deployment must be letters, digits, - and _, got {deployment!r}"
        )
    if lpips not in (*VARIANTS, "none"):
        raise ConfigError(f"{owner}: lpips must be one of {', '.join(VARIANTS)} or none")
    if not (isinstance(success_mse, (int, float)) and success_mse > 0):
        raise ConfigError(f"{owner}: success_mse must be a number > 0, got {success_mse!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ConfigError(f"{owner}: batch_size must be an integer >= 1, got {batch_size!r}")
    if not isinstance(save_models, bool):
        raise ConfigError(f"{owner}: save_models must be true or false, got {save_models!r}")


def _positive_ints(values: Iterable[int], label: str, low: int) -> tuple[int, ...]:
    try:
        items = tuple(values)
    except TypeError:
        raise ConfigError(f"{label} must be a list of integers >= {low}, got {values!r}") from None
    if not items or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= low for v in items
    ):
        raise ConfigError(f"{label} must be a non-empty list of integers >= {low}, got {items!r}")
    return tuple(sorted(set(items)))


def _prepare_audit_dir(out: Path) -> None:
    if (out / "config.toml").exists() and not (out / AUDIT_FILE).exists():
        raise ConfigError(
            f"LeakageAuditor: {out} holds a leakbench run, not an audit; choose another out"
        )
    writable_dir(out, "LeakageAuditor:")


def simulation_backend(num_cpus: int = 2, client_cpus: float | None = None) -> dict[str, Any]:
    """A ``backend_config`` for ``flwr.simulation.run_simulation`` on this machine: a new
    private Ray instance (never one another program left running) with ``num_cpus`` CPUs and
    no dashboard; each ClientApp gets ``client_cpus`` (default all of them, so one actor
    process runs every client, one after the other: one TensorFlow start-up, one trace)."""
    return {
        "init_args": {
            "address": "local",
            "num_cpus": num_cpus,
            "include_dashboard": False,
            "logging_level": logging.ERROR,
            "log_to_driver": False,
        },
        "client_resources": {"num_cpus": client_cpus or num_cpus, "num_gpus": 0.0},
    }


__all__ = [
    "FLOWER_MISSING",
    "AuditedTrial",
    "DefenseMod",
    "LeakageAuditor",
    "LocalClient",
    "acts_on_update",
    "attack_checkpoint",
    "client_number",
    "flower_version",
    "local_training",
    "mark_undefended",
    "model_record",
    "record_arrays",
    "round_draw",
    "server_round",
    "set_trainable",
    "simulation_backend",
    "train_config",
]
