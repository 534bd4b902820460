"""Dataset sources; importing this package registers every dataset and file source.

Named: ``digits``, ``lfw`` (embedded), ``mnist``, ``fashion_mnist``, ``cifar10``, ``cifar100``
(keras.datasets, network on first use). Files: ``npz:PATH``, ``idx:DIR``, ``folder:DIR``.
"""

from __future__ import annotations

# Imported for their side effect: each module registers its entries.
from leakbench.datasets import digits, folder, idx, keras_standard, lfw, npz  # noqa: F401
from leakbench.datasets.base import DATASETS, FILE_SOURCES, Dataset, Split
from leakbench.datasets.loading import load_dataset, resize_dataset, resize_images

__all__ = [
    "DATASETS",
    "FILE_SOURCES",
    "Dataset",
    "Split",
    "load_dataset",
    "resize_dataset",
    "resize_images",
]
