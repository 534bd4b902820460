"""Files written whole or not at all: a reader never sees a half-written result.

Every result file of a run (tables, arrays, figures, reports) and an attack's trained state
(`leakbench.attacks.learned`) is written to a temporary file in its folder and then moved over
its name (`atomic_file`); new files get the permissions ``open`` would give them.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def current_umask() -> int:
    """The process's file mode creation mask, read without changing it where possible.

    Linux (4.7 and later) reports it in ``/proc/self/status``. Elsewhere the only way is to set
    a mask and put the old one back, which is briefly visible to other threads; that is done
    only here, when a file is written, never at import.
    """
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass  # no /proc (or an unexpected line): fall back to setting and restoring
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The permissions ``open(path, "w")`` would give a new file now: 0o666 less the umask."""
    return 0o666 & ~current_umask()


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: str = "w", **open_args: Any) -> Iterator[IO[Any]]:
    """An open handle whose contents replace ``path`` only when the block ends without error:
    written to a temporary file in the same folder, then ``os.replace``d, so a reader never
    sees a half-written file and a failure leaves the old file (or none) in place."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **open_args) as handle:
            # mkstemp creates files with mode 0600; results get the usual permissions of new
            # files instead (read now, so a umask set after import is honoured).
            os.fchmod(handle.fileno(), file_mode())
            yield handle
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: str | Path, text: str) -> None:
    """Writes text to ``path`` atomically (`atomic_file`)."""
    with atomic_file(path, "w", encoding="utf-8") as handle:
        handle.write(text)
