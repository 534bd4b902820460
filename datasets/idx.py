"""File source ``idx:DIR``: MNIST-style IDX files (the format of MNIST and Fashion-MNIST)."""

from __future__ import annotations

import gzip
import io
import math
import zlib
from pathlib import Path
from typing import Any

import numpy as np

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
    then the elements in C order. The header is read first and the body after it is read only
    up to the size the header gives (a compressed stream is never inflated beyond it).

    Raises:
        DataError: If the file is unreadable, its header is invalid, its size does not match,
            or its array would take more than `leakbench.datasets._util.MAX_LOADED_BYTES`
            once loaded.
    """
    try:
        with _open(file) as stream:
            dtype, shape = _read_header(stream, file)
            check_loaded_bytes(_loaded(file, dtype, shape), str(file))
            data = _read_body(stream, file, dtype, shape)
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{file}: cannot read ({' '.join(str(err).split())})") from err
    return np.frombuffer(data, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))


def idx_header(file: Path) -> tuple[np.dtype[Any], tuple[int, ...]]:
    """The element type and shape an IDX file's header declares (only the header is read).

    Raises:
        DataError: If the file is unreadable or its header is invalid.
    """
    try:
        with _open(file) as stream:
            return _read_header(stream, file)
    except (OSError, EOFError, zlib.error) as err:
        raise DataError(f"{file}: cannot read ({' '.join(str(err).split())})") from err


def _open(file: Path) -> io.BufferedIOBase:
    """The file as a stream of bytes, inflated as it is read if its name ends in ``.gz``."""
    if file.suffix == ".gz":
        return gzip.GzipFile(file, "rb")
    return file.open("rb")


def _read_header(stream: io.BufferedIOBase, file: Path) -> tuple[np.dtype[Any], tuple[int, ...]]:
    """The element type and shape of an IDX header, read from the start of ``stream``."""
    magic = stream.read(4)
    if len(magic) < 4 or magic[0] != 0 or magic[1] != 0 or magic[2] not in _IDX_TYPES:
        raise DataError(f"{file}: not an IDX file (bad magic number {magic.hex() or 'none'})")
    dtype, ndim = _IDX_TYPES[magic[2]], magic[3]
    dims = stream.read(4 * ndim)
    if ndim == 0 or len(dims) < 4 * ndim:
        raise DataError(f"{file}: truncated IDX header ({ndim} dimensions, {4 + len(dims)} bytes)")
    return dtype, tuple(int(d) for d in np.frombuffer(dims, dtype=">u4"))


def _read_body(
    stream: io.BufferedIOBase, file: Path, dtype: np.dtype[Any], shape: tuple[int, ...]
) -> bytes:
    """The elements after the header: exactly the bytes the header gives, refusing a file that
    is shorter or longer (one byte past them is read to tell)."""
    header = 4 + 4 * len(shape)
    expected = math.prod(shape) * dtype.itemsize
    data = stream.read(expected)
    if len(data) < expected or stream.read(1):
        problem = "truncated" if len(data) < expected else "has trailing bytes"
        found = f"{header + len(data)} bytes" if len(data) < expected else "more"
        raise DataError(
            f"{file}: {problem}: header says shape {shape} ({header + expected} bytes), file "
            f"has {found}"
        )
    return data


def _loaded(file: Path, dtype: np.dtype[Any], shape: tuple[int, ...]) -> int:
    """The bytes an IDX array takes once loaded (images as float32, labels as int64)."""
    return loaded_bytes(shape, dtype.itemsize, images="-images-" in file.name)


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
    _check_sizes(directory, spec)
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
    return make_dataset(spec, train, test, default_class_names(train.y, test.y, where=spec))


def _check_sizes(directory: Path, spec: str) -> None:
    """Refuses IDX files that together would take too much memory once loaded, from their
    headers alone (`read_idx` bounds each file on its own too)."""
    files = [
        found
        for prefix in _PARTS.values()
        for kind in ("images-idx3", "labels-idx1")
        if (found := _find(directory, f"{prefix}-{kind}-ubyte")) is not None
    ]
    sizes = {file: _loaded(file, *idx_header(file)) for file in files}
    for file, size in sizes.items():  # one file too large is named
        check_loaded_bytes(size, str(file))
    check_loaded_bytes(sum(sizes.values()), spec)
