"""Small run configs for the tests, written as TOML text from plain values."""

from __future__ import annotations

from typing import Any

import tomli_w


def run_config(
    name: str,
    *,
    images: int,
    seeds: tuple[int, ...] = (0,),
    model: str = "lenet",
    parallel_trials: int | None = None,
    attacks: tuple[dict[str, Any], ...] = ({"name": "idlg", "iterations": 5},),
    defenses: tuple[dict[str, Any], ...] = ({"name": "none"},),
    training: dict[str, Any] | None = None,
    suite: str = "listed",
) -> str:
    """The TOML text of a run on the embedded digits; ``training`` None disables training.
    ``suite`` is "listed" unless a test asks for the standard suite: most tests are about
    something else, and the suite would multiply their attacks."""
    doc: dict[str, Any] = {"name": name, "dataset": "digits", "model": model, "images": images,
                           "seeds": list(seeds), "suite": suite}  # fmt: skip
    if parallel_trials is not None:
        doc["parallel_trials"] = parallel_trials
    doc["attack"] = list(attacks)
    doc["defense"] = list(defenses)
    doc["training"] = {"enabled": False} if training is None else training
    return tomli_w.dumps(doc)
