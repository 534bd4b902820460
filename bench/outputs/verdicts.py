"""Verdicts and ranks of a leaderboard's defense configurations (protocol 1).

The rules are stated once, below beside their constants, and applied here. The inputs are a
board of cells (one row per attack and defense configuration, with ``strongest``) and the trial
rows with their per-image ``leaked`` flags; the outputs are the defense-level columns
(`suite_union`), the ``vouched`` flag of each attack row, and the ``rank``, ``pareto``,
``verdict`` and ``verdict_note`` of every row.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from leakbench.attacks.base import build_attack
from leakbench.attacks.suite import PROTOCOL
from leakbench.attacks.text.suite import text_settings
from leakbench.components.leakage import exact_interval
from leakbench.core.canonical import canonical_json
from leakbench.core.errors import LeakbenchError
from leakbench.defenses import DEFENSES
from leakbench.outputs.leak_flags import defense_of, protocol_suite, server_of
from leakbench.outputs.naming import attack_label

# The verdict of a defense configuration (protocol 1, `leakbench.attacks.suite`) comes from the
# per-image union over every attack that ran on it: an image has leaked when any attack leaked
# it (recovered, identified or recognisable: `leakbench.components.leakage`), and ``suite_leaked``
# of ``suite_n`` images did, with the Clopper-Pearson interval ``suite_low``-``suite_high``.
#
# - ``baseline``: the row of ``none``, shown for reference and never ranked;
# - ``broken``: the share reaches BROKEN_SHARE and rests on at least MIN_BROKEN_IMAGES images (a
#   share resting on one image is ``leaks``: one image proves a leak, not a rate);
# - ``leaks``: at least one image leaked;
# - with no image leaked, in this order of checks:
#   ``inconclusive``: no attack broke ``none`` in the same (dataset, model) (no attack that could
#     vouch for itself), or none leaked CONCLUSIVE_SHARE of its images there;
#   ``untested``: the run listed its own attacks (``suite = "listed"``), or an attack of the
#     protocol did not run against the defense (neither there, nor failed to break ``none``);
#   ``inconclusive (attack did not converge)``: some image was not attacked by an attack that
#     both broke ``none`` (it vouches for itself) and converged on it (the judge's evidence,
#     ``converged``; an attack that optimises nothing needs none);
#   ``holds (underpowered)``: the interval's upper end is not below BROKEN_SHARE (0 of n needs
#     n >= 36 for that at 95%); never ranked;
#   ``holds``: otherwise.
# A verdict along a defense's strength knob (`leakbench.defenses.Defense.strength`) that says a
# stronger setting leaks more than a weaker one is flagged in its note.
#
# A text run (`rank_text_defenses`) is judged per (dataset, model, batch size), its images
# being sentences, by these rules less two: no check that every attack of the suite ran, and
# one ``inconclusive`` note; under protocol 1 no check of convergence either (a text attack
# converged when it says so: `TEXT_CONVERGED`). It is ranked by the share leaked, then the
# perplexity.
#
# Protocol 2 keeps these rules and changes six (each a law in tests/test_verdict_laws.py):
# - an identification counts by a test corrected for the defense configuration's own suite
#   (`leakbench.outputs.leak_flags.configuration_alphas`), never for the rest of the run;
# - ``recognisable`` needs the label-only null beaten, on the image's own label and on all but
#   0.5% of the public images per measure (the dataset's null bounds, which replace the
#   reader's thresholds: `leakbench.components.leakage.null_bounds`);
# - an attack vouches only if it leaks at least VOUCH_SHARE of the images of ``none``;
# - convergence evidence (`evidence`) is only from an attack whose final matching loss is not
#   below the true input's (else the true input does not minimise what it minimised, and its
#   failure says nothing), and, for a defense that declares adaptive settings, only from the
#   attacks that carry one or learn through the defense itself (the learned attack);
# - ``broken`` needs the interval's lower end at or above BROKEN_SHARE, as ``holds`` needs its
#   upper end below it: each at 95% confidence, ``leaks`` in between;
# - a defense whose leaked share and accuracy cannot be told apart from the one ranked before
#   it (their 95% intervals overlap) shares its rank (`overlap_ranks`).
BROKEN_SHARE = 0.10
MIN_BROKEN_IMAGES = 2
CONCLUSIVE_SHARE = 0.5
VOUCH_SHARE = 0.5
# How a text attack that converged says it stopped (`evidence`, protocol 2).
TEXT_CONVERGED = ("converged", "exact")
UNDERPOWERED = "holds (underpowered)"
# Protocol 2: a ``holds`` counts the images of at least MIN_HOLDS_SEEDS model seeds (each seed
# its own initialisation, training and private images), so that one lucky model never carries
# the claim; fewer give ONE_SEED, which is not ranked.
MIN_HOLDS_SEEDS = 2
ONE_SEED = "holds (one model seed)"
UNCONVERGED = "inconclusive (attack did not converge)"
VERDICTS = (
    "broken", "leaks", "holds", UNDERPOWERED, ONE_SEED, "untested", "inconclusive", UNCONVERGED,
    "baseline",
)  # fmt: skip
# Only these verdicts are ranked: a defense that was not tested properly never ranks above one
# that was.
RANKED_VERDICTS = ("broken", "leaks", "holds")
VERDICT_RULE = (
    "verdict (protocol 2): from the images leaked (recovered, identified or recognisable "
    "beyond the label-only null) by any attack of the suite: broken: 95% lower bound >= "
    f"{BROKEN_SHARE:.0%}, leaks > 0, holds = 0 with its 95% upper bound < {BROKEN_SHARE:.0%} "
    f"(else holds (underpowered)), images of >= {MIN_HOLDS_SEEDS} model seeds (else holds "
    "(one model seed)) and every image attacked by an attack that leaks >= "
    f"{VOUCH_SHARE:.0%} of none, answers the defense and reached the true input's loss; "
    "untested: an attack of the suite did not run; inconclusive: no attack leaks "
    f">= {CONCLUSIVE_SHARE:.0%} of the images without a defense; none is the baseline"
)
# What a verdict is relative to: an image run's (dataset, model); a defense configuration is
# one of these and its defense and parameters.
SETTING = ["dataset", "model"]
TEXT_SETTING = [*SETTING, "batch_size"]  # a text run's: it attacks several batch sizes
DEFENSE_KEYS = [*SETTING, "defense", "defense_params"]
# The defense-level columns of `suite_union`, on every row of a defense configuration.
SUITE_COLUMNS = ["suite_leaked", "suite_n", "suite_low", "suite_high"]
# `suite_union`'s frame: those, the images without convergence evidence, and the batch size.
UNION_COLUMNS = [*DEFENSE_KEYS, *SUITE_COLUMNS, "unproven", "batch_size", "seeds"]
# How severe each verdict is, for the monotonicity check along a strength knob.
SEVERITY = {"holds": 0, "leaks": 1, "broken": 2}


def canonical_attack(name: str, params: str) -> str:
    """An attack configuration as one text, the same however its parameters' JSON was written."""
    try:
        return canonical_json([name, json.loads(params)])
    except (TypeError, ValueError):
        return canonical_json([name, str(params)])


def attack_keys(frame: pd.DataFrame, setting: list[str]) -> list[tuple[Any, ...]]:
    """Per row: its ``setting`` values and its attack configuration (`canonical_attack`)."""
    columns = [*setting, "attack", "attack_params"]
    return [
        (*row[:-2], canonical_attack(row[-2], row[-1]))
        for row in frame[columns].itertuples(index=False, name=None)
    ]


def vouched(board: pd.DataFrame, broken_share: float, setting: list[str] = SETTING) -> pd.Series:
    """Per row: whether its attack configuration broke ``none`` in the same ``setting``,
    leaking at least ``broken_share`` of the images there (it vouches for itself)."""
    none = board[board["defense"] == "none"]
    broke = none["leaked_rate"].astype(float) >= broken_share
    good = {key for key, yes in zip(attack_keys(none, setting), broke, strict=True) if yes}
    return pd.Series([k in good for k in attack_keys(board, setting)], board.index, dtype=bool)


def vouch_share(protocol: int) -> float:
    """The share of ``none``'s images an attack must leak to vouch for itself: protocol 1's
    `BROKEN_SHARE`, protocol 2's (and a listed run's) `VOUCH_SHARE`."""
    return BROKEN_SHARE if protocol == 1 else VOUCH_SHARE


def evidence(trials: pd.DataFrame, protocol: int = PROTOCOL) -> pd.Series:
    """Per trial row: whether it is convergence evidence. Its attack converged on it by the
    judge (``converged`` = 1), or optimises nothing (no ``stop_reason``) and so needs no such
    evidence; under protocol 2 (and a listed run) also the rules above: a judged loss not
    below the truth's, and one of the defense's adaptive settings (`adaptive_rows`)."""
    reason = trials["stop_reason"] if "stop_reason" in trials else pd.Series("", trials.index)
    reason = reason.fillna("").astype(str)
    if "converged" in trials:
        converged = trials["converged"]
    elif protocol != 1:
        # A text run's attacks say how they stopped, with no judge's column: they converged,
        # or matched exactly, or they did not (stalled, out of budget, beyond the rank test).
        converged = reason.isin(TEXT_CONVERGED).astype(float).where(reason.ne(""))
    else:
        converged = pd.Series(np.nan, trials.index)
    unjudged = converged.isna() & reason.eq("")
    found = converged.eq(1) | unjudged
    if protocol == 1:
        return found
    if {"judged_loss", "truth_loss"} <= set(trials):
        below = trials["judged_loss"].astype(float) < trials["truth_loss"].astype(float)
        found &= ~below  # unknown losses (NaN) compare false: no evidence is taken away
    return found & adaptive_rows(trials)


def adaptive_rows(trials: pd.DataFrame) -> pd.Series:
    """Per trial row: whether its attack answers its defense. True where the defense declares
    no adaptive setting (or is unknown here); else where the attack carries one of the
    settings (applying it changes nothing) or learns through the defense itself
    (`leakbench.attacks.base.Attack.uses_simulator`)."""
    result = pd.Series(True, index=trials.index, dtype=bool)
    if trials.empty or "defense" not in trials:
        return result
    modality = "text" if "sentence_index" in trials else "image"
    for _, group in trials.groupby(["defense", "defense_params"], sort=False):
        defense = defense_of(group.iloc[0])
        if defense is None:
            continue
        settings = text_settings(defense) if modality == "text" else defense.adaptive_attacks()
        if not settings:
            continue
        for (attack, attack_params), rows in group.groupby(["attack", "attack_params"]):
            answers = _answers(str(attack), str(attack_params), settings, modality)
            result.loc[rows.index] = answers
    return result


def _answers(name: str, params: str, settings: Any, modality: str = "image") -> bool:
    """Whether the attack ``name`` with ``params`` carries one of ``settings`` or learns
    through the defense; an attack this installation cannot build answers nothing."""
    try:
        attack = build_attack(modality, name, json.loads(params))
    except (LeakbenchError, ValueError, TypeError):
        return False
    if attack.uses_simulator():
        return True
    own = canonical_json(attack.params())
    for setting in settings:
        variant = attack.with_setting(setting)
        if variant is not None and canonical_json(variant.params()) == own:
            return True
    return False


def suite_union(
    trials: pd.DataFrame,
    vouchers: set[tuple[Any, ...]],
    setting: list[str] = SETTING,
    item: str = "image_index",
    protocol: int = PROTOCOL,
) -> pd.DataFrame:
    """Per defense configuration (of a ``setting``): ``suite_leaked`` images of ``suite_n``
    leaked under any attack (the per-image union; an image is a seed's private ``item``), the
    interval ``suite_low`` - ``suite_high``, ``unproven``: images that no vouching attack
    (``vouchers``: the setting's values and the attack text) attacked with evidence of
    convergence (`evidence`, by ``protocol``'s rules) without leaking them, and ``seeds``: the
    model seeds its images come from."""
    frame = trials.assign(
        _image=trials["seed"].astype(str) + ":" + trials[item].astype(str),
        _leaked=trials["leaked"].fillna(0).astype(float) == 1,
        _vouched=[key in vouchers for key in attack_keys(trials, setting)],
    )
    frame["_tested"] = frame["_vouched"] & evidence(frame, protocol)
    keys_of = [*setting, "defense", "defense_params"]
    rows = []
    for keys, group in frame.groupby(keys_of, sort=False):
        images = group.groupby("_image", sort=False).agg(
            leaked=("_leaked", "any"), tested=("_tested", "any")
        )
        k, n = int(images["leaked"].sum()), len(images)
        low, high = exact_interval(k, n)
        unproven = int((~images["leaked"] & ~images["tested"]).sum())
        batch = int(group["batch_size"].iloc[0]) if "batch_size" in group else 1
        rows.append(
            {**dict(zip(keys_of, keys, strict=True)), "suite_leaked": k, "suite_n": n,
             "suite_low": low, "suite_high": high, "unproven": unproven, "batch_size": batch,
             "seeds": group["seed"].nunique()}
        )  # fmt: skip
    columns = dict.fromkeys([*keys_of, *SUITE_COLUMNS, "unproven", "batch_size", "seeds"])
    return pd.DataFrame(rows, columns=list(columns))


def missing_suite(rows: pd.DataFrame, none_rows: pd.DataFrame, batch: int) -> list[str]:
    """The protocol's attacks (`leakbench.attacks.suite.expected`) that did not meet the
    defense of ``rows`` (`leakbench.outputs.leak_flags.protocol_suite`): neither ran on it, nor
    ran on ``none`` and failed to vouch there (an attack the two-stage run spared,
    `leakbench.run.stages`). A defense this installation does not know expects nothing."""
    defense = defense_of(rows.iloc[0])
    if defense is None:
        return []
    ran = {
        canonical_attack(a, p) for a, p in zip(rows["attack"], rows["attack_params"], strict=True)
    }
    on_none = {
        canonical_attack(a, p): bool(v)
        for a, p, v in zip(
            none_rows["attack"], none_rows["attack_params"], none_rows["vouched"], strict=True
        )
    }
    attacks = protocol_suite(defense, batch, server_of(rows["attack"]))
    missing = []
    for attack in attacks:
        text = canonical_json([attack.name, attack.params()])
        if text in ran or on_none.get(text) is False:
            continue
        missing.append(_label(attack.name, attack.params()))
    return missing


def _label(name: str, params: dict[str, Any]) -> str:
    """An attack's name with what sets it apart from its family's defaults."""
    return attack_label(name, canonical_json(params))


def monotone_notes(verdicts: pd.DataFrame) -> dict[Any, str]:
    """Per defense configuration (its index in ``verdicts``, which has the defense columns and
    ``verdict``): a note where a stronger setting along the defense's strength knob has a more
    severe verdict than a weaker one of the same (dataset, model)."""
    notes: dict[Any, str] = {}
    for (_, _, name), group in verdicts.groupby(["dataset", "model", "defense"], sort=False):
        cls = DEFENSES.peek(str(name))
        knob = getattr(cls, "strength", None) if cls is not None else None
        if knob is None or len(group) < 2:
            continue
        values = [json.loads(p).get(knob[0]) for p in group["defense_params"]]
        if any(not isinstance(v, (int, float)) for v in values):
            continue
        order = np.argsort(np.asarray(values, float) * knob[1], kind="stable")
        lowest: tuple[int, str, float] | None = None  # the mildest verdict of weaker settings
        for i in order:
            verdict = str(group.iloc[i]["verdict"])
            severity = SEVERITY.get(verdict)
            if severity is None:
                continue
            if lowest is not None and severity > lowest[0]:
                notes[group.index[i]] = (
                    f"not monotone: {knob[0]}={values[i]:g} is {verdict}, the weaker "
                    f"{knob[0]}={lowest[2]:g} is {lowest[1]}"
                )
            if lowest is None or severity < lowest[0]:
                lowest = (severity, verdict, float(values[i]))
    return notes


def worst_case(board: pd.DataFrame) -> pd.DataFrame:
    """Per row, its defense configuration's leaked share over the suite (``suite_leaked`` /
    ``suite_n``, or on a board without them its strongest attack's ``leaked_rate``) with its
    interval, and the highest ``success_rate`` of its attacks, as ``worst_leaked``,
    ``worst_low``, ``worst_high`` and ``worst_success``."""
    keys = [c for c in DEFENSE_KEYS if c in board.columns]
    grouped = board.groupby(keys, sort=False, dropna=False)
    success = grouped["success_rate"].transform("max").astype(float).to_numpy()
    if "suite_n" in board and board["suite_n"].notna().all() and len(board):
        return pd.DataFrame(
            {
                "worst_leaked": (board["suite_leaked"] / board["suite_n"]).to_numpy(float),
                "worst_low": board["suite_low"].to_numpy(float),
                "worst_high": board["suite_high"].to_numpy(float),
                "worst_success": success,
            },
            index=board.index,
        )
    heads = board[board["strongest"].astype(bool)].set_index(keys)
    if "leaked_rate" not in heads:  # a board of success rates only (written by hand, or old)
        heads = heads.assign(
            leaked_rate=heads["success_rate"], leaked_low=np.nan, leaked_high=np.nan
        )
    at = pd.MultiIndex.from_frame(board[keys]) if len(keys) > 1 else board[keys[0]]
    return pd.DataFrame(
        {
            "worst_leaked": heads["leaked_rate"].reindex(at).to_numpy(float),
            "worst_low": heads["leaked_low"].reindex(at).to_numpy(float),
            "worst_high": heads["leaked_high"].reindex(at).to_numpy(float),
            "worst_success": success,
        },
        index=board.index,
    )


def verdict(leaked: int, n: int, protocol: int = PROTOCOL) -> str:
    """The verdict of ``leaked`` of ``n`` images, before the checks that need more than the
    count: ``broken``, ``leaks``, ``holds`` or ``holds (underpowered)``; empty for no image.
    ``broken`` is protocol 1's point estimate, protocol 2's interval (the rules above)."""
    if n <= 0:
        return ""
    if leaked > 0:
        if protocol == 1:
            broken = leaked / n >= BROKEN_SHARE and leaked >= MIN_BROKEN_IMAGES
        else:
            broken = exact_interval(leaked, n)[0] >= BROKEN_SHARE
        return "broken" if broken else "leaks"
    return "holds" if exact_interval(0, n)[1] < BROKEN_SHARE else UNDERPOWERED


def _count_note(k: int, n: int, low: float, high: float, head: pd.Series, unit: str) -> str:
    """The note's first part: the union count with its interval and the strongest attack."""
    return (
        f"{k}/{n} {unit}leaked over the suite (95% CI {100 * low:.1f}-{100 * high:.1f}%); "
        f"strongest {attack_label(str(head['attack']), str(head['attack_params']))}"
    )


def _image_rules(rows, none_rows, union, base_share, protocol) -> tuple[str, str]:
    """The verdict of one defense configuration of an image run, and why (the rules above)."""
    k, n = int(union["suite_leaked"]), int(union["suite_n"])
    if not k:
        return _unleaked(rows, none_rows, union, base_share, protocol)
    result = verdict(k, n, protocol)
    if result == "leaks" and k / n >= BROKEN_SHARE:
        if protocol == 1 and k < MIN_BROKEN_IMAGES:
            return result, f"one image: too few for broken (>= {MIN_BROKEN_IMAGES})"
        if protocol != 1:
            return result, f"lower bound < {BROKEN_SHARE:.0%}: too few images to call it broken"
    return result, ""


def _text_rules(rows, none_rows, union, base_share, protocol) -> tuple[str, str]:
    """The verdict of one defense configuration of a text run, and why (the rules above less
    the checks of the suite's members and convergence, issue 67)."""
    k, n = int(union["suite_leaked"]), int(union["suite_n"])
    if k:
        return verdict(k, n, protocol), ""
    if not len(none_rows) or not none_rows["vouched"].any() or base_share < CONCLUSIVE_SHARE:
        return "inconclusive", (
            f"without a defense the attacks leak {100 * base_share:.0f}% (< {CONCLUSIVE_SHARE:.0%})"
        )
    if protocol == 0:
        return "untested", "the run lists its own attacks"
    if protocol != 1 and union["unproven"]:
        return UNCONVERGED, (
            f"{int(union['unproven'])} of {n} sentences without convergence evidence (protocol 2)"
        )
    return _holds(union, protocol)


def _no_voucher(none_rows: pd.DataFrame, protocol: int) -> str:
    """Why no attack vouches, for a reader who wants a verdict: the attack that came nearest
    on ``none``, by how much, and what to try."""
    best = none_rows.sort_values("leaked_rate", ascending=False, kind="mergesort").iloc[0]
    share = float(best["leaked_rate"])
    return (
        f"no attack breaks none here, so none can vouch for a holds: the nearest, "
        f"{attack_label(str(best['attack']), str(best['attack_params']))}, leaks "
        f"{100 * share:.0f}% of none's images where {vouch_share(protocol):.0%} is needed; try "
        "more iterations or starts, a prior (ig), or the learned attack "
        '([[attack]] name = "learned")'
    )


def _unleaked(rows, none_rows, union, base_share, protocol) -> tuple[str, str]:
    """The verdict of a defense configuration with no leaked image, and why (the order of
    checks in the rules above)."""
    if not len(none_rows):
        return "inconclusive", "no none baseline in the run"
    if not none_rows["vouched"].any():
        if protocol == 1:
            return "inconclusive", "no attack breaks none here, so none can vouch for a holds"
        return "inconclusive", _no_voucher(none_rows, protocol)
    if not base_share >= CONCLUSIVE_SHARE:
        return "inconclusive", (
            f"without a defense the attacks leak only {100 * base_share:.0f}% "
            f"(< {CONCLUSIVE_SHARE:.0%})"
        )
    if protocol == 0:
        return "untested", 'the run lists its own attacks (suite = "listed")'
    missing = missing_suite(rows, none_rows, int(union["batch_size"]))
    if missing:
        return "untested", f"suite attack not run: {', '.join(missing)}"
    if union["unproven"]:
        unproven, n = int(union["unproven"]), int(union["suite_n"])
        if protocol == 1:
            return UNCONVERGED, (
                f"{unproven} of {n} images: no attack that breaks none converged on them"
            )
        return UNCONVERGED, (
            f"{unproven} of {n} images without convergence evidence (protocol 2); try "
            '[[attack]] name = "learned"'
        )
    return _holds(union, protocol)


def _holds(union: pd.Series, protocol: int) -> tuple[str, str]:
    """A defense configuration that passed every check before a ``holds``: ``holds`` unless too
    few images (`UNDERPOWERED`) or, from protocol 2 on, too few model seeds (`ONE_SEED`; a
    union built without trials does not know its seeds and is not held to it)."""
    result = verdict(0, int(union["suite_n"]))
    if result == UNDERPOWERED:
        return result, f"upper bound >= {BROKEN_SHARE:.0%}: too few images to claim it"
    seeds = union.get("seeds")
    if protocol != 1 and pd.notna(seeds) and seeds < MIN_HOLDS_SEEDS:
        return ONE_SEED, (
            f"the images of one model seed: a holds needs {MIN_HOLDS_SEEDS} or more "
            "(seeds = [0, 1])"
        )
    return result, ""


def judge(
    board: pd.DataFrame,
    union: pd.DataFrame,
    protocol: int = PROTOCOL,
    setting: list[str] = SETTING,
    rules: Callable[..., tuple[str, str]] = _image_rules,
    unit: str = "",
) -> tuple[list[str], list[str]]:
    """The verdict and its one-line note of every row of ``board`` (which has ``strongest``
    and ``vouched``), from its defense's row of ``union`` (`suite_union`): per ``setting``,
    ``none`` is the baseline and every other defense is judged by ``rules`` (an image run's or
    a text run's); ``unit`` names the examples counted in the note."""
    verdicts, notes = [""] * len(board), [""] * len(board)
    position = {index: i for i, index in enumerate(board.index)}
    keys_of = [*setting, "defense", "defense_params"]
    per_defense = union.set_index(keys_of)
    for _, group in board.groupby(setting, sort=False):
        none_rows = group[group["defense"] == "none"]
        base = per_defense.reindex(pd.MultiIndex.from_frame(none_rows[keys_of]))
        base_share = float((base["suite_leaked"] / base["suite_n"]).max()) if len(base) else 0.0
        for keys, rows in group.groupby(["defense", "defense_params"], sort=False):
            head = rows[rows["strongest"].astype(bool)]
            head = head.iloc[0] if len(head) else rows.iloc[0]
            this = per_defense.loc[tuple(head[keys_of])]
            k, n = int(this["suite_leaked"]), int(this["suite_n"])
            low, high = float(this["suite_low"]), float(this["suite_high"])
            note = _count_note(k, n, low, high, head, unit)
            if keys[0] == "none":
                result, why = "baseline", ""
            else:
                result, why = rules(rows, none_rows, this, base_share, protocol)
            note = f"{note}; {why}" if why else note
            for index in rows.index:
                verdicts[position[index]] = result
                notes[position[index]] = note
    return verdicts, notes


def _union_from_board(board: pd.DataFrame) -> pd.DataFrame:
    """`suite_union`'s columns for a board without its trials (written by hand, or old): the
    strongest attack's count stands for the union, and every image counts as attacked."""
    heads = board[board["strongest"].astype(bool)]
    rows = []
    for _, head in heads.iterrows():
        n = int(head["n"])
        share = float(head.get("leaked_rate", head["success_rate"]))
        k = int(round(share * n)) if share == share else 0
        low, high = exact_interval(k, n)
        rows.append({**{c: head[c] for c in DEFENSE_KEYS}, "suite_leaked": k, "suite_n": n,
                     "suite_low": low, "suite_high": high, "unproven": 0,
                     "batch_size": 1, "seeds": np.nan})  # fmt: skip
    return pd.DataFrame(rows, columns=UNION_COLUMNS)


def tied_ranks(keys: pd.DataFrame, nan_ties: bool = True) -> pd.Series:
    """1, 2, ... in the order of ``keys`` (the sort keys of ranked rows), a row equal to the one
    before it on every key sharing its rank (ties are shown as ties); two unknown (NaN) values
    are equal unless ``nan_ties`` is false (a text run's ranks, issue 67)."""
    ranks, last, current = [], None, 0
    for position, values in enumerate(keys.itertuples(index=False, name=None), start=1):
        same = last is not None and all(
            (a == b) or (nan_ties and a != a and b != b) for a, b in zip(values, last, strict=True)
        )
        current = current if same else position
        ranks.append(float(current))
        last = values
    return pd.Series(ranks, index=keys.index)


def overlap_ranks(ranked: pd.DataFrame) -> pd.Series:
    """Protocol 2's ranks of rows already in rank order: a row shares the rank of the row
    before it when the two cannot be told apart, their leaked shares' 95% intervals
    (``worst_low`` - ``worst_high``) overlapping and their accuracies' (``test_accuracy`` +-
    ``test_accuracy_ci95``) overlapping too (or unknown); else it takes its position. A
    difference inside the noise is shown as a tie, never as an order."""

    def spans(row: Any) -> tuple[tuple[float, float], tuple[float, float] | None]:
        leaked = (float(row["worst_low"]), float(row["worst_high"]))
        accuracy, half = float(row["test_accuracy"]), float(row.get("test_accuracy_ci95", 0.0))
        if accuracy != accuracy:
            return leaked, None
        half = 0.0 if half != half else half
        return leaked, (accuracy - half, accuracy + half)

    def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
        return not (a[1] < b[0] or b[1] < a[0])

    ranks: list[float] = []
    current = 0
    last: tuple[float, float] | None = None
    last_accuracy: tuple[float, float] | None = None
    for position, (_, row) in enumerate(ranked.iterrows(), start=1):
        leaked, accuracy = spans(row)
        tie = last is not None and overlap(leaked, last)
        if tie and accuracy is not None and last_accuracy is not None:
            tie = overlap(accuracy, last_accuracy)
        current = current if tie else position
        ranks.append(float(current))
        last, last_accuracy = leaked, accuracy
    return pd.Series(ranks, index=ranked.index)


def _pareto(group: pd.DataFrame) -> dict[Any, bool]:
    """Per ranked-verdict head of one (dataset, model): whether no other beats it on privacy
    (leaked share, then success rate) and accuracy together; false where accuracy is unknown."""
    leaked = group["worst_leaked"].to_numpy()
    success = group["worst_success"].to_numpy()
    accuracy = group["test_accuracy"].astype(float).to_numpy()
    result = {}
    for position, index in enumerate(group.index):
        if not (np.isfinite(accuracy[position]) and np.isfinite(leaked[position])):
            result[index] = False
            continue
        as_private = (leaked < leaked[position]) | (
            (leaked == leaked[position]) & (success <= success[position])
        )
        more_private = (leaked < leaked[position]) | (
            (leaked == leaked[position]) & (success < success[position])
        )
        beaten = as_private & (accuracy >= accuracy[position])
        beaten &= more_private | (accuracy > accuracy[position])
        result[index] = not bool(beaten.any())
    return result


def rank_defenses(
    board: pd.DataFrame,
    max_accuracy_drop: float,
    protocol: int = PROTOCOL,
    union: pd.DataFrame | None = None,
) -> pd.DataFrame:
    """The leaderboard's ranking rule, as ``rank``, ``pareto``, ``verdict`` and
    ``verdict_note`` columns aligned with ``board``.

    Each defense configuration of a (dataset, model) is judged by its leaked share over the
    suite (`worst_case`), then by its attacks' highest ``success_rate``; never by a mean PSNR.
    ``verdict`` follows the rules above (`judge`, with ``union`` from `suite_union`, or from the
    board's strongest attacks when not given). Of the ranked verdicts (`RANKED_VERDICTS`) of a
    run that follows the protocol, those that cost at most ``max_accuracy_drop`` test accuracy
    are ranked 1, 2, ... fewest images leaked first, then fewest recovered, then the higher
    ``test_accuracy``; rows equal on all three share a rank. A defense whose cost is unknown is
    ranked only when no defense of that (dataset, model) has a known cost. ``pareto`` is true
    for the ranked-verdict defenses that no other such defense beats on both privacy and
    accuracy; false where the accuracy is unknown.
    """
    result = pd.DataFrame(
        {"rank": np.nan, "pareto": False, "verdict": "", "verdict_note": ""}, index=board.index
    )
    if board.empty:
        return result
    board = board.copy()
    if "vouched" not in board or board["vouched"].isna().any():
        board["vouched"] = vouched(board, vouch_share(protocol))
    union = _union_from_board(board) if union is None else union
    worst = worst_case(board)
    result["verdict"], result["verdict_note"] = judge(board, union, protocol)
    heads = board[board["strongest"].astype(bool)].join(worst)
    marked = monotone_notes(heads.assign(verdict=result.loc[heads.index, "verdict"]))
    for index, note in marked.items():
        same = same_defense(board, index)
        result.loc[same, "verdict_note"] = result.loc[same, "verdict_note"] + "; " + note
    heads = heads[result.loc[heads.index, "verdict"].isin(RANKED_VERDICTS)]
    for _, group in heads.groupby(["dataset", "model"], sort=False):
        drop = group["accuracy_drop"].astype(float)
        eligible = group[drop <= max_accuracy_drop] if drop.notna().any() else group
        ranked = eligible.sort_values(
            ["worst_leaked", "worst_success", "test_accuracy"],
            ascending=[True, True, False],
            kind="mergesort",
            na_position="last",
        )
        keys = ranked[["worst_leaked", "worst_success", "test_accuracy"]].astype(float)
        if protocol == 0:
            ranks = pd.Series(dtype=float)
        elif protocol == 1:
            ranks = tied_ranks(keys)
        else:
            ranks = overlap_ranks(ranked)
        for index, flag in _pareto(group).items():
            same = same_defense(board, index)
            if index in ranks.index:
                result.loc[same, "rank"] = ranks[index]
            result.loc[same, "pareto"] = flag
    return result


def same_defense(board: pd.DataFrame, index: Any, setting: list[str] = SETTING) -> pd.Series:
    """Per row of ``board``: whether it is of the defense configuration of the row at
    ``index`` (in the same ``setting``)."""
    keys = [*setting, "defense", "defense_params"]
    return (board[keys] == board.loc[index, keys]).all(axis=1)


def rank_text_defenses(
    board: pd.DataFrame, max_accuracy_drop: float, protocol: int, union: pd.DataFrame
) -> pd.DataFrame:
    """A text run's ``verdict``, ``verdict_note`` and ``rank`` columns aligned with ``board``
    (the rules above; ``union`` from `suite_union`): per (dataset, model, batch size) the heads
    of the ranked verdicts are ranked 1, 2, ... fewest sentences leaked first, then the lower
    ``perplexity``, equal rows sharing a rank; ``max_accuracy_drop`` is not read (a text run
    ranks every head, whatever its perplexity)."""
    result = pd.DataFrame(index=board.index)
    result["verdict"], result["verdict_note"] = judge(
        board, union, protocol, TEXT_SETTING, _text_rules, "sentences "
    )
    result["rank"] = np.nan
    heads = board[board["strongest"].astype(bool) & result["verdict"].isin(RANKED_VERDICTS)]
    for _, group in heads.groupby(TEXT_SETTING, sort=False):
        keys = pd.DataFrame(
            {"share": group["suite_leaked"] / group["suite_n"], "ppl": group["perplexity"]}
        ).astype(float)
        ordered = keys.sort_values(["share", "ppl"], kind="mergesort", na_position="last")
        for index, rank in tied_ranks(ordered, nan_ties=False).items():
            result.loc[same_defense(board, index, TEXT_SETTING), "rank"] = rank
    return result
