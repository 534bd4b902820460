"""scikit-image's LFW subset: 200 grey 25 x 25 patches, faces vs. non-faces, no network."""

from __future__ import annotations

import functools

import numpy as np
from skimage.data import lfw_subset

from leakbench.core.errors import DataError
from leakbench.datasets._util import make_dataset, stratified_split, to_labels, to_unit_float
from leakbench.datasets.base import DATASETS, Dataset

_NUM_FACES = 100


@DATASETS.register("lfw")
@functools.lru_cache(maxsize=1)
def load_lfw_dataset() -> Dataset:
    """Loads ``skimage.data.lfw_subset()``, a face-detection set built from LFW.

    The first 100 images are faces from Labeled Faces in the Wild, the last 100 are background
    patches of the same photos; both resized to 25 x 25 grey. scikit-image ships no labels, so
    they follow that order: label 1 = "face" (images 0-99), label 0 = "non_face" (100-199).
    There is no official split: 25% of each class go to the test split, drawn with
    ``random_state=0`` (150 train and 50 test images).

    Returns:
        The dataset "lfw": 25 x 25 x 1 images, class names ("non_face", "face").
    """
    images = lfw_subset()
    if len(images) != 2 * _NUM_FACES:
        raise DataError(f"skimage lfw_subset(): {len(images)} images, expected 200")
    x = to_unit_float(images, "skimage lfw_subset()")
    y = to_labels((np.arange(len(images)) < _NUM_FACES).astype(np.int64), "lfw labels")
    train, test = stratified_split(x, y, "lfw")
    return make_dataset("lfw", train, test, ("non_face", "face"))
