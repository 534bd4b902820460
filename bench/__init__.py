"""leakbench: gradient-leakage attacks against gradient defenses, in TensorFlow 2 / Keras 3.

The package is built in floors, one folder each, and a module imports only from its own floor
or the floors below (`tests/test_layers.py` checks it; `docs/architecture.md` draws it):
`leakbench.core`, then `leakbench.components` (beside `leakbench.defenses`,
`leakbench.datasets` and `leakbench.attacks.priors`), `leakbench.attacks.engine`, then
`leakbench.attacks` and `leakbench.client`, `leakbench.outputs`, `leakbench.run`,
`leakbench.integrations` and, on top, `leakbench.cli`.
"""

from __future__ import annotations

import importlib

__version__ = "0.3.0"

# The public API: the names ``leakbench.NAME`` gives from the floors, imported on first use so
# that importing leakbench stays cheap (no TensorFlow) and this module's body below every floor.
# The layer test counts ``leakbench.NAME`` as an import of the module named here. The plugin
# surfaces are the packages ``leakbench.attacks``, ``leakbench.defenses``, ``leakbench.datasets``
# and ``leakbench.modalities`` (each with its ``__all__``); the docs import only from these
# (docs/architecture.md, "Public API"; tests/test_public_api.py).
LAZY = {
    # run a benchmark, audit a model
    "audit": "leakbench.run.audit",
    "AuditResult": "leakbench.run.audit",
    "multistep_audit": "leakbench.run.multistep_audit",
    "run_benchmark": "leakbench.run.runner",
    "RunResult": "leakbench.run.runner",
    "load_config": "leakbench.run.config",
    "parse_config": "leakbench.run.config",
    "RunSpec": "leakbench.run.config",
    # attacks, defenses, datasets, models: registries, bases, factories
    "ATTACKS": "leakbench.attacks",
    "Attack": "leakbench.attacks",
    "AttackTarget": "leakbench.attacks",
    "TextAttack": "leakbench.attacks",
    "make_attack": "leakbench.attacks",
    "DEFENSES": "leakbench.defenses",
    "Defense": "leakbench.defenses",
    "function_defense": "leakbench.defenses",
    "make_defense": "leakbench.defenses",
    "DATASETS": "leakbench.datasets",
    "Dataset": "leakbench.datasets",
    "load_dataset": "leakbench.datasets",
    "MODELS": "leakbench.components.models",
    "build_model": "leakbench.components.models",
    "build_text_model": "leakbench.components.text_models",
    "score_text_batch": "leakbench.components.text_metrics",
    # a component's parameters, the client's local training
    "param": "leakbench.core.params",
    "Int": "leakbench.core.params",
    "Number": "leakbench.core.params",
    "LocalTraining": "leakbench.core.federated",
    "DefendedTrainer": "leakbench.client.training",
    "TrainingConfig": "leakbench.client.training",
    # the errors a user can cause
    "LeakbenchError": "leakbench.core.errors",
    "ConfigError": "leakbench.core.errors",
    "DataError": "leakbench.core.errors",
    "UnknownNameError": "leakbench.core.errors",
}

__all__ = ["__version__", *LAZY]


def __getattr__(name: str) -> object:
    if name in LAZY:
        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module 'leakbench' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *LAZY])
