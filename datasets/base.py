"""The dataset contract: float32 images in [0, 1] (NHWC), int64 labels, class names, two splits."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from leakbench.core.registry import Registry


@dataclasses.dataclass(frozen=True)
class Split:
    """Images ``x`` (float32, [0, 1], shape N x H x W x C) and labels ``y`` (int64, shape N)."""

    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return int(self.x.shape[0])


@dataclasses.dataclass(frozen=True)
class Dataset:
    """A labelled image dataset with a train and a test split."""

    name: str
    train: Split
    test: Split
    class_names: tuple[str, ...]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(int(d) for d in self.train.x.shape[1:])  # type: ignore[return-value]


# Named datasets: loader() -> Dataset.
DATASETS: Registry[Callable[[], Dataset]] = Registry("dataset")
# File sources, used as "PREFIX:PATH": loader(path) -> Dataset.
FILE_SOURCES: Registry[Callable[[str], Dataset]] = Registry("file source")
