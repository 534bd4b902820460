"""leakbench: gradient-leakage attacks against gradient defenses, in TensorFlow 2 / Keras 3."""

from __future__ import annotations

__version__ = "0.1.0"
