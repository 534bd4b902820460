"""The dataset contract: float32 images in [0, 1] (NHWC), int64 labels, class names, two splits.

`DATASETS` and `FILE_SOURCES` hold every dataset, of every modality: an image one loads a
`Dataset` (`leakbench.datasets.loading.load_dataset`), a text one (registered with
``modality="text"``) a `leakbench.datasets.text_base.TextCorpus` (``load_text_corpus``);
`modality_of` tells which a dataset string is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

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


# Named datasets: loader() -> Dataset (an image one) or TextCorpus (a text one).
DATASETS: Registry[Callable[[], Any]] = Registry("dataset")
# File sources, used as "PREFIX:PATH": loader(path) -> Dataset or TextCorpus.
FILE_SOURCES: Registry[Callable[..., Any]] = Registry("file source")


def modality_of(spec: str) -> str:
    """The modality (``"image"``, ``"text"``) of a dataset: a name of `DATASETS` (``digits``,
    ``tinyshakespeare``) or ``PREFIX:PATH`` with PREFIX a name of `FILE_SOURCES` (``npz:...``,
    ``text:...``); the PATH is not read.

    Raises:
        UnknownNameError: If the name or prefix is not registered; the message lists the names.
    """
    prefix, sep, _ = spec.partition(":")
    return FILE_SOURCES.modality_of(prefix) if sep else DATASETS.modality_of(spec)
