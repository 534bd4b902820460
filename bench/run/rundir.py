"""The run directory: what a run leaves on disk, and the checks before anything is written.

A run directory holds ``config.toml`` (the resolved config), ``shard.json`` for a shard,
``environment.json`` (the latest invocation's environment), ``store.sqlite`` (one entry per
finished trial or training, `leakbench.run.store`), the exported tables (``trials.csv``,
``utility.csv``, ``leaderboard.csv``) and ``arrays/`` for the figures. `prepare_out_dir` refuses
a directory that holds another config or another shard before anything is written;
`check_engine` refuses a store that another engine version wrote (`leakbench.core.versions`);
`export_tables` writes the tables from the store in plan order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import warnings
from pathlib import Path
from typing import Any

import pandas as pd

from leakbench.attacks.suite import PROTOCOL
from leakbench.client.recipes import TrainingConfig
from leakbench.core.environment import ENVIRONMENT_FILE, describe_environment
from leakbench.core.errors import ConfigError, LeakbenchError
from leakbench.core.files import write_text
from leakbench.core.versions import ENGINE_VERSION
from leakbench.datasets import Dataset
from leakbench.outputs.arrays import export_arrays
from leakbench.outputs.board import CONFIG_HASH_KEY, config_sha256
from leakbench.outputs.tables import (
    DETECTION_COLUMNS,
    TRIAL_COLUMNS,
    UTILITY_COLUMNS,
    leaderboard,
    leaderboard_columns,
    write_csv,
)
from leakbench.run.identification import add_flags
from leakbench.run.plan import Training, Trial
from leakbench.run.sections import ThreatModel
from leakbench.run.shard import SHARD_FILE, WHOLE, Shard, read_record, write_record
from leakbench.run.store import Store


def held_config(out: Path) -> str | None:
    """The text of the ``config.toml`` that ``out`` holds, or None if it holds none."""
    existing = out / "config.toml"
    if not existing.exists():
        return None
    try:
        return existing.read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise ConfigError(f"--out {out}: cannot read config.toml: {err.strerror}") from None


def same_config(held: str | None, config_text: str) -> bool:
    """Whether a run directory's ``config.toml`` (None: it has none) is the config of
    ``config_text``: the same text, or a text that an earlier version resolved differently
    (keys it wrote that are no longer written when at their default) and that parses to it,
    or to it with the pre-attack rate named (``threat_model.train_lr`` set to the rate that
    its unset value took: the same attacked model, the same keys)."""
    if held is None or held == config_text:
        return True
    from leakbench.run.config import parse_config

    try:
        with warnings.catch_warnings():  # the held config's warnings are not this run's
            warnings.simplefilter("ignore")
            spec = parse_config(held)
    except LeakbenchError:
        return False  # a config this version refuses is not this config
    return config_text in (spec.to_toml(), _rate_named(spec).to_toml())


def _rate_named(spec: Any) -> Any:
    """``spec`` with its threat model's ``train_lr`` set to the rate an unset one takes."""
    threat = spec.threat_model
    if threat.train_lr:
        return spec
    rate = (spec.training or TrainingConfig()).pretraining()["learning_rate"]
    return dataclasses.replace(spec, threat_model=dataclasses.replace(threat, train_lr=rate))


def prepare_out_dir(out: Path, config_text: str, extend: bool, shard: Shard = WHOLE) -> None:
    """Refuses an ``out`` that holds a different config (unless ``extend``) or another shard,
    or that cannot be written; creates it otherwise."""
    existing = out / "config.toml"
    if not extend and not same_config(held_config(out), config_text):
        raise ConfigError(
            f"--out {out} holds a run with a different config; choose another directory, "
            "or pass --extend to add this config's trials to it"
        )
    if existing.exists() or (out / SHARD_FILE).exists():
        held = read_record(out)
        if held != shard:
            # Mixing shards in one store would make its tables neither shard's; merge does that
            # on purpose, into a directory of its own.
            what = "an unsharded run" if held.whole else f"shard {held}"
            asked = "without --shard" if shard.whole else f"with --shard {shard}"
            raise ConfigError(
                f"--out {out} holds {what}; rerun it with the same --shard, run {asked} into "
                "another directory, or combine shard directories with `leakbench merge`"
            )
    writable_dir(out, "--out")


def writable_dir(out: Path, label: str) -> None:
    """Creates ``out`` if needed and checks that a file can be written in it; a `ConfigError`
    naming ``label`` (the option or component that chose it) otherwise."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise ConfigError(f"{label} {out} is not a writable directory: {err.strerror}") from None


def export_tables(
    store: Store,
    trials: list[Trial],
    trainings: list[Training],
    out: Path,
    dataset: Dataset,
    audit: pd.DataFrame | None = None,
    *,
    threat: ThreatModel,
    lpips: str,
    success_mse: float,
    max_accuracy_drop: float,
    protocol: int = PROTOCOL,
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Writes ``arrays/``, then ``trials.csv``, ``utility.csv`` and ``leaderboard.csv`` into
    ``out`` from the stored rows of the planned ``trials`` and ``trainings``, in plan order;
    the per-image leakage flags (`leakbench.run.identification`) are read from the arrays written,
    by the run's ``threat`` model (its private split), ``lpips`` network and ``success_mse``,
    and the leaderboard ranks the defenses that cost at most ``max_accuracy_drop``.
    With an epsilon ``audit`` (`leakbench.run.epsilon_audit`) the leaderboard carries its
    columns beside ``epsilon``.

    Planned work the store lacks is left out, so the tables of a shard or of an interrupted
    run hold what it has, and a merged run's tables equal an unsharded run's.

    Returns:
        The trials, utility and leaderboard tables as written.
    """
    rows = store.rows([t.key for t in trials])
    utility_rows = store.rows([t.key for t in trainings], "utility")
    frame = pd.DataFrame(rows, columns=TRIAL_COLUMNS)
    utility = pd.DataFrame(utility_rows, columns=UTILITY_COLUMNS)
    stored = store.arrays([t.key for t in trials])
    blobs = {(t.seed, t.batch_index, t.cell_id): stored[t.key] for t in trials if t.key in stored}
    export_arrays(frame, blobs, out)
    frame = add_flags(frame, out, dataset, threat.private_split, lpips, success_mse, protocol)
    batch = int(frame["batch_size"].iloc[0]) if len(frame) else 1
    board = leaderboard(
        frame, success_mse, utility, max_accuracy_drop, protocol, classes=dataset.num_classes,
        clients=threat.clients, releases=threat.local_training(batch).steps,
    )  # fmt: skip
    write_csv(frame, out / "trials.csv", TRIAL_COLUMNS)
    write_csv(utility, out / "utility.csv", UTILITY_COLUMNS)
    if audit is not None:
        from leakbench.run.epsilon_audit import with_audit

        board = with_audit(board, audit)
    write_csv(board, out / "leaderboard.csv", leaderboard_columns(audit is not None))
    if threat.detects:
        detection = pd.DataFrame(rows, columns=DETECTION_COLUMNS).drop_duplicates(
            subset=["seed", "batch_index", "attack", "attack_params", "defense", "defense_params"]
        )
        write_csv(detection, out / "detection.csv", DETECTION_COLUMNS)
    return frame, utility, board


def check_engine(store: Store, where: str) -> None:
    """Refuses a store whose results another engine version computed (`leakbench.core.versions`):
    its numbers may differ from what this code computes for the same config, and mixing them
    would make the tables neither version's."""
    held = store.engine_version()
    if held != ENGINE_VERSION:
        raise ConfigError(
            f"{where} holds results of leakbench engine version {held}, and this leakbench is "
            f"engine version {ENGINE_VERSION}; run into a fresh --out directory (the old "
            "results stay as they are)"
        )


def check_engine_on_disk(out: Path) -> None:
    """`check_engine` of ``out``'s store, if it has one, opened read-only so that a store of
    another engine version is refused untouched."""
    path = out / "store.sqlite"
    if path.exists():
        with contextlib.closing(Store(path, readonly=True)) as held:
            check_engine(held, f"--out {out}")


def write_records(out: Path, shard: Shard, config_text: str) -> None:
    """Writes the run directory's shard record, config and environment."""
    # The record goes first: a directory with a config but no record is an unsharded run.
    write_record(out, shard)
    write_text(out / "config.toml", config_text)
    # The environment of the latest invocation (a resumed run may change machines).
    # The config's hash lets `leakbench board` refuse a config.toml edited after the run.
    environment = {**describe_environment(), CONFIG_HASH_KEY: config_sha256(config_text)}
    write_text(out / ENVIRONMENT_FILE, json.dumps(environment, indent=2) + "\n")
