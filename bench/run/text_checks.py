"""What makes a run a text run, and the checks of one (`leakbench.run.config.build_run`).

A run is a text run when its dataset is a text corpus: a name of `TEXT_CORPORA`
(``tinyshakespeare``) or a file source of `TEXT_SOURCES` (``text:PATH``). Its model must be a
text model (`TEXT_MODELS`, or a saved one, ``keras:PATH``, checked when the run loads it), its
attacks text attacks (`leakbench.attacks.text.base`), and its defenses those that can act on
a text model's dense gradient (`leakbench.modalities.text.check_text_defense`). Its threat
model is an honest server that sees one client's defended gradient (FedSGD), or FedAvg
(``local_steps`` / ``local_epochs``, ``local_batch_size``, ``local_lr``) and secure aggregation
(``clients``) with the image track's meanings and refusals (`check_text_threat_model`). It
trains its utility models by ``[text]``, not ``[training]``; the rest is refused in one line
each, before anything is loaded or written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from leakbench.components.saved_models import is_saved_model
from leakbench.components.text_models import TEXT_MODELS
from leakbench.core.errors import ConfigError
from leakbench.datasets.text_base import TEXT_CORPORA, TEXT_SOURCES
from leakbench.modalities.text import check_text_defense
from leakbench.run.checks import check_fedavg_defenses, check_local_training, check_unique
from leakbench.run.sections import ThreatModel


def is_text_dataset(name: str) -> bool:
    """Whether ``name`` is a text corpus (``tinyshakespeare``, ``text:PATH``)."""
    prefix, sep, _ = name.partition(":")
    if sep:
        return TEXT_SOURCES.peek(prefix) is not None
    return TEXT_CORPORA.peek(name) is not None


def _check_text_model(spec: Any) -> None:
    """Refuses an image model, and the [text] settings a saved model (``keras:PATH``, its own
    weights and head) cannot take; the file itself is checked when the run loads it."""
    if is_saved_model(spec.model):
        for name in ("tie_embeddings", "freeze_embeddings"):
            if getattr(spec.text, name):
                raise ConfigError(
                    f"text.{name}: model {spec.model} is a saved model whose layers are the "
                    "file's; build them so (a frozen layer: layer.trainable = False) before "
                    "saving, and leave this false"
                )
        return
    if spec.model not in TEXT_MODELS:
        raise ConfigError(
            f"model {spec.model} is an image model; dataset {spec.dataset} is a text corpus: "
            f"choose a text model ({', '.join(TEXT_MODELS.names())}) or keras:PATH"
        )


def check_text_run(spec: Any, doc: Mapping[str, Any], runnable: bool) -> None:
    """Refuses what a text run (``spec``, a `leakbench.run.config.RunSpec` built from ``doc``)
    cannot hold, in one line naming the key; with ``runnable`` also its grids."""
    _check_text_model(spec)
    check_text_threat_model(spec.threat_model, spec.text.batch_sizes)
    if doc.get("training", {"enabled": False}) != {"enabled": False}:
        raise ConfigError(
            "training: a text run trains its utility models by [text] train_epochs, "
            "train_batch_size and learning_rate; leave [training] out"
        )
    if not runnable:
        return
    check_unique("attack", spec.text_attack_grid())
    defenses = spec.defense_grid()
    check_unique("defense", defenses)
    for defense in defenses:
        check_text_defense(defense)
    for size in spec.text.batch_sizes:
        check_fedavg_defenses(defenses, spec.threat_model.local_training(size))
    largest = max(spec.text.batch_sizes)
    clients = spec.threat_model.clients
    if spec.images < largest * clients:
        what = "" if clients == 1 else f" x threat_model.clients ({largest * clients})"
        raise ConfigError(
            f"images must be at least the largest text.batch_sizes ({largest}){what} so that "
            f"every batch size attacks a batch, got {spec.images}"
        )


# The [threat_model] keys a text run takes: FedAvg's and secure aggregation's.
TEXT_THREAT_KEYS = ("clients", "local_steps", "local_epochs", "local_batch_size", "local_lr")


def check_text_threat_model(threat: ThreatModel, batch_sizes: tuple[int, ...]) -> None:
    """Refuses a threat model a text run cannot take (one line): a key other than
    `TEXT_THREAT_KEYS`, and for each client batch size B what the image track refuses for its
    ``batch_size`` (`leakbench.run.checks.check_local_training`: settings FedSGD ignores, local
    steps that miss a mini-batch, FedAvg with clients above 1)."""
    other = sorted(set(threat.changes()) - set(TEXT_THREAT_KEYS))
    if other:
        raise ConfigError(
            f"threat_model.{other[0]}: a text run takes an honest server and only "
            f"{', '.join(TEXT_THREAT_KEYS)} in [threat_model]; leave {other[0]} out"
        )
    if threat.local_steps > 1 and threat.local_epochs > 1:
        raise ConfigError(
            "threat_model: give local_steps or local_epochs, not both (local_epochs = E is E "
            "passes over the client's batch)"
        )
    smallest = min(batch_sizes)
    if threat.local_batch_size > smallest:
        raise ConfigError(
            f"threat_model.local_batch_size must be at most the smallest text.batch_sizes "
            f"({smallest}), got {threat.local_batch_size}"
        )
    for size in batch_sizes:
        check_local_training(threat, size)
