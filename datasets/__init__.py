"""Dataset sources; importing this package registers every dataset and file source.

Named: ``digits``, ``lfw`` (embedded), ``mnist``, ``fashion_mnist``, ``cifar10``, ``cifar100``
(keras.datasets, network on first use). Files: ``npz:PATH``, ``idx:DIR``, ``folder:DIR``.
Text (``modality="text"`` in the same registries; `modality_of` tells a dataset's):
``tinyshakespeare`` (embedded) and ``text:PATH``.

A built-in source is one new module in this folder (the package imports each of its modules,
`leakbench.core.discovery`). A researcher's own dataset is a loader ``() -> Dataset``
decorated with ``@DATASETS.register("name")`` (a file source ``loader(path) -> Dataset`` with
``@FILE_SOURCES.register("prefix")``; a text one adds ``modality="text"`` and returns a
`leakbench.datasets.text_base.TextCorpus`), or one that an installed package declares as an entry
point in the ``leakbench.datasets`` group (see `leakbench.core.plugins`).
"""

from __future__ import annotations

from leakbench.core.discovery import import_parts
from leakbench.core.plugins import adopt_function
from leakbench.datasets.base import DATASETS, FILE_SOURCES, Dataset, Split, modality_of
from leakbench.datasets.loading import load_dataset, resize_dataset, resize_images
from leakbench.datasets.text_base import build_vocabulary, load_text_corpus

import_parts(__name__, __path__)

__all__ = [
    "DATASETS",
    "FILE_SOURCES",
    "Dataset",
    "Split",
    "build_vocabulary",
    "load_dataset",
    "load_text_corpus",
    "modality_of",
    "resize_dataset",
    "resize_images",
]


def _adopt(name: str, obj: object) -> bool:
    """Registers a plugin's loader function ``() -> Dataset`` as the named dataset ``name``."""
    return adopt_function(DATASETS, name, obj)


# Named datasets and file sources share the group; a file source registers itself by decorator.
DATASETS.use_entry_points("leakbench.datasets", _adopt)
FILE_SOURCES.use_entry_points("leakbench.datasets")
