"""`load_dataset`: one entry point for named datasets and file sources, with optional resizing."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from leakbench.core.errors import ConfigError, DataError
from leakbench.core.sources import source_path
from leakbench.datasets._util import MAX_LOADED_BYTES, check_image_size, gib, make_dataset
from leakbench.datasets.base import DATASETS, FILE_SOURCES, Dataset, Split


def load_dataset(spec: str, image_size: tuple[int, int] | None = None) -> Dataset:
    """Loads a dataset by name ("digits", "mnist", ...) or from files ("npz:PATH", ...).

    Named datasets are cached in-process (per name and size), since a benchmark run loads the
    same one many times; their arrays are read-only. File sources are read anew on every call.

    Args:
        spec: An image dataset of `DATASETS`, or "PREFIX:PATH" with PREFIX an image source
            of `FILE_SOURCES` ("npz", "idx", "folder"); a text one is refused.
        image_size: (H, W) to resize every image to (bilinear, antialiased); None keeps the size.
            A file source whose loader takes an ``image_size`` keyword (``folder``, whose
            images may differ in size) receives it.

    Returns:
        The dataset, with float32 images in [0, 1] (N x H x W x C) and int64 labels.

    Raises:
        UnknownNameError: If the name or prefix is not registered, or is a text one; the
            message lists the allowed.
        ConfigError: If ``spec`` or ``image_size`` is malformed.
        DataError: If the data is missing, unreachable or corrupt.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"dataset must be a name or 'PREFIX:PATH', got {spec!r}")
    size = None if image_size is None else check_image_size(image_size)
    if ":" not in spec:
        return _load_named(spec, size)
    prefix, path = spec.split(":", 1)
    loader = FILE_SOURCES.get(prefix, modality="image")
    if source_path(spec) and not Path(path).expanduser().is_absolute():
        _check_relative(spec, path)
    if size is not None and "image_size" in inspect.signature(loader).parameters:
        dataset = loader(path, image_size=size)
    else:
        dataset = loader(path)
    return dataset if size is None else resize_dataset(dataset, size)


def _check_relative(spec: str, path: str) -> None:
    """Refuses a relative PATH that names nothing, naming the path it was read as."""
    resolved = Path(os.path.abspath(path))
    if not resolved.exists():
        raise DataError(
            f"{spec}: {resolved} does not exist (a relative path given here is read from the "
            "working directory; in a config file, from the config's folder)"
        )


def _load_named(name: str, size: tuple[int, int] | None) -> Dataset:
    # The cache is keyed by the loader, not the name: a dataset registered again under its
    # name (`Registry.unregister`, then a new loader) must not be served the old arrays.
    return _load_cached(DATASETS.get(name, modality="image"), size)


@functools.lru_cache(maxsize=8)
def _load_cached(loader: Callable[[], Dataset], size: tuple[int, int] | None) -> Dataset:
    dataset = loader()
    return dataset if size is None else resize_dataset(dataset, size)


def resize_images(x: np.ndarray, image_size: tuple[int, int]) -> np.ndarray:
    """Resizes N x H x W x C images in [0, 1] to ``image_size`` (H, W).

    Uses ``tf.image.resize`` (bilinear, antialiased so that shrinking does not alias); the
    result is float32, clipped to [0, 1] against rounding.
    """
    # Imported here: TensorFlow takes seconds to import and most loads never resize.
    import tensorflow as tf

    height, width = check_image_size(image_size)
    resized = tf.image.resize(x, (height, width), method="bilinear", antialias=True)
    return np.clip(resized.numpy(), 0.0, 1.0).astype(np.float32)


def resize_dataset(dataset: Dataset, image_size: tuple[int, int]) -> Dataset:
    """Returns ``dataset`` with both splits resized to ``image_size`` (itself if already so).

    Raises:
        ConfigError: If ``image_size`` is malformed, or the resized images would take more than
            `leakbench.datasets._util.MAX_LOADED_BYTES` (checked before resizing).
    """
    size = check_image_size(image_size)
    if dataset.input_shape[:2] == size:
        return dataset
    count = len(dataset.train) + len(dataset.test)
    need = count * size[0] * size[1] * dataset.input_shape[2] * 4
    if need > MAX_LOADED_BYTES:
        raise ConfigError(
            f"image_size {list(size)}: {dataset.name}'s {count} images would take {gib(need)} "
            f"as float32 at that size, above the limit of {gib(MAX_LOADED_BYTES)}; choose a "
            "smaller image_size"
        )
    return make_dataset(
        dataset.name,
        Split(resize_images(dataset.train.x, size), dataset.train.y),
        Split(resize_images(dataset.test.x, size), dataset.test.y),
        dataset.class_names,
    )
