"""What makes a run a text run, and the checks of one (`leakbench.run.config.build_run`).

A run is a text run when its dataset is a text corpus: a name of `TEXT_CORPORA`
(``tinyshakespeare``) or a file source of `TEXT_SOURCES` (``text:PATH``). Its model must be a
text model (`TEXT_MODELS`), its attacks text attacks (`leakbench.attacks.text_base`), and its
defenses those that can act on a text model's dense gradient
(`leakbench.client.text_update.check_text_defense`). The text track runs the default threat
model (FedSGD: one client shares its defended gradient to an honest server) and trains its
utility models by ``[text]``, not ``[training]``; the rest is refused in one line each, before
anything is loaded or written.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from leakbench.client.text_update import check_text_defense
from leakbench.components.text_models import TEXT_MODELS
from leakbench.core.errors import ConfigError
from leakbench.datasets.text_base import TEXT_CORPORA, TEXT_SOURCES
from leakbench.run.checks import check_unique
from leakbench.run.sections import ThreatModel


def is_text_dataset(name: str) -> bool:
    """Whether ``name`` is a text corpus (``tinyshakespeare``, ``text:PATH``)."""
    prefix, sep, _ = name.partition(":")
    if sep:
        return TEXT_SOURCES.peek(prefix) is not None
    return TEXT_CORPORA.peek(name) is not None


def check_text_run(spec: Any, doc: Mapping[str, Any], runnable: bool) -> None:
    """Refuses what a text run (``spec``, a `leakbench.run.config.RunSpec` built from ``doc``)
    cannot hold, in one line naming the key; with ``runnable`` also its grids."""
    if spec.model not in TEXT_MODELS:
        raise ConfigError(
            f"model {spec.model} is an image model; dataset {spec.dataset} is a text corpus: "
            f"choose a text model ({', '.join(TEXT_MODELS.names())})"
        )
    if spec.threat_model != ThreatModel():
        changed = ", ".join(sorted(spec.threat_model.changes()))
        raise ConfigError(
            f"threat_model.{changed.split(', ')[0]}: a text run takes the default threat model "
            "(FedSGD, one client, an honest server) for now; leave [threat_model] out"
        )
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
    largest = max(spec.text.batch_sizes)
    if spec.images < largest:
        raise ConfigError(
            f"images must be at least the largest text.batch_sizes ({largest}) so that every "
            f"batch size attacks a batch, got {spec.images}"
        )
