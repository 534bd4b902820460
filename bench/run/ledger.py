"""The board's own record of verifications: a ledger kept by whoever builds the board.

`leakbench board --verify RUN_DIR --ledger FILE` writes its result here, never into the run
directory: a file inside a submission is the submitter's to write, so the board believes none
(a submission's ``verification.json`` is at most shown as claimed). A record is keyed by
`entry_sha256`, a hash of every file the entry's numbers come from, so it vouches for exactly
those bytes: an entry edited after it was verified (or another entry under the same name) finds
no record and reads ``not verified``. Moving or renaming the directory keeps the record.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from filelock import FileLock

from leakbench.core.errors import ConfigError
from leakbench.core.files import write_text
from leakbench.outputs.arrays import ARRAYS_DIR

LEDGER_FILE = "verifications.json"
LEDGER_FORMAT = 1
# What an entry's numbers come from (the leaderboard is not among them: the board recomputes it).
HASHED = ("config.toml", "trials.csv", "utility.csv", "epsilon_audit.csv")
MAX_LEDGER_BYTES = 64 * 1024**2


def entry_sha256(path: Path) -> str:
    """One SHA-256 over an entry's `HASHED` files and its ``arrays/*.npz`` (names and bytes,
    line endings of the text files read as ``\\n``, so a checkout that writes ``\\r\\n`` gives
    the same hash); an absent file counts as empty."""
    digest = hashlib.sha256()
    for name in HASHED:
        file = path / name
        data = file.read_bytes() if file.is_file() else b""
        digest.update(name.encode() + b"\0" + data.replace(b"\r\n", b"\n") + b"\0")
    arrays = path / ARRAYS_DIR
    if arrays.is_dir():
        for item in sorted(arrays.glob("*.npz")):
            digest.update(f"{ARRAYS_DIR}/{item.name}".encode() + b"\0")
            with item.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
            digest.update(b"\0")
    return digest.hexdigest()


def read_ledger(path: Path | None) -> dict[str, dict[str, Any]]:
    """The ledger's records by entry hash; empty where there is no ledger. A ledger that is not
    one is refused in one line naming ``--ledger``."""
    if path is None or not path.is_file():
        return {}
    if path.stat().st_size > MAX_LEDGER_BYTES:
        raise ConfigError(f"--ledger {path}: larger than {MAX_LEDGER_BYTES // 1024**2} MiB")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ConfigError(f"--ledger {path}: not a verification ledger ({err})") from None
    records = doc.get("records") if isinstance(doc, dict) else None
    if doc.get("ledger") != LEDGER_FORMAT or not isinstance(records, dict):
        raise ConfigError(
            f"--ledger {path}: not a verification ledger of format {LEDGER_FORMAT} "
            '(a JSON object with "ledger" and "records")'
        )
    return {str(k): v for k, v in records.items() if isinstance(v, dict)}


def add_record(path: Path, key: str, record: dict[str, Any]) -> None:
    """Adds (or replaces) the record of the entry ``key`` in the ledger at ``path``, under a
    lock, rewriting the file atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(path) + ".lock"):
        records = read_ledger(path)
        records[key] = record
        doc = {"ledger": LEDGER_FORMAT, "records": dict(sorted(records.items()))}
        write_text(path, json.dumps(doc, indent=2, sort_keys=False) + "\n")
