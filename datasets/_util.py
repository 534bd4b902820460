"""Helpers shared by the dataset sources: conversion, validation and a deterministic split."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from sklearn.model_selection import train_test_split

from leakbench.core.errors import ConfigError, DataError
from leakbench.datasets.base import Dataset, Split

# The fixed split used wherever a source has no official train/test split.
SPLIT_TEST_SIZE = 0.25
SPLIT_SEED = 0

# The most classes a dataset may have. Sources without class names name the classes "0".."K-1"
# after the largest label, so a single label of 10**12 in a 2 KB file would otherwise build
# 10**12 names. 100,000 is far above any image benchmark (ImageNet-21k has 21,841 classes).
MAX_CLASSES = 100_000
# The most memory the arrays of one file source may take once loaded (images as float32,
# labels as int64, or as stored if wider), checked against the files' headers before any data
# is read or inflated: a small compressed file cannot claim gigabytes. CIFAR-10's 60,000
# images take 0.7 GiB as float32. Loading peaks at about twice this (the stored arrays, then
# the split copies).
MAX_LOADED_BYTES = 2 * 2**30
# The largest image side: of image_size, and of images read without it (``folder:``). The
# models and attacks of this benchmark work at 8 to 224 pixels; one 1024 x 1024 RGB image is
# 12 MB as float32, and the attacks keep several copies of every attacked image (the guess,
# its gradient, the optimiser's state), so larger images cost gigabytes per trial.
MAX_IMAGE_SIDE = 1024


def to_unit_float(x: np.ndarray, where: str) -> np.ndarray:
    """Converts images to float32 in [0, 1] with shape N x H x W x C.

    Args:
        x: uint8 images (0..255) or float images already in [0, 1]; shape N x H x W (grey) or
            N x H x W x C with C = 1 or 3 (channels last).
        where: The file or field the images came from; named in error messages.

    Returns:
        A new float32 array of shape N x H x W x C.

    Raises:
        DataError: If the shape, dtype or value range is wrong.
    """
    x = np.asarray(x)
    if x.ndim == 3:
        x = x[..., np.newaxis]
    # C is limited to 1 or 3 mostly to catch channels-first arrays (N x 3 x H x W) early.
    if x.ndim != 4 or x.shape[-1] not in (1, 3) or 0 in x.shape:
        raise DataError(
            f"{where}: images must have shape N x H x W or N x H x W x C with C 1 or 3 "
            f"(channels last), got {x.shape}"
        )
    if x.dtype == np.uint8:
        unit = x.astype(np.float32)
        unit /= np.float32(255.0)  # in place: one float32 copy of the images, not two
        return unit
    if not np.issubdtype(x.dtype, np.floating):
        raise DataError(f"{where}: images must be uint8 (0..255) or float in [0, 1], got {x.dtype}")
    if not np.all(np.isfinite(x)):
        raise DataError(f"{where}: images contain NaN or infinite values")
    lo, hi = float(x.min()), float(x.max())
    if lo < 0.0 or hi > 1.0:
        raise DataError(f"{where}: float images must lie in [0, 1], got values in [{lo}, {hi}]")
    return x.astype(np.float32)


def to_labels(y: np.ndarray, where: str) -> np.ndarray:
    """Converts labels to a 1-D int64 array (N x 1 column vectors are flattened).

    Raises:
        DataError: If the labels are not integers in [0, `MAX_CLASSES`) or not one per image.
    """
    y = np.asarray(y)
    if y.ndim == 2 and y.shape[1] == 1:
        y = y[:, 0]
    if y.ndim != 1:
        raise DataError(f"{where}: labels must be a vector of N integers, got shape {y.shape}")
    if not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{where}: labels must be integers, got dtype {y.dtype}")
    if y.size and int(y.min()) < 0:
        raise DataError(f"{where}: labels must be >= 0, got {int(y.min())}")
    # Read before the cast to int64, which would wrap a uint64 label above 2**63 to a negative.
    if y.size and int(y.max()) >= MAX_CLASSES:
        raise DataError(_too_many_classes(where, int(y.max())))
    return y.astype(np.int64)


def _too_many_classes(where: str, top: int) -> str:
    return (
        f"{where}: labels must be below {MAX_CLASSES} (at most {MAX_CLASSES:,} classes), got {top}"
    )


def default_class_names(*labels: np.ndarray, where: str = "labels") -> tuple[str, ...]:
    """Class names "0".."K-1", K = largest label + 1, for sources that store no names.

    Raises:
        DataError: If the largest label is `MAX_CLASSES` or more (named by ``where``).
    """
    top = max(int(y.max()) for y in labels if y.size)
    if top >= MAX_CLASSES:
        raise DataError(_too_many_classes(where, top))
    return tuple(str(k) for k in range(top + 1))


def loaded_bytes(shape: Sequence[int], itemsize: int, *, images: bool) -> int:
    """The bytes an array of ``shape`` stored with ``itemsize`` takes once loaded: images become
    float32 (4 bytes a value) and labels int64 (8 bytes), or stay as wide as stored."""
    return math.prod(int(d) for d in shape) * max(int(itemsize), 4 if images else 8)


def check_loaded_bytes(total: int, where: str) -> None:
    """Refuses a source whose arrays would take more than `MAX_LOADED_BYTES` once loaded.

    Raises:
        DataError: Naming ``where`` (the source or file), the size and the limit.
    """
    if total > MAX_LOADED_BYTES:
        raise DataError(
            f"{where}: its arrays would take {gib(total)} once loaded (images as float32), "
            f"above the limit of {gib(MAX_LOADED_BYTES)}; store fewer or smaller images"
        )


def gib(size: int) -> str:
    """A byte count as GiB for messages, e.g. "4.58 GiB"."""
    return f"{size / 2**30:.3g} GiB"


def stratified_split(x: np.ndarray, y: np.ndarray, where: str) -> tuple[Split, Split]:
    """Splits one labelled set into train and test, the same way every time.

    A quarter of the images (`SPLIT_TEST_SIZE`) go to the test split, stratified by label, drawn
    with scikit-learn's ``train_test_split`` and the fixed ``random_state`` `SPLIT_SEED`.

    Raises:
        DataError: If a stratified split is impossible (e.g. a class with one image).
    """
    if len(x) != len(y):
        raise DataError(f"{where}: {len(x)} images but {len(y)} labels")
    try:
        idx_train, idx_test = train_test_split(
            np.arange(len(y)), test_size=SPLIT_TEST_SIZE, random_state=SPLIT_SEED, stratify=y
        )
    except ValueError as err:
        raise DataError(f"{where}: cannot make a stratified train/test split: {err}") from err
    return Split(x[idx_train], y[idx_train]), Split(x[idx_test], y[idx_test])


def make_dataset(name: str, train: Split, test: Split, class_names: Sequence[str]) -> Dataset:
    """Checks the dataset contract and returns the dataset with read-only arrays.

    Arrays are made read-only because loaded datasets are cached and shared between callers.

    Raises:
        DataError: If any part of the contract is violated; the message names the dataset.
    """
    names = tuple(class_names)
    if not names or not all(isinstance(c, str) for c in names) or len(set(names)) != len(names):
        raise DataError(f"{name}: class names must be distinct strings, got {names!r}")
    for part, split in (("train", train), ("test", test)):
        where = f"{name} ({part} split)"
        x, y = split.x, split.y
        if x.dtype != np.float32 or x.ndim != 4:
            raise DataError(
                f"{where}: images must be float32 N x H x W x C, got {x.dtype} {x.shape}"
            )
        if y.dtype != np.int64 or y.shape != (x.shape[0],):
            raise DataError(f"{where}: {x.shape[0]} images but labels of shape {y.shape}")
        if len(split) == 0:
            raise DataError(f"{where}: the split is empty")
        if not (np.all(np.isfinite(x)) and x.min() >= 0.0 and x.max() <= 1.0):
            raise DataError(f"{where}: images must lie in [0, 1]")
        if y.min() < 0 or y.max() >= len(names):
            raise DataError(
                f"{where}: labels must lie in 0..{len(names) - 1} for {len(names)} class names, "
                f"got {int(y.min())}..{int(y.max())}"
            )
        x.flags.writeable = False
        y.flags.writeable = False
    if train.x.shape[1:] != test.x.shape[1:]:
        raise DataError(
            f"{name}: train images are {train.x.shape[1:]} but test images are {test.x.shape[1:]}"
        )
    return Dataset(name=name, train=train, test=test, class_names=names)


def existing_path(path: str, spec: str, *, directory: bool) -> Path:
    """Returns ``path`` (with ``~`` expanded) if it is an existing file or directory.

    Raises:
        DataError: Naming ``spec`` (e.g. "npz:PATH") if the path is missing or of the wrong kind.
    """
    resolved = Path(path).expanduser()
    if not path or not resolved.exists():
        raise DataError(f"{spec}: no such {'directory' if directory else 'file'}")
    if directory and not resolved.is_dir():
        raise DataError(f"{spec}: is a file, expected a directory")
    if not directory and not resolved.is_file():
        raise DataError(f"{spec}: is a directory, expected a file")
    return resolved


def check_image_size(image_size: object) -> tuple[int, int]:
    """Returns ``image_size`` as (H, W) after checking it holds two integers in
    [1, `MAX_IMAGE_SIDE`].

    Raises:
        ConfigError: If it does not.
    """
    if not (
        isinstance(image_size, (tuple, list))
        and len(image_size) == 2
        and all(
            isinstance(d, numbers.Integral)
            and not isinstance(d, bool)
            and 0 < int(d) <= MAX_IMAGE_SIDE
            for d in image_size
        )
    ):
        raise ConfigError(
            f"image_size must be two integers (H, W) in [1, {MAX_IMAGE_SIDE}], got {image_size!r}"
        )
    return int(image_size[0]), int(image_size[1])
