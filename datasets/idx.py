"""File source ``idx:DIR``: MNIST-style IDX files (the format of MNIST and Fashion-MNIST)."""

from __future__ import annotations

import gzip
import math
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from leakbench.core.errors import DataError
from leakbench.datasets._util import (
    default_class_names,
    existing_path,
    make_dataset,
    stratified_split,
    to_labels,
    to_unit_float,
)
from leakbench.datasets.base import FILE_SOURCES, Dataset, Split

# IDX type codes (third byte of the magic number) -> big-endian element type.
_IDX_TYPES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_PARTS = {"train": "train", "test": "t10k"}


def read_idx(file: Path) -> np.ndarray:
    """Reads one IDX file (gzip-compressed if its name ends in ``.gz``).

    Layout: two zero bytes, a type code, the number of dimensions D, D big-endian uint32 sizes,
    then the elements in C order.

    Raises:
        DataError: If the file is unreadable, its header is invalid or its size does not match.
    """
    try:
        if file.suffix == ".gz":
            with gzip.open(file, "rb") as stream:
                data = stream.read()
        else:
            data = file.read_bytes()
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{file}: cannot read ({' '.join(str(err).split())})") from err
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_TYPES:
        raise DataError(f"{file}: not an IDX file (bad magic number {data[:4].hex() or 'none'})")
    dtype, ndim = _IDX_TYPES[data[2]], data[3]
    header = 4 + 4 * ndim
    if ndim == 0 or len(data) < header:
        raise DataError(f"{file}: truncated IDX header ({ndim} dimensions, {len(data)} bytes)")
    shape = tuple(int(d) for d in np.frombuffer(data, dtype=">u4", count=ndim, offset=4))
    expected = header + math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        problem = "truncated" if len(data) < expected else "has trailing bytes"
        raise DataError(
            f"{file}: {problem}: header says shape {shape} ({expected} bytes), file has "
            f"{len(data)} bytes"
        )
    return (
        np.frombuffer(data, dtype=dtype, offset=header)
        .reshape(shape)
        .astype(dtype.newbyteorder("="))
    )


def _find(directory: Path, name: str) -> Path | None:
    for candidate in (directory / name, directory / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _read_part(directory: Path, prefix: str) -> Split | None:
    images = _find(directory, f"{prefix}-images-idx3-ubyte")
    labels = _find(directory, f"{prefix}-labels-idx1-ubyte")
    if images is None and labels is None:
        return None
    if images is None or labels is None:
        missing = f"{prefix}-images-idx3-ubyte" if images is None else f"{prefix}-labels-idx1-ubyte"
        raise DataError(f"{directory / missing}[.gz]: missing (found {images or labels})")
    x = read_idx(images)
    if x.ndim != 3:
        raise DataError(f"{images}: expected N x H x W images, got shape {x.shape}")
    y = read_idx(labels)
    if y.ndim != 1:
        raise DataError(f"{labels}: expected a vector of labels, got shape {y.shape}")
    if len(x) != len(y):
        raise DataError(f"{labels}: {len(y)} labels but {images.name} has {len(x)} images")
    return Split(to_unit_float(x, str(images)), to_labels(y, str(labels)))


@FILE_SOURCES.register("idx")
def load_idx(path: str) -> Dataset:
    """Loads a dataset from the four MNIST IDX files in a directory.

    Expected names, each plain or gzip-compressed (``.gz``): ``train-images-idx3-ubyte``,
    ``train-labels-idx1-ubyte``, ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte``. If only
    one pair is present (e.g. just the 10,000 t10k images), the deterministic stratified split of
    `stratified_split` is made from it. Class names are "0".."K-1", K = largest label + 1.

    Args:
        path: The directory holding the files.

    Raises:
        DataError: If the directory or a file is missing, or a file is corrupt or inconsistent.
    """
    spec = f"idx:{path}"
    directory = existing_path(path, spec, directory=True)
    parts = {part: _read_part(directory, prefix) for part, prefix in _PARTS.items()}
    train, test = parts["train"], parts["test"]
    if train is None and test is None:
        raise DataError(
            f"{spec}: no IDX files; expected train-images-idx3-ubyte, train-labels-idx1-ubyte, "
            "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte (each optionally .gz)"
        )
    if train is None or test is None:
        only = next(split for split in (train, test) if split is not None)
        train, test = stratified_split(only.x, only.y, spec)
    return make_dataset(spec, train, test, default_class_names(train.y, test.y))
