"""A Flower deployment's global models as checkpoints, and an audited round as a benchmark run.

With ``LeakageAuditor(save_models=True)`` (`leakbench.integrations.flower`) the auditor keeps,
in ``OUT/models/``, each audited round's inputs: ``round-<r>.keras``, the global model the
server sent in round ``r`` (the model the auditor attacks: its trainable weights as sent), and
``round-<r>-client-<c>.npz``, the examples behind client ``c``'s update in that round (``x``,
``y`` and their ``indices`` as ``private_data`` gave them). Each file is written to a temporary
name in the folder and renamed, so a crash never leaves a half-written file under its name.
``audit.json`` names both files in each audited trial, with the defense the client declared,
its seed and where it ran.

`attack_checkpoint` attacks a saved round through `leakbench.audit`, the benchmark's own run on
the saved model, and gives the auditor's numbers for that round and client bit for bit: the
benchmark's client that sends its weights (``[threat_model] shares = "weights"``,
`leakbench.client.weights`) recomputes the update the Flower client sent, and the seeds line
up. The auditor draws client ``c``'s defense in round ``r`` from
``client_draw(seed, r, c)`` and starts its attack from ``attack_seed(c, r)``; a benchmark trial
of run seed ``s`` and batch ``b`` from ``client_draw(s, b, 0)`` and ``attack_seed(s, b)``. So
the run seed is the client and the batch index the round (``first_batch = r``), which gives
both draws when the client is 0 and its defense seed 0, or when it has no defense (nothing is
drawn); other clients' draws are refused, as no benchmark trial makes them.

No Flower import: the files are read without ``flwr`` installed.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import keras
import numpy as np

from leakbench.client.weights import acts_on_update
from leakbench.core.errors import ConfigError
from leakbench.core.files import atomic_file, file_mode
from leakbench.core.seeds import private_indices
from leakbench.defenses import make_defense
from leakbench.run.audit import AuditResult, audit

MODELS = "models"
AUDIT_FILE = "audit.json"
OWNER = "attack_checkpoint"


def model_file(rnd: int) -> str:
    """The checkpoint of round ``rnd``, relative to the audit's directory."""
    return f"{MODELS}/round-{rnd}.keras"


def batch_file(rnd: int, client: int) -> str:
    """The examples of ``client`` in round ``rnd``, relative to the audit's directory."""
    return f"{MODELS}/round-{rnd}-client-{client}.npz"


def save_model(model: keras.Model, out: Path, rnd: int) -> str:
    """Saves ``model`` as round ``rnd``'s checkpoint under ``out``, atomically; returns its
    relative path."""
    name = model_file(rnd)
    path = out / name
    path.parent.mkdir(parents=True, exist_ok=True)
    # Keras names the format by the suffix, so the temporary file ends in .keras too.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".keras", dir=path.parent)
    os.close(fd)
    try:
        model.save(tmp)
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return name


def save_batch(
    out: Path, rnd: int, client: int, x: np.ndarray, y: np.ndarray, indices: tuple[int, ...]
) -> str:
    """Saves a client's examples of round ``rnd`` under ``out``, atomically; returns the
    relative path."""
    name = batch_file(rnd, client)
    (out / MODELS).mkdir(parents=True, exist_ok=True)
    with atomic_file(out / name, "wb") as handle:
        np.savez(handle, x=x, y=y, indices=np.asarray(indices, np.int64))
    return name


def checkpoint_arguments(audit_dir: str | Path, rnd: int, client: int = 0) -> dict[str, Any]:
    """The keyword arguments of `leakbench.audit` that attack the checkpoint of round ``rnd``
    as the auditor attacked ``client``'s update (see the module docstring).

    Raises:
        ConfigError: No such audited round and client, or no saved files for it (the
            auditor ran without ``save_models``), or seeds that no benchmark trial draws.
    """
    folder = Path(audit_dir)
    manifest = _manifest(folder)
    trials = [t for t in manifest["trials"] if (t["round"], t["client"]) == (rnd, client)]
    if not trials:
        audited = sorted({(t["round"], t["client"]) for t in manifest["trials"]})
        raise ConfigError(
            f"{OWNER}: {folder} audited no update of client {client} in round {rnd}; audited "
            f"(round, client): {audited}"
        )
    trial = trials[0]
    if not trial.get("model_file") or not trial.get("batch_file"):
        raise ConfigError(
            f"{OWNER}: {folder} holds no checkpoint of round {rnd}: the auditor saves them with "
            "LeakageAuditor(save_models=True)"
        )
    defense = trial["defense"]
    params = json.loads(trial["defense_params"])
    if defense != "none" and (client, trial["defense_seed"]) != (0, 0):
        raise ConfigError(
            f"{OWNER}: client {client} drew its {defense} noise from defense seed "
            f"{trial['defense_seed']}, a draw no benchmark trial makes; a checkpoint gives the "
            "auditor's numbers for client 0 under defense seed 0, or for a client without a "
            "defense"
        )
    threat = manifest["threat_model"]
    if (
        threat["local_steps"] == 1
        and trial["where"] == "client step"
        and acts_on_update(make_defense(defense, **params))
    ):
        raise ConfigError(
            f"{OWNER}: the client ran {defense} inside its one local step, where the benchmark's "
            "client defends the weight change (as a DefenseMod does); give the defense as a "
            "DefenseMod"
        )
    with np.load(folder / trial["batch_file"], allow_pickle=False) as held:
        x, y = held["x"], held["y"]
    # The run draws its batch as a permutation seeded by the run seed (the client): place the
    # examples so that the draw takes them in the client's order.
    order = private_indices(len(x), len(x), client)
    images, labels = np.empty_like(x), np.empty_like(y)
    images[order], labels[order] = x, y
    return {
        "model": str(folder / trial["model_file"]),
        "images": images,
        "labels": labels,
        "defenses": [{"name": defense, **params}],
        "attacks": [{"name": manifest["attack"]["name"], **manifest["attack"]["params"]}],
        "batch_size": manifest["batch_size"],
        "seeds": [client],
        "first_batch": rnd,
        "threat_model": {
            "shares": "weights",
            "labels_known": threat["labels_known"],
            "local_steps": threat["local_steps"],
            "local_lr": threat["local_lr"],
            "local_batch_size": threat["local_batch_size"],
        },
        "lpips": manifest["lpips"],
        "adaptive": False,
        "name": manifest["deployment"],
    }


def attack_checkpoint(
    audit_dir: str | Path,
    rnd: int,
    client: int = 0,
    *,
    out: str | Path | None = None,
    progress: bool = False,
) -> AuditResult:
    """Attacks the checkpoint of round ``rnd`` with ``client``'s defense through
    `leakbench.audit` (`checkpoint_arguments`): its trials have the auditor's numbers for that
    round and client. ``out`` keeps the run directory (``leakbench run OUT/config.toml``
    reruns it); None runs in a temporary one."""
    return audit(**checkpoint_arguments(audit_dir, rnd, client), out=out, progress=progress)


def _manifest(folder: Path) -> dict[str, Any]:
    path = folder / AUDIT_FILE
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{OWNER}: {folder} holds no {AUDIT_FILE}: not a Flower audit") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"{OWNER}: {path} cannot be read: {err}") from None
    if "lpips" not in manifest:
        raise ConfigError(
            f"{OWNER}: {path} was written by an auditor without checkpoints; audit again with "
            "save_models=True"
        )
    return manifest
