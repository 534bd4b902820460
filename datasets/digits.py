"""scikit-learn's handwritten digits: 1,797 grey 8 x 8 images of the digits 0-9, no network."""

from __future__ import annotations

import functools

from sklearn.datasets import load_digits

from leakbench.datasets._util import make_dataset, stratified_split, to_labels, to_unit_float
from leakbench.datasets.base import DATASETS, Dataset


@DATASETS.register("digits")
@functools.lru_cache(maxsize=1)
def load_digits_dataset() -> Dataset:
    """Loads ``sklearn.datasets.load_digits()`` (the UCI optical digits test set).

    Pixels are counts 0..16 and are divided by 16. The data has no official split, so the
    deterministic stratified split of `stratified_split` is used: 25% of each class go to the
    test split, drawn with ``random_state=0`` (1,347 train and 450 test images).

    Returns:
        The dataset "digits": 8 x 8 x 1 images, class names "0".."9".
    """
    bunch = load_digits()
    x = to_unit_float(bunch.images / 16.0, "sklearn load_digits()")
    y = to_labels(bunch.target, "sklearn load_digits()")
    train, test = stratified_split(x, y, "digits")
    return make_dataset("digits", train, test, tuple(str(k) for k in range(10)))
