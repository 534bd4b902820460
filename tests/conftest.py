"""Fixtures shared by the attack tests: the embedded digits and the DLG LeNet for them."""

from __future__ import annotations

import keras
import pytest

from leakbench.components.models import build_model
from leakbench.datasets import Dataset, load_dataset


@pytest.fixture(scope="session")
def digits() -> Dataset:
    """scikit-learn's 8x8 digits (embedded, no network)."""
    return load_dataset("digits")


@pytest.fixture(scope="session")
def lenet() -> keras.Model:
    """The DLG LeNet for 8x8x1 digits at its seed-0 initialisation (tests never change it)."""
    return build_model("lenet", (8, 8, 1), 10, seed=0)
