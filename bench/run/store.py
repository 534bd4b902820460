"""The results store: SQLite in the run directory, one row per finished trial or training.

Entries are keyed by a hash of their canonical config. Each group of trials attacked together,
and each training, is committed in one transaction as soon as it finishes (WAL journal, so a
reader such as ``merge`` never blocks the writer): an interrupted run loses at most the group in
flight and a rerun skips what is done.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from leakbench.core.canonical import stable_hash
from leakbench.core.errors import DataError
from leakbench.core.versions import ENGINE_VERSION, UNVERSIONED

# "trials": one entry per attack trial (rows = its images); "utility": one per training run.
TABLES = ("trials", "utility")
# Per-trial arrays for the figures (see `leakbench.outputs.arrays`), stored beside the trial's rows
# in the same transaction; stores written before it existed simply have none.
ARRAYS = "arrays"
# Facts about the store itself (the engine version that wrote it); older stores have none.
META = "meta"
# SQLite's result codes for a full disk: SQLITE_FULL, and SQLITE_IOERR_SHMSIZE, which a WAL
# store gives when its shared-memory file cannot grow (sqlite3's constants from Python 3.11).
_DISK_FULL_CODES = (13, 4874)


def _table(name: str) -> str:
    if name not in TABLES:  # table names cannot be bound as SQL parameters
        raise ValueError(f"unknown store table {name!r}")
    return name


def trial_key(trial: dict[str, Any]) -> str:
    """A stable hash of a trial's (or a training's) canonical config and the engine version
    that computes it (`leakbench.core.versions`)."""
    return stable_hash({**trial, "engine": ENGINE_VERSION}, 32)


class Store:
    """Finished trials of one run directory.

    Args:
        path: The SQLite file; created with its table if missing.
        readonly: Open an existing store for reading only (``merge`` reads shard stores so, and
            a shard that is still running is not disturbed); a missing file is a `DataError`.
    """

    def __init__(self, path: str | Path, *, readonly: bool = False) -> None:
        path = Path(path)
        self.path = path
        if readonly and not path.is_file():
            raise DataError(f"{path} does not exist")
        # The WAL files SQLite makes on opening; a refused store must not leave new ones behind.
        new_files = [f for f in _wal_files(path) if not f.exists()]
        try:
            if readonly:
                self._db = sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True)
            else:
                self._db = sqlite3.connect(str(path))
        except sqlite3.Error as err:
            raise DataError(f"{path} cannot be opened ({err})") from None
        try:
            with _disk_full_as_os_error(path):
                self._prepare(readonly)
        except (sqlite3.DatabaseError, OSError) as err:
            self._db.close()
            for file in new_files:
                file.unlink(missing_ok=True)
            if isinstance(err, OSError):  # a full disk (`_disk_full_as_os_error`)
                raise
            raise DataError(
                f"{path} is not a leakbench results store ({err}); move it away or choose "
                "another --out"
            ) from None

    def _prepare(self, readonly: bool) -> None:
        """Checks a read-only store's tables, or creates a writable store's missing ones."""
        if readonly:
            names = {n for (n,) in self._db.execute("SELECT name FROM sqlite_master")}
            if not set(TABLES) <= names:
                raise sqlite3.DatabaseError(f"tables {', '.join(TABLES)} are missing")
            return
        self._db.execute("PRAGMA journal_mode=WAL")
        for table in TABLES:
            self._db.execute(
                f"CREATE TABLE IF NOT EXISTS {table} (key TEXT PRIMARY KEY, rows TEXT NOT NULL)"
            )
        self._db.execute(
            f"CREATE TABLE IF NOT EXISTS {ARRAYS} (key TEXT PRIMARY KEY, data BLOB NOT NULL)"
        )
        fresh = not any(self.keys(table) for table in TABLES)
        self._db.execute(
            f"CREATE TABLE IF NOT EXISTS {META} (name TEXT PRIMARY KEY, value TEXT NOT NULL)"
        )
        if fresh:  # a store that holds results keeps the version that made them
            self._db.execute(
                f"INSERT OR IGNORE INTO {META} (name, value) VALUES ('engine_version', ?)",
                (str(ENGINE_VERSION),),
            )
        self._db.commit()

    def engine_version(self) -> int:
        """The engine version (`leakbench.core.versions`) whose results the store holds."""
        found = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (META,)
        ).fetchone()
        if found is None:
            return UNVERSIONED
        row = self._db.execute(f"SELECT value FROM {META} WHERE name = 'engine_version'").fetchone()
        return UNVERSIONED if row is None else int(row[0])

    def keys(self, table: str = "trials") -> set[str]:
        return {k for (k,) in self._db.execute(f"SELECT key FROM {_table(table)}")}

    def add(self, key: str, rows: list[dict[str, Any]], table: str = "trials") -> None:
        """Stores the rows of one finished unit of work (a trial's images, a training) and
        commits."""
        self.add_many([(key, rows)], table)

    def add_many(
        self,
        items: list[tuple[str, list[dict[str, Any]]]],
        table: str = "trials",
        arrays: dict[str, bytes] | None = None,
    ) -> None:
        """Stores several units of work in one transaction: all of them or none (a batch of
        trials attacked together is kept or redone as a whole, so a resumed run re-forms the
        same batches). ``arrays`` maps some of the keys to their encoded arrays.

        Raises:
            OSError: ENOSPC if the disk is full (the transaction is rolled back).
        """
        with _disk_full_as_os_error(self.path), self._db:
            self._db.executemany(
                f"INSERT OR REPLACE INTO {_table(table)} (key, rows) VALUES (?, ?)",
                [(key, json.dumps(rows)) for key, rows in items],
            )
            if arrays:
                self._db.executemany(
                    f"INSERT OR REPLACE INTO {ARRAYS} (key, data) VALUES (?, ?)",
                    list(arrays.items()),
                )

    def arrays(self, keys: list[str]) -> dict[str, bytes]:
        """The encoded arrays stored under those of ``keys`` that have any."""
        if not self._has_arrays():
            return {}
        wanted = set(keys)
        return {
            key: data
            for key, data in self._db.execute(f"SELECT key, data FROM {ARRAYS}")
            if key in wanted
        }

    def _has_arrays(self) -> bool:
        found = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (ARRAYS,)
        )
        return found.fetchone() is not None

    def rows(self, keys: list[str], table: str = "trials") -> list[dict[str, Any]]:
        """The rows stored under ``keys``, in their order (missing keys are skipped)."""
        found = dict(self._db.execute(f"SELECT key, rows FROM {_table(table)}"))
        return [row for key in keys if key in found for row in json.loads(found[key])]

    def copy_from(self, other: Store) -> dict[str, int]:
        """Adds every entry of ``other`` whose key this store lacks, in one transaction.

        Entries already here are kept as they are (timings included), so copying the same
        store twice adds nothing.

        Returns:
            How many entries each table gained.
        """
        added: dict[str, int] = {}
        with _disk_full_as_os_error(self.path), self._db:
            for table in TABLES:
                have = self.keys(table)
                new = [
                    (key, rows)
                    for key, rows in other._db.execute(
                        f"SELECT key, rows FROM {_table(table)} ORDER BY rowid"
                    )
                    if key not in have
                ]
                self._db.executemany(f"INSERT INTO {_table(table)} (key, rows) VALUES (?, ?)", new)
                added[table] = len(new)
            if other._has_arrays():
                have = {k for (k,) in self._db.execute(f"SELECT key FROM {ARRAYS}")}
                theirs = other._db.execute(f"SELECT key, data FROM {ARRAYS} ORDER BY rowid")
                self._db.executemany(
                    f"INSERT INTO {ARRAYS} (key, data) VALUES (?, ?)",
                    [row for row in theirs if row[0] not in have],
                )
        return added

    def close(self) -> None:
        self._db.close()


def _wal_files(path: Path) -> list[Path]:
    """The write-ahead log and shared-memory files SQLite keeps beside a WAL store."""
    return [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm")]


@contextlib.contextmanager
def _disk_full_as_os_error(path: Path) -> Iterator[None]:
    """Raises SQLite's "database or disk is full" as the OSError (ENOSPC) a full disk gives any
    other write, so that one handler tells the user to free space and resume."""
    try:
        yield
    except sqlite3.OperationalError as err:
        code = getattr(err, "sqlite_errorcode", None)
        if code not in _DISK_FULL_CODES and str(err) != "database or disk is full":
            raise
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from err
