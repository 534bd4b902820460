"""One sample configuration per registered defense, shared by the defense tests.

A newly registered defense needs one row here (its sample parameters, and whether its output
depends on the seed); `tests/test_defenses.py` and `tests/test_per_example.py` fail without it.
"""

from __future__ import annotations

from typing import Any

SAMPLES: dict[str, tuple[dict[str, Any], bool]] = {
    "none": ({}, False),
    "gaussian": ({"sigma": 0.1}, True),
    "laplace": ({"b": 0.1}, True),
    "clip": ({"norm": 1.0}, False),
    "prune": ({"ratio": 0.5}, False),
    "dpsgd": ({"norm": 1.0, "noise_multiplier": 1.1}, True),
    "fp16": ({}, False),
    "int8": ({}, False),
    "topk": ({"fraction": 0.25}, False),
    "relative_noise": ({"sigma": 0.5}, True),
    # Random in the batch they prepare or the model they extend, not in the gradient.
    "mixup": ({"mixed": 2}, False),
    "precode": ({"size": 8}, False),
    "soteria": ({"share": 0.5}, False),
    "chain": (
        {"steps": [{"name": "clip", "norm": 1.0}, {"name": "gaussian", "sigma": 0.01}]},
        True,
    ),
}

# The per-example tests run the chain with an example-level step, so that a chain's level is
# exercised too.
EXAMPLE_LEVEL = {
    "chain": {
        "steps": [
            {"name": "dpsgd", "norm": 1.0, "noise_multiplier": 0.5},
            {"name": "gaussian", "sigma": 0.01},
        ]
    },
}
