"""The stages of a standard-suite run: what every defense meets, then what can still matter.

The standard suite (`leakbench.attacks.suite`) is large. A whole run (not a shard) therefore
attacks in stages, one after the other:

0. every trial against ``none`` (where each attack vouches for itself), and the trials of
   attacks outside the suite's families (a plugin the config lists) against every defense;
1. ... then one stage per family of `leakbench.attacks.suite.FAMILIES`, in order (``idlg``,
   ``dlg``, ``ig``): that family's trials (its adaptive variants and the listed attacks of it
   included) against the defenses, each only where its images have not all leaked already under
   the earlier stages' attacks of that defense (the per-image union cannot grow, so the verdict
   cannot change). A family of `EXPENSIVE` (``ig``) runs against a defense only when it broke
   ``none``: an attack that cannot break the undefended setting cannot vouch for a ``holds``.

Both tests read stored results only, so a resumed run decides exactly as an uninterrupted one.
Whether an image leaked under a defense is judged here by the scores alone (recovered; under
protocol 1 also recognisable by its PSNR or LPIPS thresholds), which errs on the side of running
more; whether an attack broke ``none`` by the tables' own flags (identification included:
`leakbench.run.identification`).
A sharded run cannot see the other shards' results and runs every trial of the plan: its
tables may hold more trials than an unsharded run's.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from leakbench.attacks.suite import EXPENSIVE, FAMILIES
from leakbench.components.leakage import RECOGNISABLE_LPIPS, RECOGNISABLE_PSNR
from leakbench.core.canonical import canonical_json
from leakbench.outputs.tables import BROKEN_SHARE
from leakbench.run.plan import Trial


def _stage(trial: Trial) -> int:
    if trial.defense.name == "none" or trial.attack.name not in FAMILIES:
        return 0
    return 1 + FAMILIES.index(trial.attack.name)


def split(standard: bool, trials: list[Trial], whole: bool) -> list[list[Trial]]:
    """The plan's stages, in order (see the module docstring); one stage of everything for a
    run of listed attacks (not ``standard``, `RunSpec.standard`), a shard, or a run without
    ``none`` (whose attacks cannot vouch)."""
    staged = standard and whole and any(t.defense.name == "none" for t in trials)
    if not staged:
        return [list(trials)]
    stages = [[t for t in trials if _stage(t) == k] for k in range(len(FAMILIES) + 1)]
    return [stages[0]] + [s for s in stages[1:] if s]


def scored_leaks(rows: pd.DataFrame, success_mse: float, protocol: int = 1) -> np.ndarray:
    """Per stored row, whether its scores alone show a leak: recovered, or (protocol 1)
    recognisable by protocol 1's thresholds. Protocol 2's ``recognisable`` needs the arrays
    (the dataset's null bounds and the row's own label-only null), so its scores show a
    recovered image only: a gate never passes over an image the tables would not count."""
    recovered = rows["mse"].astype(float) <= success_mse
    if protocol != 1:
        return np.asarray(recovered)
    lpips = rows["lpips"].astype(float) if "lpips" in rows else np.nan
    return np.asarray(
        recovered
        | (rows["psnr"].astype(float) >= RECOGNISABLE_PSNR)
        | (lpips <= RECOGNISABLE_LPIPS)
    )


class _Texts:
    """Each attack's and defense's name and parameters as canonical JSON, computed once per
    object: a plan's trials share their attack and defense objects, and one gate reads them
    thousands of times. Lives for one gate."""

    def __init__(self) -> None:
        # id -> (the object, kept alive so that its id is not reused; its text; its cell)
        self._known: dict[int, tuple[Any, str, str]] = {}

    def _of(self, component: Any) -> tuple[Any, str, str]:
        key = id(component)
        if key not in self._known:
            params = component.params()
            text = canonical_json([component.name, params])
            self._known[key] = (component, text, component.name + canonical_json(params))
        return self._known[key]

    def __call__(self, component: Any) -> str:
        """The name and parameters as one canonical JSON list."""
        return self._of(component)[1]

    def cell(self, component: Any) -> str:
        """The name followed by the parameters' canonical JSON, as the stored rows spell them."""
        return self._of(component)[2]


def gate(
    first: list[Trial],
    second: list[Trial],
    rows: Iterable[dict[str, Any]],
    success_mse: float,
    protocol: int = 1,
) -> list[Trial]:
    """The trials of ``second`` (a later stage) worth running, given the stored ``rows`` of
    ``first`` (every earlier stage; rows with a ``leaked`` flag add it to their scores, read
    by ``protocol``'s rules: `scored_leaks`), in plan order: see the module docstring."""
    frame = pd.DataFrame(list(rows))
    if frame.empty or not second:
        return list(second)
    scored = scored_leaks(frame, success_mse, protocol)
    if "leaked" in frame:  # the tables' flags, where this stage's caller exported them
        scored = scored | (frame["leaked"].astype(float).fillna(0).to_numpy() == 1)
    frame["leak"] = scored
    text = _Texts()
    owner = {t.key: t for t in first}
    by_key = _rows_by_trial(first, frame, text)
    on_none = {text(owner[k].attack) for k in by_key if owner[k].defense.name == "none"}
    vouched = {
        attack for attack in on_none if _share_on_none(first, by_key, attack, text) >= BROKEN_SHARE
    }
    vouched |= {text(t.attack) for t in second if t.attack.name not in EXPENSIVE}
    leaked = {
        (text(owner[key].defense), owner[key].seed, int(index))
        for key, leaks in by_key.items()
        for index, leak in zip(owner[key].indices, leaks, strict=True)
        if leak
    }
    return [
        t
        for t in second
        if text(t.attack) in vouched
        and not all((text(t.defense), t.seed, int(i)) in leaked for i in t.indices)
    ]


def _rows_by_trial(trials: list[Trial], frame: pd.DataFrame, text: _Texts) -> dict[str, list[bool]]:
    """Per stored trial of ``trials``, whether each of its images leaked by its scores, in the
    order of its indices. The rows of one trial share seed, batch, attack and defense."""
    frame = frame.assign(
        _cell=frame["attack"] + frame["attack_params"] + frame["defense"] + frame["defense_params"]
    )
    groups = {
        (cell, int(seed), int(batch)): group
        for (cell, seed, batch), group in frame.groupby(["_cell", "seed", "batch_index"])
    }
    result = {}
    for trial in trials:
        cell = text.cell(trial.attack) + text.cell(trial.defense)
        group = groups.get((cell, trial.seed, trial.batch_index))
        if group is None:
            continue
        at = dict(zip(group["image_index"].astype(int), group["leak"], strict=True))
        result[trial.key] = [bool(at.get(int(i), False)) for i in trial.indices]
    return result


def _share_on_none(
    trials: list[Trial], by_key: dict[str, list[bool]], attack: str, text: _Texts
) -> float:
    """The share of images the attack ``attack`` (its text) leaked against ``none``, by scores."""
    flags = [
        flag
        for t in trials
        if t.defense.name == "none" and text(t.attack) == attack and t.key in by_key
        for flag in by_key[t.key]
    ]
    return float(np.mean(flags)) if flags else 0.0
