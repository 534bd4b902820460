"""What a run or a report was made with: the engine version (`leakbench.versions`), library
versions, machine, devices and the date."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import sys
from typing import Any

from leakbench.versions import ENGINE_VERSION

ENVIRONMENT_FILE = "environment.json"
_PACKAGES = ("leakbench", "tensorflow", "keras", "numpy", "pandas", "matplotlib")


def describe_environment() -> dict[str, Any]:
    """Versions of the packages that decide the numbers, the machine, TensorFlow's devices and
    the current UTC time (ISO 8601)."""
    import tensorflow as tf

    versions = {}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "engine_version": ENGINE_VERSION,
        "python": sys.version.split()[0],
        **versions,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "devices": [d.name for d in tf.config.list_logical_devices()],
    }
