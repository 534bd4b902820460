"""The cross-run board: committed run directories side by side (`leakbench board`).

Each run directory gives one row per defense configuration (its headline: the strongest
attack's row of ``leaderboard.csv``), with the leaked share over the attack suite and its
interval, the accuracy and its cost with intervals (from ``utility.csv``), the promised and
the measured epsilon, the budget evidence, the verdict, and where the row comes from; a row
whose run was judged by an engine older than a fix that made the attacks stronger is flagged
(`leakbench.core.versions.weak_evaluation`) and ranked against nothing. Rows are
grouped in tables of one protocol, dataset and threat model; a malicious server's runs form
their own tables. A directory whose ``config.toml`` no longer matches the hash recorded when it
ran, or whose leaderboard does not follow the protocol its config names, is shown apart with one
line saying why. The page is written by `leakbench.outputs.board_html`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from leakbench.components.metrics import mean_ci95
from leakbench.core.environment import ENVIRONMENT_FILE
from leakbench.core.errors import ConfigError
from leakbench.core.versions import weak_evaluation
from leakbench.outputs.naming import attack_label, defense_label

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

BOARD_CSV = "board.csv"
APART_CSV = "apart.csv"
VERIFICATION_FILE = "verification.json"
CONFIG_HASH_KEY = "config_sha256"

BOARD_COLUMNS = [
    "table", "protocol", "dataset", "model", "threat_model", "batch_size", "model_state",
    "defense", "defense_params", "defense_label",
    "leaked", "n", "leaked_share", "leaked_low", "leaked_high", "leak_measure",
    "strongest_attack", "identified_rate", "recognisable_rate", "success_rate",
    "test_accuracy", "test_accuracy_ci95", "accuracy_drop", "accuracy_drop_ci95", "perplexity",
    "epsilon_training", "epsilon_update", "epsilon_measured", "epsilon_exceeds",
    "budget_share", "converged_rate",
    "verdict", "verdict_note", "run_rank", "table_rank", "verification", "metrics_checked",
    "weak_evaluation",
    "leakbench", "engine_version", "commit", "config_sha256", "config_hash",
    "seeds", "environment", "run_dir",
]  # fmt: skip


def config_sha256(text: str) -> str:
    """The SHA-256 of a run's ``config.toml`` text, as `leakbench run` records it."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclasses.dataclass(frozen=True)
class Entry:
    """One run directory as the board reads it."""

    path: Path
    label: str
    config_text: str
    config: dict[str, Any]
    environment: dict[str, Any]
    leaderboard: pd.DataFrame
    utility: pd.DataFrame | None
    # The submission's own verification.json (never believed: shown as claimed at most).
    verification: dict[str, Any] | None
    # Set by the hostile reading (`leakbench.run.submission`): the hash the board's ledger
    # keys verifications by, and how many image rows were checked against the arrays.
    entry_sha256: str = ""
    # Whether the attacked model is a checkpoint (a model_accuracy.json, or a checkpoints/ run).
    checkpoint: bool = False
    rows_checked: int = 0
    rows_unchecked: int = 0


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigError(f"RUN_DIR {path.parent}: cannot read {path.name}: {err}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"RUN_DIR {path.parent}: {path.name} is not a JSON object")
    return value


def load_entry(folder: str | Path, label: str | None = None) -> Entry:
    """Reads one run directory's files as they are (the hostile reading, which copies,
    recomputes and checks them, is `leakbench.run.submission.read_submission`); a directory
    without ``leaderboard.csv`` or ``config.toml``, or whose leaderboard mixes protocol
    versions, is refused with one line."""
    path = Path(folder)
    name = label or str(folder)
    board_file, config_file = path / "leaderboard.csv", path / "config.toml"
    if not board_file.is_file():
        raise ConfigError(
            f"RUN_DIR {name}: no leaderboard.csv; give run directories written by `leakbench run`"
        )
    if not config_file.is_file():
        raise ConfigError(f"RUN_DIR {name}: no config.toml; the board needs the run's config")
    try:
        text = config_file.read_text(encoding="utf-8")
        config = tomllib.loads(text)
    except UnicodeDecodeError:
        raise ConfigError(f"RUN_DIR {name}: config.toml is not UTF-8 text") from None
    except (tomllib.TOMLDecodeError, RecursionError) as err:
        raise ConfigError(f"RUN_DIR {name}: config.toml is not TOML ({err})") from None
    board = read_table(board_file, name)
    if board.empty:
        raise ConfigError(f"RUN_DIR {name}: leaderboard.csv has no rows")
    protocols = sorted({str(p) for p in board["protocol"].dropna()}) if "protocol" in board else []
    if len(protocols) > 1:
        raise ConfigError(
            f"RUN_DIR {name}: leaderboard.csv mixes protocol versions {', '.join(protocols)}; "
            "rescore it (`leakbench rescore`) so that one protocol judges it"
        )
    utility_file = path / "utility.csv"
    utility = read_table(utility_file, name) if utility_file.is_file() else None
    verification = _read_json(path / VERIFICATION_FILE) or None
    environment = _read_json(path / ENVIRONMENT_FILE)
    accuracy = _read_json(path / "model_accuracy.json")
    return Entry(
        path, name, text, config, environment, board, utility, verification,
        checkpoint=bool(accuracy) or path.parent.name == "checkpoints",
    )  # fmt: skip


def read_table(path: Path, name: str) -> pd.DataFrame:
    """A CSV table of the run directory ``name``; one line naming the file where it is not a
    table of UTF-8 text."""
    try:
        return pd.read_csv(path, keep_default_na=True)
    except (ValueError, OverflowError) as err:  # UnicodeDecodeError, ParserError, EmptyDataError
        first = str(err).splitlines()[0][:120] if str(err) else type(err).__name__
        raise ConfigError(f"RUN_DIR {name}: {path.name} is not a CSV table ({first})") from None


def leaderboard_protocol(entry: Entry) -> int | None:
    """The protocol the leaderboard's verdicts follow, None where it records none."""
    if "protocol" not in entry.leaderboard:
        return None
    values = entry.leaderboard["protocol"].dropna()
    return int(values.iloc[0]) if len(values) else None


def apart_reason(entry: Entry) -> str | None:
    """Why a run directory cannot stand on the board (None: it can), in one line."""
    recorded = entry.environment.get(CONFIG_HASH_KEY)
    if recorded and recorded != config_sha256(entry.config_text):
        return "config.toml does not match the hash recorded when it ran (environment.json)"
    protocol = leaderboard_protocol(entry)
    declared = entry.config.get("protocol")
    if declared is not None and protocol is not None and int(declared) != protocol:
        return f"config.toml names protocol {declared} but leaderboard.csv follows {protocol}"
    for column in ("dataset", "model"):
        if column not in entry.leaderboard:
            return f"leaderboard.csv has no {column} column"
        held = {str(v) for v in entry.leaderboard[column].dropna()}
        if held and held != {str(entry.config.get(column))}:
            return (
                f"config.toml's {column} {entry.config.get(column)!r} is not the "
                f"leaderboard's ({', '.join(sorted(held))})"
            )
    return None


def threat_model(config: dict[str, Any], batch: int | None = None) -> str:
    """The threat model a run attacks under, in words: the server, secure aggregation, FedAvg,
    what the server knows besides the update, and the batch (``batch``, else the config's)."""
    tm = config.get("threat_model", {})
    parts = [f"{tm.get('server', 'honest')} server"]
    if int(tm.get("clients", 1)) > 1:
        parts.append(f"secure aggregation of {tm['clients']} clients")
    if int(tm.get("local_steps", 1)) > 1:
        parts.append(f"FedAvg {tm['local_steps']} local steps")
    if int(tm.get("local_epochs", 1)) > 1:
        parts.append(f"FedAvg {tm['local_epochs']} local epochs")
    if tm.get("labels_known"):
        parts.append("labels known")
    if tm.get("bn_statistics_known"):
        parts.append("BatchNorm statistics known")
    parts.append(f"batch {config.get('batch_size', 1) if batch is None else batch}")
    return ", ".join(parts)


def model_state(entry: Entry) -> str:
    """The state of the attacked model: initialisation, trained steps, or a checkpoint."""
    steps = int(entry.config.get("threat_model", {}).get("train_steps", 0))
    if entry.checkpoint:
        return f"checkpoint {entry.path.name}"
    return f"trained {steps} steps" if steps else "initialisation"


def environment_line(environment: dict[str, Any]) -> str:
    """The environment a run was made with, in one short line."""
    if not environment:
        return "not recorded"
    parts = [
        f"Python {short(environment.get('python'))}",
        f"TensorFlow {short(environment.get('tensorflow'))}",
        f"{short(environment.get('cpu_count'))} CPUs",
    ]
    devices = environment.get("devices", [])
    devices = devices[:4] if isinstance(devices, list) else []
    shown = [short(d) for d in devices if "CPU" not in str(d)]
    if shown:
        parts.append(", ".join(shown))
    return ", ".join(parts)


# The longest text a submission's provenance field reaches the board with.
MAX_FIELD = 80
# A verdict note on the board (the run's leaderboard.csv keeps it whole).
MAX_NOTE = 300


def short(value: Any, limit: int = MAX_FIELD) -> str:
    """``value`` as text of at most ``limit`` characters (cut with an ellipsis), control
    characters replaced: a submitter's field cannot grow the board or break its lines."""
    text = "".join(c if c.isprintable() else " " for c in str(value)[: limit + 1])
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _float(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan
    return number


def accuracy_cost(utility: pd.DataFrame | None, row: pd.Series) -> tuple[float, float]:
    """The accuracy cost of a defense (accuracy under ``none`` minus under it, paired by seed and
    replicate) and the half-width of its 95% Student-t interval; NaNs without the trainings."""
    if utility is None or utility.empty or "test_accuracy" not in utility:
        return math.nan, math.nan
    keys = ["seed", "replicate"] if "replicate" in utility else ["seed"]
    same = (utility["dataset"] == row["dataset"]) & (utility["model"] == row["model"])
    base = utility[same & (utility["defense"] == "none")].set_index(keys)["test_accuracy"]
    mine = utility[
        same
        & (utility["defense"] == row["defense"])
        & (utility["defense_params"] == row["defense_params"])
    ].set_index(keys)["test_accuracy"]
    paired = (base - mine).dropna()
    if paired.empty:
        return math.nan, math.nan
    mean, half, _ = mean_ci95(paired.to_numpy())
    return mean, half


def _headline(rows: pd.DataFrame) -> pd.Series:
    """The defense configuration's headline row: its strongest attack's."""
    if "strongest" in rows:
        strongest = rows[rows["strongest"].astype(str).str.lower() == "true"]
        if len(strongest):
            return strongest.iloc[0]
    return rows.sort_values("leaked_rate", ascending=False, kind="stable").iloc[0]


def _leak_columns(head: pd.Series) -> dict[str, Any]:
    """The leaked share over the suite (the per-image union), or, for a leaderboard written
    before the suite, the strongest attack's."""
    if "suite_n" in head and not math.isnan(_float(head.get("suite_n"))):
        k, n = int(head["suite_leaked"]), int(head["suite_n"])
        low, high, measure = head["suite_low"], head["suite_high"], "suite union"
    else:
        n = int(head["n"])
        k = int(round(_float(head["leaked_rate"]) * n))
        low, high, measure = head["leaked_low"], head["leaked_high"], "strongest attack"
    return {
        "leaked": k,
        "n": n,
        "leaked_share": k / n if n else math.nan,
        "leaked_low": _float(low),
        "leaked_high": _float(high),
        "leak_measure": measure,
    }


def _epsilon_columns(head: pd.Series) -> dict[str, Any]:
    update, measured = _float(head.get("epsilon_update")), _float(head.get("epsilon_audit"))
    exceeds = bool(measured > update) if not (math.isnan(update) or math.isnan(measured)) else ""
    return {
        "epsilon_training": _float(head.get("epsilon")),
        "epsilon_update": update,
        "epsilon_measured": measured,
        "epsilon_exceeds": exceeds,
    }


def _provenance(entry: Entry, run_dir: str) -> dict[str, Any]:
    recorded = entry.environment.get(CONFIG_HASH_KEY)
    seeds = entry.config.get("seeds", [])
    seeds = seeds if isinstance(seeds, list) else [seeds]
    return {
        "leakbench": short(entry.environment.get("leakbench", "")),
        "engine_version": short(entry.environment.get("engine_version", "")),
        "commit": commit_text(entry.environment),
        "config_sha256": config_sha256(entry.config_text),
        "config_hash": "matches the recorded hash" if recorded else "no hash recorded",
        "seeds": " ".join(str(s) for s in seeds),
        "environment": environment_line(entry.environment),
        "run_dir": run_dir,
    }


def commit_text(environment: dict[str, Any]) -> str:
    """The commit a run was made at, as its ``environment.json`` records it: the SHA, with
    "(uncommitted changes)" when the checkout was dirty; "not recorded" without one."""
    commit = short(environment.get("commit", "") or "not recorded")
    if commit != "not recorded" and environment.get("dirty") is True:
        return f"{commit} (uncommitted changes)"
    return commit


def verification_status(entry: Entry, row: pd.Series, record: dict[str, Any] | None) -> str:
    """``verified`` or ``disputed`` where the board's own ledger (`leakbench.run.ledger`) holds
    a record for exactly these files (``record``) that compared this configuration, at the
    engine the run says it was made by; ``not verified`` otherwise, with what the submission's
    own ``verification.json`` claims, which is never believed."""
    key = defense_label(str(row["defense"]), str(row["defense_params"]))
    if record is not None:
        engine = str(entry.environment.get("engine_version", ""))
        if str(record.get("engine_version")) != engine:
            return f"not verified (verified at engine {short(record.get('engine_version'), 8)})"
        configurations = record.get("configurations")
        checked = configurations.get(key) if isinstance(configurations, dict) else None
        status = checked.get("status") if isinstance(checked, dict) else None
        if status in ("verified", "disputed"):
            return str(status)
    claimed = entry.verification.get("status") if entry.verification else None
    if claimed:
        return f"not verified (claims {short(claimed, 20)})"
    return "not verified"


def metrics_checked(entry: Entry) -> str:
    """How many of the entry's image rows had their scores checked against ``arrays/``."""
    total = entry.rows_checked + entry.rows_unchecked
    if not total:
        return ""
    text = f"{entry.rows_checked} of {total} rows against arrays/"
    return text if not entry.rows_unchecked else f"{text}; {entry.rows_unchecked} unverifiable"


def entry_rows(
    entry: Entry, run_dir: str, record: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """One board row per defense configuration of a run directory; ``record`` is the ledger's
    verification of the entry, if it has one."""
    protocol = leaderboard_protocol(entry)
    server = entry.config.get("threat_model", {}).get("server", "honest")
    rows = []
    # A text run judges each batch size apart (its leaderboard has a batch_size column).
    by_batch = "batch_size" in entry.leaderboard.columns
    keys = ["dataset", "model", *(["batch_size"] if by_batch else []), "defense", "defense_params"]
    for _, group in entry.leaderboard.groupby(keys, sort=False, dropna=False):
        head = _headline(group)
        batch = int(head["batch_size"]) if by_batch else int(entry.config.get("batch_size", 1))
        threat = threat_model(entry.config, batch)
        cost, cost_ci = accuracy_cost(entry.utility, head)
        dataset = str(head["dataset"])
        rows.append(
            {
                "table": table_name(protocol, dataset, threat, server),
                "protocol": "" if protocol is None else protocol,
                "dataset": dataset,
                "model": head["model"],
                "threat_model": threat,
                "batch_size": batch,
                "model_state": model_state(entry),
                "defense": head["defense"],
                "defense_params": head["defense_params"],
                "defense_label": defense_label(str(head["defense"]), str(head["defense_params"])),
                **_leak_columns(head),
                "strongest_attack": attack_label(str(head["attack"]), str(head["attack_params"])),
                "identified_rate": _float(head.get("identified_rate")),
                "recognisable_rate": _float(head.get("recognisable_rate")),
                "success_rate": _float(head.get("success_rate")),
                "test_accuracy": _float(head.get("test_accuracy")),
                "test_accuracy_ci95": _float(head.get("test_accuracy_ci95")),
                "accuracy_drop": cost
                if not math.isnan(cost)
                else _float(head.get("accuracy_drop")),
                "accuracy_drop_ci95": cost_ci,
                # A text run's utility (`leakbench.outputs.tables.TEXT`): lower is better.
                "perplexity": _float(head.get("perplexity")),
                **_epsilon_columns(head),
                "budget_share": _float(head.get("budget_share")),
                "converged_rate": _float(head.get("converged_rate")),
                "verdict": head.get("verdict", ""),
                # Recomputed, but it names a submitter's attack and defense parameters.
                "verdict_note": short(head.get("verdict_note", "") or "", MAX_NOTE),
                "run_rank": _float(head.get("rank")),
                "verification": verification_status(entry, head, record),
                "metrics_checked": metrics_checked(entry),
                "weak_evaluation": weak_evaluation(entry.environment.get("engine_version", "")),
                **_provenance(entry, run_dir),
            }
        )
    return rows


def table_name(protocol: int | None, dataset: str, threat: str, server: str) -> str:
    """The board table a row belongs to: protocol major, dataset and threat model."""
    head = "no protocol recorded" if protocol is None else f"protocol {protocol}"
    return f"{head} | {dataset_name(dataset)} | {threat}"


def dataset_name(dataset: str) -> str:
    """A dataset as the board names it: a registered name, or a file's stem without its
    split (``npz:../data/cifar10-test.npz`` is ``cifar10``)."""
    if ":" not in dataset:
        return dataset
    stem = Path(dataset.split(":", 1)[1]).stem
    return stem.removesuffix("-test").removesuffix("-train")


def table_order(name: str) -> tuple[bool, bool, str]:
    """Tables with a protocol first, the honest server's before the malicious one's."""
    return (name.startswith("no protocol"), "malicious server" in name, name)


def rank_in_tables(frame: pd.DataFrame) -> pd.Series:
    """Each row's place in its table among the rows its own run ranked: fewest images leaked
    over the suite first, then fewest recovered exactly, ties to the higher accuracy (the lower
    perplexity for a text run's rows); empty for
    a configuration its run left unranked (untested, inconclusive, the baseline, too costly)
    and for a row judged by an engine whose attacks were later made stronger
    (``weak_evaluation``): it is shown, flagged, and ranked against nothing."""
    ranks = pd.Series(np.nan, index=frame.index)
    for _, group in frame.groupby("table", sort=False):
        ranked = group[group["run_rank"].notna() & (group["weak_evaluation"] == "")]
        utility = (-ranked["test_accuracy"]).fillna(ranked["perplexity"]).fillna(np.inf)
        order = ranked.assign(_utility=utility).sort_values(
            ["leaked_share", "success_rate", "_utility"], kind="stable"
        )
        ranks[order.index] = np.arange(1, len(order) + 1, dtype=float)
    return ranks


@dataclasses.dataclass(frozen=True)
class Board:
    """The rows of the board and the directories shown apart, with why."""

    rows: pd.DataFrame
    apart: pd.DataFrame
