"""File source ``npz:PATH``: images and labels in a NumPy ``.npz`` archive (read without pickle)."""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path
from typing import IO

import numpy as np
from numpy.lib import format as npy

from leakbench.core.errors import DataError
from leakbench.datasets._util import (
    check_loaded_bytes,
    default_class_names,
    existing_path,
    loaded_bytes,
    make_dataset,
    stratified_split,
    to_labels,
    to_unit_float,
)
from leakbench.datasets.base import FILE_SOURCES, Dataset, Split

_ARRAYS = ("x", "y", "classes", "x_test", "y_test")
# What np.load and reading a member raise on a damaged or foreign file (pickled or object
# arrays give ValueError because pickle is disabled).
_READ_ERRORS = (OSError, ValueError, EOFError, zipfile.BadZipFile, zlib.error)


@FILE_SOURCES.register("npz")
def load_npz(path: str) -> Dataset:
    """Loads a dataset from an ``.npz`` archive.

    Arrays: ``x`` images, N x H x W (grey) or N x H x W x C (C = 1 or 3), uint8 0..255 or float
    in [0, 1]; ``y`` integer labels (N,); optional ``classes`` (K,) strings in label order
    (default "0".."K-1"); optional ``x_test`` and ``y_test`` (both or neither). Without a test
    split, the deterministic stratified split of `stratified_split` is made from ``x``/``y``.

    Args:
        path: The archive, e.g. ``cifar10-test.npz`` (``np.savez`` output).

    Raises:
        DataError: If the file is missing, not an npz archive, corrupt, or an array is wrong,
            or if its arrays would take more than `leakbench.datasets._util.MAX_LOADED_BYTES`
            once loaded (read from the arrays' headers before any data is inflated).
    """
    spec = f"npz:{path}"
    file = existing_path(path, spec, directory=False)
    try:
        with file.open("rb") as stream:
            magic = stream.read(6)
    except OSError as err:
        raise DataError(f"{spec}: cannot read ({' '.join(str(err).split())})") from err
    if magic == b"\x93NUMPY":
        raise DataError(f"{spec}: is a single .npy array, expected an .npz archive (np.savez)")
    # Checked up front: for a non-zip file np.load falls back to pickle and says so, which is
    # a confusing message for a file that is merely damaged or of another format.
    if not magic.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        raise DataError(f"{spec}: not an .npz archive (no zip signature; write it with np.savez)")
    try:
        _check_sizes(file, spec)
        with np.load(file, allow_pickle=False) as archive:
            found = list(archive.files)
            arrays = {key: archive[key] for key in _ARRAYS if key in archive.files}
    except _READ_ERRORS as err:
        if "allow_pickle" in str(err):
            reason = "it holds object arrays, which are not unpickled for safety"
        else:
            reason = " ".join(str(err).split())
        raise DataError(f"{spec}: not a readable .npz archive ({reason})") from err
    for key in ("x", "y"):
        if key not in arrays:
            raise DataError(f"{spec}: missing array {key!r} (found: {', '.join(found) or 'none'})")
    if ("x_test" in arrays) != ("y_test" in arrays):
        raise DataError(f"{spec}: 'x_test' and 'y_test' must be given together or not at all")

    def split(x_key: str, y_key: str) -> Split:
        x = to_unit_float(arrays[x_key], f"{spec} array {x_key!r}")
        y = to_labels(arrays[y_key], f"{spec} array {y_key!r}")
        if len(x) != len(y):
            raise DataError(f"{spec}: {x_key!r} has {len(x)} images but {y_key!r} {len(y)} labels")
        return Split(x, y)

    train = split("x", "y")
    if "x_test" in arrays:
        test = split("x_test", "y_test")
    else:
        train, test = stratified_split(train.x, train.y, spec)
    if "classes" in arrays:
        class_names = _class_names(arrays["classes"], spec)
        top = max(int(train.y.max()), int(test.y.max()))
        if top >= len(class_names):
            raise DataError(
                f"{spec}: labels must lie in 0..{len(class_names) - 1} for the "
                f"{len(class_names)} names of array 'classes', got labels up to {top}; give one "
                "name per class, in label order"
            )
    else:
        class_names = default_class_names(train.y, test.y, where=spec)
    return make_dataset(spec, train, test, class_names)


def _check_sizes(file: Path, spec: str) -> None:
    """Refuses an archive whose arrays would take too much memory once loaded.

    Only the ``.npy`` header of each array that `load_npz` reads is inflated (its shape and
    dtype), so a small compressed file that claims gigabytes is refused before they exist.
    """
    with zipfile.ZipFile(file) as archive:
        names = set(archive.namelist())
        total = 0
        for key in _ARRAYS:
            # np.load's lookup: the member named as the key, else the key with ".npy".
            member = key if key in names else f"{key}.npy"
            if member in names:
                with archive.open(member) as stream:
                    shape, itemsize = _npy_header(stream, f"{spec} array {key!r}")
                total += loaded_bytes(shape, itemsize, images=key.startswith("x"))
    check_loaded_bytes(total, spec)


def _npy_header(stream: IO[bytes], where: str) -> tuple[tuple[int, ...], int]:
    """The shape and item size an ``.npy`` stream's header declares (nothing more is read)."""
    try:
        version = npy.read_magic(stream)
    except ValueError:
        # np.load would hand back such a member's raw bytes, inflated whole.
        raise DataError(
            f"{where}: is not an .npy array (write the archive with np.savez)"
        ) from None
    # Versions 2.0 and 3.0 differ only in how the header text is encoded.
    read = npy.read_array_header_1_0 if version == (1, 0) else npy.read_array_header_2_0
    shape, _, dtype = read(stream)
    return tuple(shape), dtype.itemsize


def _class_names(classes: np.ndarray, spec: str) -> tuple[str, ...]:
    if classes.ndim != 1 or classes.dtype.kind not in "US":
        raise DataError(
            f"{spec}: array 'classes' must be a vector of strings, got {classes.dtype} "
            f"{classes.shape}"
        )
    if classes.dtype.kind == "S":
        return tuple(c.decode("utf-8", errors="replace") for c in classes)
    return tuple(str(c) for c in classes)
