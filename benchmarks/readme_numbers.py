"""Writes the result numbers of README.md and the documentation pages (`docs/*.md`) from the
committed CSVs under `results/`, so that no page can quote a number its committed results do not
hold.

Each generated passage sits in one of those pages (`DOCUMENTS`) between two HTML comments, which
do not render:

    <!-- generated: NAME -->TEXT<!-- /generated -->

A *span* is a phrase inside a paragraph written by hand: its markers sit inside a line (never at
its start, where a comment would open an HTML block) and its text is exactly what its function
renders, line breaks included. A *block* is whole paragraphs, a list, a table or a fenced block:
its markers stand on lines of their own and its prose is refilled to WIDTH columns, so that lists
whose length depends on the results wrap cleanly. For every NAME one function below reads the
CSVs and fills in a template worded as the README words it. Where a word of the passage depends
on the results (a verdict, "every", an order, a comparison) the function derives it from the data
or checks it and raises `StaleClaim`, so that a changed result cannot leave a false sentence
behind. The literal text of the templates quotes no committed CSV: its numbers are the papers',
older runs' or the configs'. Timings measured by hand stay in the README, outside the passages.
CSVs are read by column name, so columns added later do not matter.

    PYTHONSAFEPATH=1 python benchmarks/readme_numbers.py          # rewrite the passages
    PYTHONSAFEPATH=1 python benchmarks/readme_numbers.py --check  # exit 1 naming each stale one

`tests/test_readme.py` runs the same comparison.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import re
import sys
import textwrap
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import pandas as pd
from scipy import optimize, stats

from leakbench.components.leakage import exact_interval
from leakbench.components.metrics import mean_ci95
from leakbench.outputs.naming import defense_label
from leakbench.outputs.summary import headline_table

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
RESULTS = ROOT / "results"
# The column that block prose is filled to (the README's hand-wrapped paragraphs end near it).
WIDTH = 94
OPEN = "<!-- generated: "
CLOSE = "<!-- /generated -->"
PASSAGE = re.compile(r"<!-- generated: ([a-z0-9-]+) -->(.*?)<!-- /generated -->", re.S)


class ReadmeError(Exception):
    """README.md and this script do not fit together."""


class StaleClaim(ReadmeError):
    """A word of a passage that depends on the results no longer holds for them."""


def claim(holds: bool, message: str) -> None:
    """Refuses to render a passage whose wording `message` describes no longer holds."""
    if not holds:
        raise StaleClaim(message)


# ---------------------------------------------------------------------------------------------
# Reading the committed results


class Results:
    """The committed CSVs and configs under results/, each read once. `frames` replaces CSVs by
    path (tests use it to change a result)."""

    def __init__(self, root: Path = RESULTS, frames: dict[str, pd.DataFrame] | None = None):
        self.root = root
        self._frames = dict(frames or {})

    def csv(self, path: str) -> pd.DataFrame:
        if path not in self._frames:
            self._frames[path] = pd.read_csv(self.root / path)
        return self._frames[path]

    def config(self, run: str) -> dict[str, Any]:
        return tomllib.loads((self.root / run / "config.toml").read_text(encoding="utf-8"))


def _has(params: dict[str, Any], options: dict[str, Any]) -> bool:
    return all(params.get(key) == value for key, value in options.items())


def select(
    frame: pd.DataFrame,
    attack: str | None = None,
    defense: str | None = None,
    params: dict[str, Any] | None = None,
    **options: Any,
) -> pd.DataFrame:
    """Rows of a leaderboard or trials table: `attack` and `defense` by name, `params` the
    defense's parameters (all of them), `options` some of the attack's (None: not set)."""
    keep = pd.Series(True, index=frame.index)
    if attack is not None:
        keep &= frame["attack"] == attack
    if defense is not None:
        keep &= frame["defense"] == defense
    if params is not None:
        keep &= frame["defense_params"].map(lambda text: json.loads(text) == params)
    if options:
        keep &= frame["attack_params"].map(lambda text: _has(json.loads(text), options))
    return frame[keep]


def one(frame: pd.DataFrame, **where: Any) -> pd.Series:
    """The one row `select` finds."""
    found = select(frame, **where)
    if len(found) != 1:
        raise ReadmeError(f"expected one row where {where}, found {len(found)}")
    return found.iloc[0]


def recovered(row: pd.Series) -> int:
    """Images of a leaderboard row recovered within the success threshold."""
    return round(row["success_rate"] * row["n"])


# ---------------------------------------------------------------------------------------------
# Numbers as the README prints them


NUMBER_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def pct(share: float, digits: int = 0) -> str:
    """A share as a percentage: `pct(0.46875)` is "47%"."""
    return f"{100 * share:.{digits}f}%"


def acc(share: float) -> str:
    """An accuracy to 0.1 points, "100%" when exact."""
    return "100%" if share == 1 else f"{100 * share:.1f}%"


def acc_ci(share: float, half_width: float) -> str:
    """An accuracy and the half-width of its 95% interval: "93.8% ± 4.8"."""
    return f"{acc(share)} ± {100 * half_width:.1f}"


def decibels(psnr: float) -> str:
    """A PSNR to 0.1 dB; the floor of the metric, an exact reconstruction, prints as 100."""
    return "100" if psnr >= 100 else f"{psnr:.1f}"


def points(drop: float, digits: int = 1) -> str:
    """An accuracy difference in points."""
    return f"{100 * drop:.{digits}f}"


def count(number: float) -> str:
    """A count with thousands separated: "1,824"."""
    return f"{round(number):,}"


def sci(value: float) -> str:
    """A power-of-ten style number as the README writes it: "1e-2", "3e-3"."""
    mantissa, exponent = f"{value:.0e}".split("e")
    text = f"{mantissa}e{int(exponent)}"
    if not math.isclose(float(text), value, rel_tol=1e-6):
        raise ReadmeError(f"{value} has no one-digit form")
    return text


def rate(value: float) -> str:
    """A learning rate: "1e-2" below 1, "4" from 1 on."""
    return f"{value:g}" if value >= 1 else sci(value)


def listing(items: Sequence[str]) -> str:
    """Items joined as prose: "a", "a and b", "a, b and c"."""
    items = list(items)
    if len(items) < 2:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def whole_range(values: Sequence[float], unit: str = "") -> str:
    """Rounded values as a range, "19-20", or one number when they round alike."""
    low, high = f"{min(values):.0f}", f"{max(values):.0f}"
    return (low if low == high else f"{low}-{high}") + unit


def upper_bound(value: float) -> str:
    """A one-digit power-of-ten bound at or above `value`: 2.6e-6 gives "3e-6"."""
    exponent = math.floor(math.log10(value))
    return f"{math.ceil(value / 10**exponent - 1e-9)}e{exponent}"


def table_row(cells: Sequence[str]) -> str:
    """A Markdown table row; an empty cell is "| |"."""
    return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"


def wrap(text: str) -> str:
    """Fills each paragraph and list item of `text` (Markdown) to WIDTH columns; table rows stay
    as they are."""
    out: list[str] = []
    words: list[str] = []
    prefix = ""

    def flush() -> None:
        if words:
            out.append(
                textwrap.fill(
                    " ".join(words),
                    WIDTH,
                    initial_indent=prefix,
                    subsequent_indent=" " * len(prefix),
                    break_long_words=False,
                    break_on_hyphens=False,
                )
            )
            words.clear()

    for line in textwrap.dedent(text).strip("\n").split("\n"):
        item = re.match(r" *- ", line)
        if not line.strip() or line.lstrip().startswith("|"):
            flush()
            out.append(line.rstrip())
        elif item:
            flush()
            prefix = item.group(0)
            words.append(line[len(prefix) :].strip())
        else:
            if not words:
                prefix = ""
            words.append(line.strip())
    flush()
    return "\n".join(out)


def prose(template: str, **values: Any) -> str:
    """A block's text: the template with its values filled in, refilled to WIDTH columns."""
    return wrap(template.format(**values))


# ---------------------------------------------------------------------------------------------
# The passages


class Passage(NamedTuple):
    """A generated passage: its name, the function rendering its text, and whether it is a
    block (markers on lines of their own) rather than a span."""

    name: str
    render: Callable[[Results], str]
    block: bool

    def text(self, results: Results) -> str:
        """The passage's text between its markers."""
        body = self.render(results)
        return f"\n{body}\n" if self.block else body


PASSAGES: dict[str, Passage] = {}


def _register(name: str, block: bool) -> Callable[[Callable[[Results], str]], Callable]:
    def register(render: Callable[[Results], str]) -> Callable[[Results], str]:
        if name in PASSAGES:
            raise ValueError(f"passage {name} defined twice")
        PASSAGES[name] = Passage(name, render, block)
        return render

    return register


def span(name: str) -> Callable[[Callable[[Results], str]], Callable]:
    """Registers the function rendering the span NAME."""
    return _register(name, block=False)


def block(name: str) -> Callable[[Callable[[Results], str]], Callable]:
    """Registers the function rendering the block NAME."""
    return _register(name, block=True)


# --- The default run (results/default) -------------------------------------------------------

DEFAULT = "default"
PLAIN = {"match": "all", "loss": "l2"}
# The adaptive variants the planner adds: pruning and top-k bring match=kept, clipping and
# DP-SGD loss=cosine (each for both configured attacks).
KEPT = {"match": "kept", "loss": "l2"}
COSINE = {"match": "all", "loss": "cosine"}


def _board(results: Results) -> pd.DataFrame:
    return results.csv(f"{DEFAULT}/leaderboard.csv")


def _trials(results: Results) -> pd.DataFrame:
    return results.csv(f"{DEFAULT}/trials.csv")


def _utility(results: Results) -> pd.DataFrame:
    return results.csv(f"{DEFAULT}/utility.csv")


def defense_name(defense: str, params: dict[str, Any], short: bool = False) -> str:
    """How the README's prose names a defense configuration of the default run; `short` leaves
    out what the item before it in a list, of the same defense, already said."""
    if defense == "dpsgd":
        noise = params["noise_multiplier"]
        return f"at {noise}" if short else f"DP-SGD at noise {noise}"
    if defense == "prune":
        share = f"{params['ratio']:.0%}"
        return share if short else f"pruning {share}"
    if defense == "gaussian":
        return f"Gaussian std {sci(params['sigma'])}"
    if defense == "laplace":
        return f"Laplace b = {sci(params['b'])}"
    if defense == "relative_noise":
        return f"`relative_noise` {params['sigma']}"
    if defense == "topk":
        return f"top-k at {params['fraction']:.0%}"
    if defense == "clip":
        return "clipping"
    if defense == "chain" and [step["name"] for step in params["steps"]] == ["clip", "gaussian"]:
        return "the clip-and-noise chain"
    if defense in ("int8", "fp16") and not params:
        return defense
    if defense == "none":
        return "`none`"
    raise StaleClaim(f"the README has no name for the defense {defense} {params}")


def configurations(board: pd.DataFrame) -> pd.DataFrame:
    """One row per defense configuration: its rank and verdict, its worst case (`worst`: the
    highest success rate of any attack), its share of images leaked over the suite (`leaked`,
    what the verdict reads: the per-image union, `k` of `n`), its strongest attack's mean PSNR
    (`psnr`) and its prose name (`name`)."""
    rows = []
    for (defense, params), cells in board.groupby(
        ["defense", "defense_params"], sort=False, dropna=False
    ):
        strongest = cells[cells["strongest"].astype(bool)]
        if len(strongest) != 1:
            raise ReadmeError(f"{defense} {params}: {len(strongest)} strongest attacks")
        rows.append(
            {
                "defense": defense,
                "params": json.loads(params),
                "rank": cells["rank"].iloc[0],
                "verdict": cells["verdict"].iloc[0],
                "worst": cells["success_rate"].max(),
                "leaked": cells["suite_leaked"].iloc[0] / cells["suite_n"].iloc[0],
                "k": int(cells["suite_leaked"].iloc[0]),
                "psnr": strongest["psnr_mean"].iloc[0],
                "n": int(cells["suite_n"].iloc[0]),
                "name": defense_name(defense, json.loads(params)),
            }
        )
    table = pd.DataFrame(rows)
    claim(table["name"].is_unique, "two defense configurations have the same name in prose")
    return table


def names(configs: pd.DataFrame) -> list[str]:
    """Prose names in order, short where the one before is of the same defense."""
    out, before = [], None
    for _, config in configs.iterrows():
        same = config["defense"] == before and config["defense"] in ("dpsgd", "prune")
        out.append(defense_name(config["defense"], config["params"], short=same))
        before = config["defense"]
    return out


def _models(utility: pd.DataFrame) -> int:
    """Models trained per defense configuration (the same for all)."""
    per = utility.groupby(["defense", "defense_params"]).size()
    claim(per.nunique() == 1, "the defense configurations trained different numbers of models")
    return int(per.iloc[0])


def _recipe(utility: pd.DataFrame, recipe: str) -> tuple[int, str]:
    """The epochs and the searched rates ("1e-2 and 3e-2") of one training recipe."""
    rows = utility[utility["recipe"] == recipe]
    claim(rows["epochs"].nunique() == 1, f"the {recipe} recipe trained for different epochs")
    claim(rows["learning_rates"].nunique() == 1, f"the {recipe} recipe searched different rates")
    rates = json.loads(rows["learning_rates"].iloc[0])
    return int(rows["epochs"].iloc[0]), listing([rate(value) for value in rates])


@span("default-setup")
def default_setup(results: Results) -> str:
    board, utility = _board(results), _utility(results)
    attacks = {
        (
            row["attack"],
            json.loads(row["attack_params"]).get("match"),
            json.loads(row["attack_params"]).get("loss"),
        )
        for _, row in board.iterrows()
    }
    claim(
        # The suite's families and the adaptive variants the defenses declare.
        {
            ("dlg", "all", "l2"),
            ("idlg", "all", "l2"),
            ("ig", "all", None),
            ("idlg", "kept", "l2"),
            ("idlg", "all", "cosine"),
            ("idlg", "all", "l1"),
        }
        <= attacks,
        "the default run no longer attacks with the suite's families and adaptive variants",
    )
    claim(set(board["protocol"]) == {1}, "the default run no longer follows protocol 1")
    claim(board["suite_n"].nunique() == 1, "the default run's defenses met different images")
    claim(
        set(utility.loc[utility["recipe"] == "dp", "defense"]) == {"dpsgd"},
        "the DP recipe trained other defenses than DP-SGD",
    )
    epochs, rates = _recipe(utility, "default")
    dp_epochs, dp_rates = _recipe(utility, "dp")
    lines = [
        f"{int(board['suite_n'].iloc[0])} private digits (scikit-learn's 8x8 digits, test split) "
        "with the standard",
        "attack suite (protocol 1: `idlg`, `dlg` and `ig` untuned, and the adaptive attacks the "
        "defenses",
        'declare: `match = "kept"` against pruning and top-k, `loss = "cosine"` against '
        "clipping and",
        'DP-SGD, `loss = "l1"` against Laplace noise), each run to its own convergence test, '
        f"under {len(configurations(board))}",
        "defense configurations, using the DLG paper's LeNet at its seeded initialisation, and "
        "trains",
        f"the same LeNet under each configuration with {_models(utility)} seeds, each at the "
        "learning rate that",
        f"does best on a validation split ({epochs} epochs at rates {rates}; DP-SGD with its DP "
        "recipe,",
        f"{dp_epochs} epochs at rates {dp_rates}",
    ]
    return "\n".join(lines)


@span("default-size")
def default_size(results: Results) -> str:
    trials, utility = _trials(results), _utility(results)
    searched = utility["learning_rates"].map(lambda text: len(json.loads(text)))
    claim(searched.nunique() == 1, "the default run's searches tried different numbers of rates")
    in_flight = results.config(DEFAULT)["parallel_trials"]
    return (
        f"{count(len(trials))} attacks, {in_flight}\nin flight, and {len(utility)} trainings, "
        f"each a search over {searched.iloc[0]} rates, so {searched.sum()} models"
    )


@span("default-attack-seconds")
def default_attack_seconds(results: Results) -> str:
    seconds = round(_trials(results)["seconds"].sum())
    return f"{seconds // 60} min {seconds % 60} s" if seconds >= 60 else f"{seconds} s"


@block("default-leaderboard")
def default_leaderboard(results: Results) -> str:
    return "```\n" + headline_table(_board(results)) + "\n```"


@span("default-models")
def default_models(results: Results) -> str:
    return f"{_models(_utility(results))} seeds"


@span("default-delta")
def default_delta(results: Results) -> str:
    deltas = _board(results)["delta"].dropna().unique()
    claim(len(deltas) == 1, "the default run's DP guarantees are at different deltas")
    return f"delta {sci(deltas[0])}"


@block("default-findings")
def default_findings(results: Results) -> str:
    board, trials, utility = _board(results), _trials(results), _utility(results)
    configs = configurations(board).set_index("name", drop=False)

    def cell(attack: str, defense: str, params: dict, options: dict | None = None) -> pd.Series:
        return one(board, attack=attack, defense=defense, params=params, **(options or {}))

    def config(defense: str, params: dict) -> pd.Series:
        return configs.loc[defense_name(defense, params)]

    def count(defense: str, params: dict) -> str:
        row = config(defense, params)
        return f"{row['k']} of {row['n']}"

    def cost(defense: str, params: dict) -> str:
        return points(select(board, defense=defense, params=params)["accuracy_drop"].iloc[0])

    n = int(board["suite_n"].iloc[0])
    idlg = cell("idlg", "none", {}, PLAIN)
    claim(recovered(idlg) == n, "iDLG no longer recovers every image exactly without a defense")
    dlg = cell("dlg", "none", {}, PLAIN)
    plain = select(trials, attack="dlg", defense="none", params={}, **PLAIN)
    missed = plain[plain["mse"] > 1e-3]
    claim(len(missed) == n - recovered(dlg), "DLG's trials and its leaderboard row differ")
    claim((missed["converged"] == 0).all(), "the judge finds a missed DLG image converged")
    ig = cell("ig", "none", {}, {"match": "all"})
    claim(ig["leaked_rate"] == 0 and not ig["vouched"], "ig now breaks the undefended digits")
    claim(select(board, attack="ig").shape[0] == len(select(board, attack="ig", defense="none")),
          "ig met a defense although it did not break none")  # fmt: skip
    g2, g1 = {"sigma": 0.01}, {"sigma": 0.1}
    claim((select(board, defense="gaussian", params=g2)["success_rate"] == 0).all(),
          "an attack recovers images exactly under Gaussian noise of std 1e-2")  # fmt: skip
    p5, p9, tk = {"ratio": 0.5}, {"ratio": 0.9}, {"fraction": 0.1}
    clip = {"norm": 0.1}
    dp10, dp05 = {"noise_multiplier": 1.0, "norm": 1.0}, {"noise_multiplier": 0.5, "norm": 1.0}
    dp = [config("dpsgd", p) for p in (dp10, dp05)]
    claim(all(row["verdict"] == "holds" for row in dp), "DP-SGD no longer holds")
    dp_models = utility[utility["defense"] == "dpsgd"]
    claim(set(dp_models["optimizer"]) == {"sgd"}, "the DP recipe no longer trains with SGD")
    escalated = trials[trials["escalations"] > 0].drop_duplicates(["seed", "batch_index", "attack",
                                                                    "attack_params", "defense",
                                                                    "defense_params"])  # fmt: skip
    holds = configs[configs["verdict"] == "holds"]
    ranked = holds[holds["rank"].notna()].sort_values("rank", kind="mergesort")
    costly = holds[holds["rank"].isna()]
    broken = configs[configs["verdict"] == "broken"]
    claim(
        set(configs["verdict"]) == {"holds", "broken", "baseline"},
        "the default run's verdicts are no longer holds, broken and the baseline only",
    )
    _, high = exact_interval(0, n)
    template = """
    What it shows: without a defense iDLG recovers all {n} images exactly and DLG {dlg} of
    {n} (the other {missed} stall at a gradient-matching loss of {losses}, which the judge finds
    well above the true image's: `converged = 0`). Inverting Gradients at its published
    settings recovers none of them ({ig_db} dB at best): on 8x8 digits it does not break
    `none`, so it vouches for no `holds` and the run spends it on no defense. Gaussian noise of
    std 1e-2 stops exact recovery ({g2_db} dB), but {g2} images are still identified or
    recognisable (`broken`) at a cost of {g2_cost} accuracy points; std 1e-1 leaks {g1} (`{g1_v}`)
    and costs {g1_cost} points. Pruning and top-k stop the paper's iDLG at 90% pruning ({p9_plain}
    recovered exactly) and under top-k ({tk_plain}) but not its adaptive variant (`match =
    "kept"`), which recovers {p5_kept} at 50% pruning, {p9_kept} at 90% and {tk_kept} when
    only 10% of the entries are kept. Clipping to norm 0.1 stops iDLG ({clip_plain} recovered)
    but not its scale-blind variant (`loss = "cosine"`: {clip_cos}). DP-SGD leaks {dp10} at
    noise multiplier 1.0 and {dp05} at 0.5, each under {dp_attacks} attacks, at a cost of
    {dp10_cost} and {dp05_cost} points with its DP recipe (epsilon {dp10_eps} and {dp05_eps}).
    {esc} trials that stopped well above the truth without leaking were rerun with twice the
    budget and two fresh starts; {esc_conv} of them then converged. Nothing leaked under {holds}
    defenses, each of the {n} images attacked by a converged attack that breaks `none`, so the
    leaked share is below {high} (95%) for each: `holds`; ranked by accuracy
    ({ranked}){costly}. {broken} configurations are `broken`, most with all {n} images leaked.
    The full tables, the figures and the report of this run are in `results/default/`.
    """
    return prose(
        template,
        n=n,
        dlg=recovered(dlg),
        missed=NUMBER_WORDS[len(missed)],
        losses=listing([f"{loss:.2f}" for loss in missed["loss"]]),
        ig_db=decibels(ig["psnr_mean"]),
        g2_db=decibels(select(board, defense="gaussian", params=g2)["psnr_mean"].max()),
        g2=count("gaussian", g2),
        g2_cost=cost("gaussian", g2),
        g1=count("gaussian", g1),
        g1_v=config("gaussian", g1)["verdict"],
        g1_cost=cost("gaussian", g1),
        p9_plain=f"{recovered(cell('idlg', 'prune', p9, PLAIN))} of {n}",
        tk_plain=f"{recovered(cell('idlg', 'topk', tk, PLAIN))} of {n}",
        p5_kept=f"{recovered(cell('idlg', 'prune', p5, KEPT))} of {n}",
        p9_kept=f"{recovered(cell('idlg', 'prune', p9, KEPT))} of {n}",
        tk_kept=f"{recovered(cell('idlg', 'topk', tk, KEPT))} of {n}",
        clip_plain=f"{recovered(cell('idlg', 'clip', clip, PLAIN))} of {n}",
        clip_cos=f"{recovered(cell('idlg', 'clip', clip, COSINE))} of {n}",
        dp10=count("dpsgd", dp10),
        dp05=count("dpsgd", dp05),
        dp_attacks=NUMBER_WORDS[len(select(board, defense="dpsgd", params=dp10))],
        dp10_cost=cost("dpsgd", dp10),
        dp05_cost=cost("dpsgd", dp05),
        dp10_eps=f"{select(board, defense='dpsgd', params=dp10)['epsilon'].iloc[0]:.1f}",
        dp05_eps=f"{select(board, defense='dpsgd', params=dp05)['epsilon'].iloc[0]:.1f}",
        esc=len(escalated),
        esc_conv=int((escalated["converged"] == 1).sum()),
        holds=NUMBER_WORDS[len(holds)] if len(holds) < len(NUMBER_WORDS) else len(holds),
        high=f"{100 * high:.1f}%",
        ranked=listing(names(ranked)),
        costly=(
            f"; {listing(names(costly))} cost more than 5 points and are not ranked"
            if len(costly)
            else ""
        ),
        broken=len(broken),
    )


# --- Secure aggregation (results/secure_aggregation/k2, k4, k8) -------------------------------

AGGREGATED = ("k2", "k4", "k8")


def _aggregated(results: Results, run: str) -> tuple[int, pd.Series]:
    """The number of clients of a secure-aggregation run and its one leaderboard row."""
    path = f"secure_aggregation/{run}"
    board = results.csv(f"{path}/leaderboard.csv")
    if len(board) != 1:
        raise ReadmeError(f"results/{path}: expected one cell, found {len(board)}")
    return results.config(path)["threat_model"]["clients"], board.iloc[0]


@span("secure-aggregation-setup")
def secure_aggregation_setup(results: Results) -> str:
    attacked = set(select(_trials(results), attack="idlg", defense="none")["image_index"])
    sizes, counts = set(), set()
    for run in AGGREGATED:
        path = f"secure_aggregation/{run}"
        trials = results.csv(f"{path}/trials.csv")
        claim(set(trials["image_index"]) <= attacked, f"{path} attacks other digits")
        sizes.add(results.config(path)["batch_size"])
        counts.add(trials["image_index"].nunique())
    claim(sizes == {1}, "a secure-aggregation client holds more than one digit")
    claim(len(counts) == 1, "the secure-aggregation runs attack different numbers of digits")
    return (
        f"{counts.pop()} of the default run's {len(attacked)} digits, `dlg` on the mean\n"
        "gradient of K clients holding one digit each"
    )


@span("secure-aggregation")
def secure_aggregation(results: Results) -> str:
    cells = [_aggregated(results, run) for run in AGGREGATED]
    claim(all(row["verdict"] == "broken" for _, row in cells), "averaging protects some K")
    claim(all(row["label_acc"] == 1 for _, row in cells), "DLG misses a label under aggregation")
    (k2, a), (k4, b), (k8, c) = cells
    return (
        "Averaging does not protect these clients: DLG\n"
        f"recovers {pct(a['success_rate'])} of the images at K = {k2} "
        f"({decibels(a['psnr_mean'])} dB), {pct(b['success_rate'])} at K = {k4} "
        f"({decibels(b['psnr_mean'])} dB) and {pct(c['success_rate'])} at K = {k8} "
        f"({decibels(c['psnr_mean'])}\n"
        "dB), with every label, since the mean of K one-image gradients is the gradient of a "
        "K-image\nbatch, which DLG attacks as such."
    )


# --- The papers' reproduction (results/paper) -------------------------------------------------

# The papers' own numbers (iDLG, Table 1): label accuracy of DLG and iDLG per dataset.
PAPER_LABELS = {"mnist": (0.899, 1.0), "cifar10": (0.833, 1.0), "lfw": (0.791, 1.0)}
TABLE1 = {
    "mnist": "MNIST",
    "cifar10": "CIFAR-10 (paper: CIFAR-100)",
    "lfw": "LFW, 5,749 identities",
}
# DLG, Section 5: the noise variance from which the paper reports that noise defends.
PAPER_NOISE_VARIANCE = 1e-2
TIMES = {10: "ten", 100: "a hundred", 1000: "a thousand"}


class Table1Run(NamedTuple):
    trials: pd.DataFrame  # single-image trials of dlg and idlg
    configured: int  # images the run's config asks for
    done: bool  # False: still in progress, read from its committed store


def _table1(results: Results, dataset: str) -> Table1Run:
    name = f"table1-{dataset}"
    path = results.root / "paper" / name / "trials.csv"
    if path.exists():
        trials = results.csv(f"paper/{name}/trials.csv")
        return Table1Run(trials, int(results.config(f"paper/{name}")["images"]), True)
    trials, configured = _paper_script()._stored_trials(results.root / "paper", name)
    if trials is None:
        raise ReadmeError(f"results/paper/{name} holds neither trials.csv nor a store")
    return Table1Run(trials, configured, False)


def _attack_rows(run: Table1Run, attack: str) -> pd.DataFrame:
    return run.trials[run.trials["attack"] == attack]


@block("paper-table1")
def paper_table1(results: Results) -> str:
    paper = _paper_script()
    lines = [
        "| dataset | images | DLG label acc. (95% CI) | paper | iDLG label acc. (95% CI) | paper "
        "| MSE <= 1e-3: DLG / iDLG |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for dataset, label in TABLE1.items():
        run = _table1(results, dataset)
        dlg, idlg = _attack_rows(run, "dlg"), _attack_rows(run, "idlg")
        images = f"{len(dlg)}" if len(dlg) == len(idlg) else f"{len(dlg)} / {len(idlg)}"
        if not run.done:
            images += f" of {run.configured} (in progress)"
        paper_dlg, paper_idlg = PAPER_LABELS[dataset]
        success = [f"{(rows['mse'] <= 1e-3).mean():.2f}" for rows in (dlg, idlg)]
        lines.append(
            table_row(
                [
                    label,
                    images,
                    paper.label_accuracy(run.trials, "dlg"),
                    f"{100 * paper_dlg:.1f}",
                    paper.label_accuracy(run.trials, "idlg"),
                    f"{100 * paper_idlg:.0f}",
                    " / ".join(success),
                ]
            )
        )
    return "\n".join(lines)


@block("paper-table1-findings")
def paper_table1_findings(results: Results) -> str:
    runs = {dataset: _table1(results, dataset) for dataset in TABLE1}
    claim(
        all((_attack_rows(run, "idlg")["label_acc"] == 1).all() for run in runs.values()),
        "iDLG misses a label",
    )
    mnist = _attack_rows(runs["mnist"], "dlg")
    right = int(mnist["label_acc"].sum())
    interval = stats.binomtest(right, len(mnist)).proportion_ci(method="exact")
    claim(interval.low > PAPER_LABELS["mnist"][0], "the paper's MNIST DLG labels are in our CI")
    wrong = {d: _attack_rows(run, "dlg") for d, run in runs.items() if run.done}
    wrong = {d: rows[rows["label_acc"] < 1] for d, rows in wrong.items()}
    claim(
        all((rows["mse"] > 1e-3).all() for rows in wrong.values()),
        "DLG got a label wrong on an image it reconstructed",
    )
    done = pd.concat([_attack_rows(run, "dlg") for run in runs.values() if run.done])
    claim((done["attempts"] == 1).all() and (done["status"] == "ok").all(), "a DLG search failed")
    lfw = runs["lfw"]
    gap = _label_gap(results, "table1-mnist")
    template = """
    iDLG's label rule is exact on every image, as the paper says. DLG's labels come out better
    than the paper's on MNIST: {mnist} against 89.9%, whose interval ({low}-{high}%) excludes
    the paper's number. Every image whose label DLG got wrong is one whose reconstruction failed
    too ({wrong}), and no search here ended non-finite. `benchmarks/dlg_label_gap.py` measured
    where the gap comes from (`results/paper/label-gap/`): the paper's own procedure, written in
    PyTorch from `iDLG.py` (it keeps its last iterate, scores with `log(softmax)` and has no
    guard against NaN), gets {paper} of the same 100 MNIST labels right on the same LeNet and
    {paper_fresh} on a new LeNet per image, as `iDLG.py` draws them: both intervals hold the
    paper's 89.9%. leakbench's `dlg` gets {fresh} on the new LeNets, so the network draw is not
    the cause. From the same starts, keeping the best iterate instead of the last raises the
    paper's procedure to {best} ({rescued} of its {missed} misses right, {lost} wrong that it
    had right; exact McNemar test p = {p}): {share} of the gap, though 100 images cannot tell
    it from chance. None of the paper procedure's searches ended non-finite: its misses are
    searches that wandered off the image (MSE {miss_mse}), not NaNs. On CIFAR-10 DLG chooses
    among 10 classes instead of CIFAR-100's 100, so its gap says little. {lfw}
    """
    return prose(
        template,
        mnist=f"{100 * right / len(mnist):.1f}%",
        low=f"{100 * interval.low:.1f}",
        high=f"{100 * interval.high:.1f}",
        wrong=", ".join(f"{len(rows)} on {TABLE1[d].split(' (')[0]}" for d, rows in wrong.items()),
        lfw=_lfw_sentence(results, lfw),
        **gap,
    )


def _label_gap(results: Results, run: str) -> dict[str, str]:
    """The numbers of `benchmarks/dlg_label_gap.py` that the Table 1 findings quote, each claim
    they support checked."""
    summary = results.csv("paper/label-gap/summary.csv")
    summary = summary[summary["dataset"] == run].set_index(["implementation", "network"])
    images = results.csv(f"paper/label-gap/{run}.csv")
    paper_share = PAPER_LABELS[run.removeprefix("table1-")][0]

    def way(implementation: str, network: str, holds_paper: bool | None = None) -> str:
        row = summary.loc[(implementation, network)]
        inside = row["ci_low"] <= paper_share <= row["ci_high"]
        if holds_paper is not None:
            claim(inside == holds_paper, f"{implementation}, {network}: paper's share moved")
        return (
            f"{pct(row['label_accuracy'])} ({100 * row['ci_low']:.1f}-{100 * row['ci_high']:.1f}%)"
        )

    one = summary.loc[("leakbench", "one network")]
    fresh = summary.loc[("leakbench", "new network per image")]
    claim(fresh["label_accuracy"] >= one["label_accuracy"], "new LeNets cost leakbench labels")
    paper_rows = images[images["implementation"] == "paper code"]
    claim(not paper_rows["nonfinite"].any(), "a paper-code search ended non-finite")
    effect = _paper_script().best_iterate_effect(images)
    claim(effect is not None, f"label-gap/{run}.csv lacks the best-iterate way")
    claim(effect.rescued > effect.lost and effect.pvalue >= 0.05, "best iterate: wording stale")
    best_share = summary.loc[("paper code, best iterate", "one network"), "label_accuracy"]
    share = "all" if best_share >= one["label_accuracy"] else "most"
    last_share = summary.loc[("paper code", "one network"), "label_accuracy"]
    claim(share == "all" or best_share > last_share, "keeping the best iterate: no gain")
    misses = paper_rows[~paper_rows["label_right"].astype(bool)]["mse"]
    claim(misses.min() > 0.1, "a paper-code miss is close to its image")
    return {
        "paper": way("paper code", "one network", True),
        "paper_fresh": way("paper code", "new network per image", True),
        "fresh": way("leakbench", "new network per image"),
        "best": pct(best_share),
        "share": share,
        "rescued": str(effect.rescued),
        "missed": str(effect.missed),
        "lost": str(effect.lost),
        "p": f"{effect.pvalue:.2f}",
        "miss_mse": f"{misses.min():.2f}-{misses.max():.2f}",
    }


def _lfw_sentence(results: Results, lfw: Table1Run) -> str:
    """What the README says of the LFW row: how far it got, DLG's labels against the paper's."""
    dlg, idlg = _attack_rows(lfw, "dlg"), _attack_rows(lfw, "idlg")
    right = int(dlg["label_acc"].sum())
    labels = (
        f"DLG's labels {right} of {len(dlg)} right, iDLG's {int(idlg['label_acc'].sum())} of "
        f"{len(idlg)}"
    )
    if not lfw.done:
        return (
            f"LFW with its 5,749 identities is in progress: {len(dlg)} of {lfw.configured} photos "
            f"attacked so far, {labels}."
        )
    interval = stats.binomtest(right, len(dlg)).proportion_ci(method="exact")
    paper = PAPER_LABELS["lfw"][0]
    low, high = interval.low, interval.high
    if low <= paper <= high:
        verdict = "the paper's 79.1% lies in that interval"
    else:
        side = "above" if low > paper else "below"
        verdict = f"the interval lies {side} the paper's 79.1%"
    gap = right / len(dlg) - paper
    distance = (
        "within 10 points of"
        if abs(gap) <= 0.10
        else f"more than 10 points {'above' if gap > 0 else 'below'}"
    )
    sentence = (
        f"On LFW with its 5,749 identities ({len(dlg)} test photos) {labels}: DLG "
        f"{100 * right / len(dlg):.1f}% ({100 * low:.1f}-{100 * high:.1f}%), {distance} the "
        f"paper's; {verdict}."
    )
    if abs(gap) > 0.10:
        sentence += _lfw_paper_code(results)
    return sentence


def _lfw_paper_code(results: Results) -> str:
    """What the paper's procedure made of the first LFW photos (`benchmarks/dlg_label_gap.py`
    with ``--images``), or that it was not run."""
    summary = results.csv("paper/label-gap/summary.csv")
    rows = summary[
        (summary["dataset"] == "table1-lfw") & (summary["implementation"] == "paper code")
    ]
    if rows.empty:
        return (
            " The paper's procedure was not run on LFW, so the MNIST measurement above is the "
            "explanation we have for this row."
        )
    row = rows.iloc[0]
    ours = summary[
        (summary["dataset"] == "table1-lfw") & (summary["implementation"] == "leakbench")
    ]
    ours = ours[ours["network"] == "one network"].iloc[0]
    claim(ours["images"] == row["images"], "the LFW label-gap ways cover different photos")
    claim(ours["labels_right"] > row["labels_right"], "leakbench no longer beats the paper on LFW")
    paper = PAPER_LABELS["lfw"][0]
    inside = row["ci_low"] <= paper <= row["ci_high"]
    return (
        f" The paper's procedure (PyTorch, the same LeNet) on the first {row['images']} of "
        f"these photos got {row['labels_right']} of {row['images']} labels right "
        f"({100 * row['ci_low']:.1f}-{100 * row['ci_high']:.1f}%, which "
        f"{'holds' if inside else 'excludes'} the paper's 79.1%) where leakbench got "
        f"{ours['labels_right']}, at {row['seconds'] / row['images'] / 60:.1f} minutes an attack "
        "here: so few photos give a wide interval, but they point the way the MNIST "
        "measurement does."
    )


def _noise_levels(board: pd.DataFrame, attack: str) -> pd.DataFrame:
    """Per noise cell of `attack`: the variance (sigma^2, 2 b^2), family, success and median."""
    rows = []
    for _, row in board[board["attack"] == attack].iterrows():
        params = json.loads(row["defense_params"])
        if row["defense"] == "gaussian":
            variance = params["sigma"] ** 2
        elif row["defense"] == "laplace":
            variance = 2 * params["b"] ** 2
        else:
            continue
        rows.append(
            {
                "family": row["defense"],
                "variance": float(f"{variance:.1e}"),
                "success": row["success_rate"],
                "median": row["psnr_median"],
            }
        )
    return pd.DataFrame(rows).sort_values(["family", "variance"], kind="mergesort")


def _stops_at(levels: pd.DataFrame, level: str, success: str) -> tuple[int, pd.Series | None]:
    """Where a sweep stops an attack: the position of the weakest level from which on nothing is
    recovered, and the level before it (None when it is the first)."""
    zero = list(levels[success] == 0)
    claim(zero[-1], f"the attack is not stopped at the strongest {level}")
    first = len(zero)
    while first > 0 and zero[first - 1]:
        first -= 1
    return first, (levels.iloc[first - 1] if first > 0 else None)


def _noise_stop(results: Results, attack: str) -> tuple[float, pd.DataFrame, float | None]:
    """The variance at which noise stops `attack` (the same for both families), the cells at that
    variance, and the variance before it (None: no noise)."""
    board = results.csv("paper/section5-noise/leaderboard.csv")
    levels = _noise_levels(board, attack)
    stops = {}
    for family, sweep in levels.groupby("family"):
        first, before = _stops_at(sweep.reset_index(drop=True), "noise", "success")
        stops[family] = (
            sweep.iloc[first]["variance"],
            None if before is None else before["variance"],
        )
    claim(len(set(stops.values())) == 1, f"Gaussian and Laplacian noise stop {attack} apart")
    variance, before = next(iter(stops.values()))
    return variance, levels[levels["variance"] == variance], before


def _prune(results: Results) -> pd.DataFrame:
    board = results.csv("paper/section5-prune/leaderboard.csv").copy()
    board["ratio"] = board["defense_params"].map(lambda text: json.loads(text)["ratio"])
    return board.sort_values("ratio", kind="mergesort")


def _prune_stop(results: Results, attack: str) -> tuple[pd.Series, pd.Series | None]:
    cells = select(_prune(results), attack=attack, match="all").reset_index(drop=True)
    first, before = _stops_at(cells, "pruning", "success_rate")
    return cells.iloc[first], before


@block("paper-section5")
def paper_section5(results: Results) -> str:
    noise = results.csv("paper/section5-noise/leaderboard.csv")
    dlg_var, dlg_cells, dlg_before = _noise_stop(results, "dlg")
    ig_var, ig_cells, ig_before = _noise_stop(results, "ig")
    claim(dlg_before is None, "noise no longer stops `dlg` at its weakest level")
    claim(ig_before is not None, "noise stops `ig` at its weakest level")
    ig_levels = _noise_levels(noise, "ig")
    ig_prior = ig_levels[ig_levels["variance"] == ig_before].set_index("family")["success"]
    dlg_none = one(noise, attack="dlg", defense="none")

    dlg_prune, dlg_prune_before = _prune_stop(results, "dlg")
    ig_prune, ig_prune_before = _prune_stop(results, "ig")
    claim(
        dlg_prune_before is not None and ig_prune_before is not None,
        "pruning stops an attack at its weakest level",
    )
    prune = _prune(results)
    strongest = prune["ratio"].max()
    kept = select(prune[prune["ratio"] == strongest], match="kept")
    claim((kept["success_rate"] > 0).all(), "the adaptive attacks are stopped by pruning")
    kept_dlg = one(kept, attack="dlg")
    kept_ig = one(kept, attack="ig")

    noise_dlg = (
        f"variance {sci(dlg_var)} ({pct(dlg_cells['success'].max())}, "
        f"{whole_range(list(dlg_cells['median']))} dB; none: {pct(dlg_none['success_rate'])})"
    )
    before = (
        pct(ig_prior.iloc[0])
        if ig_prior.nunique() == 1
        else f"{pct(ig_prior['gaussian'])} / {pct(ig_prior['laplace'])} (Gaussian / Laplacian)"
    )
    noise_ig = f"{sci(ig_var)} ({pct(ig_cells['success'].max())}; {before} at {sci(ig_before)})"
    prune_dlg = (
        f"{dlg_prune['ratio']:.0%} ({pct(dlg_prune['success_rate'])}; "
        f"{pct(dlg_prune_before['success_rate'])} at {dlg_prune_before['ratio']:.0%})"
    )
    prune_ig = (
        f"{ig_prune['ratio']:.0%} ({pct(ig_prune_before['success_rate'])} at "
        f"{ig_prune_before['ratio']:.0%})"
    )
    prune_kept = (
        f"not stopped at {strongest:.0%}: `dlg` {pct(kept_dlg['success_rate'])}, "
        f"`ig` {pct(kept_ig['success_rate'])}"
    )
    return "\n".join(
        [
            '| defense | `dlg` stops at | `ig` stops at | adaptive (`match = "kept"`) |',
            "| --- | --- | --- | --- |",
            table_row(["Gaussian / Laplacian noise", noise_dlg, noise_ig, "n/a"]),
            table_row(["pruning", prune_dlg, prune_ig, prune_kept]),
        ]
    )


@block("paper-section5-findings")
def paper_section5_findings(results: Results) -> str:
    dlg_var, dlg_cells, _ = _noise_stop(results, "dlg")
    ig_var, _, _ = _noise_stop(results, "ig")
    ratio = round(PAPER_NOISE_VARIANCE / dlg_var)
    ig_ratio = round(PAPER_NOISE_VARIANCE / ig_var)
    claim(ratio in TIMES and ig_ratio in TIMES, "noise stops the attacks at an odd factor")
    claim((dlg_cells["success"] == 0).all(), "`dlg` recovers images at its stopping variance")
    _, before = _prune_stop(results, "dlg")
    claim(before["ratio"] == 0.2, "pruning no longer stops the paper's attack just above 20%")
    prune = _prune(results)
    strongest = prune["ratio"].max()
    kept = select(prune[prune["ratio"] == strongest], match="kept")
    claim((kept["success_rate"] > 0.5).all(), "the adaptive attacks no longer recover most images")
    template = """
    Noise stops `dlg` at {times} times less variance than the paper reports (`ig` at {ig_times}
    times less), because the noise is absolute and a LeNet gradient at initialisation on MNIST is
    small (at variance {variance} `dlg`'s reconstructions are still recognisable, {db} dB, but
    not within MSE 1e-3). Pruning stops the paper's attack just above {before}, as the paper
    says, but an attacker that matches only the coordinates the defense kept recovers most
    images at {strongest}: pruning alone is not a defense.
    """
    return prose(
        template,
        times=TIMES[ratio],
        ig_times=TIMES[ig_ratio],
        variance=sci(dlg_var),
        db=whole_range(list(dlg_cells["median"])),
        before=f"{before['ratio']:.0%}",
        strongest=f"{strongest:.0%}",
    )


def _paper_script():
    """benchmarks/paper.py as a module: its statistics and labels of the papers' tables."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("paper", ROOT / "benchmarks" / "paper.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ig_table1(results: Results) -> list[dict[str, Any]]:
    """Per attack of results/paper/ig-table1-lenet: label, PSNR mean, std, 95% interval,
    recovered images and image count."""
    paper = _paper_script()
    trials = results.csv("paper/ig-table1-lenet/trials.csv").copy()
    trials["label"] = trials.apply(paper._ig_row_label, axis=1)
    rows = []
    for label, group in trials.groupby("label", sort=False):
        mean, std, low, high = paper._mean_interval(group["psnr"].to_numpy(dtype=float))
        rows.append(
            {
                "label": label,
                "attack": group["attack"].iloc[0],
                "tv": json.loads(group["attack_params"].iloc[0]).get("tv"),
                "mean": mean,
                "std": std,
                "low": low,
                "high": high,
                "recovered": int((group["mse"] <= 1e-3).sum()),
                "n": len(group),
            }
        )
    return rows


IG_PAPER = (18.00, 3.33)  # IG Table 1, proposed attack, untrained LeNet (Zhu); see paper.py


@block("ig-paper-table1")
def ig_paper_table1(results: Results) -> str:
    lines = [
        "| attack | images | PSNR mean +- std | 95% CI of the mean | recovered | paper |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in _ig_table1(results):
        paper = f"{IG_PAPER[0]:.2f} +- {IG_PAPER[1]:.2f}" if row["attack"] == "ig" else "not found"
        lines.append(
            table_row(
                [
                    row["label"],
                    str(row["n"]),
                    f"{row['mean']:.2f} +- {row['std']:.2f} dB",
                    f"{row['low']:.2f} to {row['high']:.2f}",
                    f"{row['recovered']} of {row['n']}",
                    paper,
                ]
            )
        )
    return "\n".join(lines)


@block("ig-paper-findings")
def ig_paper_findings(results: Results) -> str:
    rows = _ig_table1(results)
    weak, strong = sorted((r for r in rows if r["attack"] == "ig"), key=lambda r: r["tv"])
    (baseline,) = [r for r in rows if r["attack"] == "dlg"]
    claim(strong["low"] <= IG_PAPER[0] <= strong["high"], "TV 1e-2 no longer matches the paper")
    claim(weak["low"] > IG_PAPER[0], "TV 1e-4 is no longer above the paper's number")
    claim(
        baseline["recovered"] > weak["recovered"] + strong["recovered"],
        "the Euclidean baseline no longer recovers more images than the proposed attack",
    )
    trials = results.csv("paper/ig-table1-lenet/trials.csv")
    stops = set(trials[trials["attack"] == "ig"]["stop_reason"])
    claim(stops == {"schedule"}, "an `ig` trial stopped before its schedule's end")
    template = """
    With the total-variation weight 1e-2 ours matches the paper's {paper} dB (interval {low} to
    {high}); with the code's default 1e-4 `ig` is {gap} dB stronger, beyond its interval: the
    paper's cell was most likely run with 1e-2, which the note reads from the paper's appendix.
    On this untrained sigmoid LeNet the Euclidean L-BFGS baseline is the stronger attack here
    ({found} of {n} images recovered, {db} dB mean; the proposed attack {none} of {both}). Every
    `ig` trial ran its whole 4,800-step schedule.
    """
    return prose(
        template,
        paper=f"{IG_PAPER[0]:.2f}",
        low=f"{strong['low']:.2f}",
        high=f"{strong['high']:.2f}",
        gap=f"{weak['mean'] - IG_PAPER[0]:.1f}",
        found=baseline["recovered"],
        n=baseline["n"],
        db=f"{baseline['mean']:.1f}",
        none=weak["recovered"] + strong["recovered"],
        both=weak["n"] + strong["n"],
    )


@span("adaptive-pruning")
def adaptive_pruning(results: Results) -> str:
    prune = _prune(results)
    at30, at70 = prune[prune["ratio"] == 0.3], prune[prune["ratio"] == 0.7]
    plain = one(at30, attack="dlg", match="all")
    kept = one(at30, attack="dlg", match="kept")
    claim(plain["success_rate"] == 0, "pruning 30% no longer stops plain `dlg`")
    claim(kept["success_rate"] > 0, "pruning 30% stops the adaptive `dlg`")
    return (
        f"On {plain['n']} MNIST test images (`results/paper/section5-prune/`), pruning 30% of\n"
        f"every tensor stops plain `dlg` ({recovered(plain)} of {plain['n']} within MSE 1e-3, "
        f"median {plain['psnr_median']:.0f} dB) but not `dlg` with\n"
        f'`match = "kept"` ({pct(kept["success_rate"])}, {kept["psnr_median"]:.0f} dB); at 70% '
        "pruning the adaptive `dlg` and `ig` still recover "
        f"{pct(one(at70, attack='dlg', match='kept')['success_rate'])} and\n"
        f"{pct(one(at70, attack='ig', match='kept')['success_rate'])} of the images."
    )


# --- Convergence on CIFAR-10 (results/convergence/cifar10-defaults) ---------------------------

CONVERGENCE = "convergence/cifar10-defaults"
STOP_REASONS = ("stalled", "converged", "budget", "schedule", "diverged", "error")


@block("convergence")
def convergence(results: Results) -> str:
    board = results.csv(f"{CONVERGENCE}/leaderboard.csv")
    trials = results.csv(f"{CONVERGENCE}/trials.csv")
    lines = [
        "| attack | recovered (MSE <= 1e-3) | mean PSNR (95% CI) | labels | iterations used: "
        "median (max) | stopped | s / attack |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for attack in ("dlg", "idlg"):
        row = one(board, attack=attack)
        runs = trials[trials["attack"] == attack]
        reasons = runs["stop_reason"].value_counts()
        lines.append(
            table_row(
                [
                    f"`{attack}`",
                    f"{recovered(row)} of {row['n']} ({pct(row['success_rate'])})",
                    f"{decibels(row['psnr_mean'])} dB (+-{row['psnr_ci95']:.1f})",
                    pct(row["label_acc"]),
                    f"{count(runs['iterations_used'].median())} "
                    f"({count(runs['iterations_used'].max())})",
                    ", ".join(f"{reasons[r]} {r}" for r in STOP_REASONS if r in reasons),
                    f"{row['seconds_mean']:.1f}",
                ]
            )
        )
    return "\n".join(lines)


@span("convergence-old-budget")
def convergence_old_budget(results: Results) -> str:
    speed = results.csv("perf/attack_speed.csv")
    old = speed[
        (speed["dataset"] == "cifar10")
        & (speed["implementation"] == "leakbench")
        & (speed["budget"] == "default-300")
        & (speed["width"] == 1)
    ].iloc[0]
    found = "none" if old["successes"] == 0 else str(old["successes"])
    return f"recovered\n{found} of {old['attacks']} CIFAR-10 images"


@block("convergence-digits")
def convergence_digits(results: Results) -> str:
    trials = _trials(results)
    lbfgs = trials[trials["attack"].isin(["dlg", "idlg"])]
    caps = lbfgs["attack_params"].map(lambda text: json.loads(text)["iterations"])
    claim(caps.nunique() == 1, "the default run's L-BFGS attacks have different caps")
    first = lbfgs[lbfgs["escalations"] == 0]
    claim((first["iterations_used"] < caps[first.index]).all(),
          "an unescalated default trial reached its iteration cap")  # fmt: skip
    per_defense = first.groupby("defense")["iterations_used"].mean()
    judged = lbfgs.drop_duplicates(["seed", "batch_index", "attack", "attack_params", "defense",
                                    "defense_params"])  # fmt: skip
    template = """
    On the default digits run the same defaults end every trial that needed no rerun long
    before the cap (mean iterations used per defense between {low} and {high}). The judge
    (`leakbench.run.judge`) compares each reconstruction's matching loss with the true image's:
    {unconverged} of the run's {trials} `dlg` and `idlg` trials ended well above it, and those
    that leaked nothing were rerun with twice the budget and two fresh starts. The
    {cap}-iteration cap has not been measured on 64x64x3 images; the budget warning says when
    it is too small.
    """
    return prose(
        template,
        low=f"{round(per_defense.min(), -1):.0f}",
        high=f"{round(per_defense.max(), -1):.0f}",
        unconverged=int((judged["converged"] == 0).sum()),
        trials=count(len(judged)),
        cap=count(caps.iloc[0]),
    )


# --- Batch size (results/batch_size) ----------------------------------------------------------


@block("batch-size-labels")
def batch_size_labels(results: Results) -> str:
    labels = results.csv("batch_size/batch_size_labels.csv")
    cells = []
    for _, row in labels.iterrows():
        text = acc(row["label_acc"])
        if row["label_acc_ci95"] > 0:
            text += f" +- {100 * row['label_acc_ci95']:.1f}"
        cells.append(text)
    sizes = [str(size) for size in labels["batch_size"]]
    return "\n".join(
        [
            table_row(["batch size", *sizes]),
            table_row(["---"] * (len(sizes) + 1)),
            table_row(["label accuracy (multiset), mean +- 95% CI", *cells]),
        ]
    )


@span("batch-size-labels-largest")
def batch_size_labels_largest(results: Results) -> str:
    labels = results.csv("batch_size/batch_size_labels.csv")
    largest = labels.loc[labels["batch_size"].idxmax()]
    size, share = int(largest["batch_size"]), acc(largest["label_acc"])
    return f"{size} leakbench's count estimator recovers {share}"


@span("batch-size-images")
def batch_size_images(results: Results) -> str:
    curve = results.csv("batch_size/batch_size.csv").set_index("batch_size")
    claim((curve["success_rate"] == 0).all(), "`ig` recovers an image at some batch size")
    sizes = curve.index
    return (
        f"gives {curve['psnr_mean'].min():.1f} to {curve['psnr_mean'].max():.1f} dB\n"
        f"mean PSNR at batch sizes {sizes.min()} to {sizes.max()} "
        f"({curve.loc[1, 'psnr_mean']:.1f} dB at batch 1, {curve.loc[8, 'psnr_mean']:.1f} at 8, "
        f"{curve.loc[64, 'psnr_mean']:.1f} at 64; one batch per size, so\n"
        "single sizes are noisy) and no image recovered at any size, with label accuracy "
        f"{100 * curve['label_acc'].min():.1f}-{acc(curve['label_acc'].max())}"
    )


# --- The BatchNorm prior (results/bn_prior) ---------------------------------------------------


def _prior_weight(attack_params: str) -> float | None:
    priors = json.loads(attack_params).get("priors", [])
    weights = [prior["weight"] for prior in priors if prior["name"] == "bn_statistics"]
    return weights[0] if weights else None


@span("bn-prior-setup")
def bn_prior_setup(results: Results) -> str:
    measured = results.csv("bn_prior/measured/leaderboard.csv")
    trials = results.csv("bn_prior/measured/trials.csv")
    sweep = results.csv("bn_prior/weights/leaderboard.csv").copy()
    sweep["weight"] = sweep["attack_params"].map(_prior_weight)
    chosen = sweep.loc[sweep["psnr_mean"].idxmax(), "weight"]
    claim(
        {_prior_weight(text) for text in measured["attack_params"]} == {None, chosen},
        "the measured run does not use the weight the sweep chose",
    )
    tried = sweep[sweep["weight"].notna()].sort_values("weight")
    claim(len(tried) == 4, "the weight sweep no longer has four weights")
    without = sweep[sweep["weight"].isna()]["psnr_mean"].iloc[0]
    batches = trials.groupby(["attack_params", "seed", "batch_index"]).ngroups // len(measured)
    weights = [f"{weight:g}" for weight in tried["weight"]]
    db = [f"{psnr:.2f}" for psnr in tried["psnr_mean"]]
    seeds = trials["seed"].unique()
    sweep_seeds = results.csv("bn_prior/weights/trials.csv")["seed"].unique()
    claim(len(seeds) == 1 and len(sweep_seeds) == 1, "the prior's runs use several seeds")
    return (
        f"{NUMBER_WORDS[batches]} CIFAR-10 batches of {trials['batch_size'].iloc[0]} with the\n"
        f"`convnet` at its seed-{seeds[0]} initialisation, same images and starts, the prior's "
        f"weight {chosen:g} chosen\n"
        "beforehand on other images (`benchmarks/bn-prior-weights.toml`, seed "
        f"{sweep_seeds[0]}: weights {weights[0]}, {weights[1]},\n"
        f"{weights[2]} and {weights[3]} gave {db[0]}, {db[1]}, {db[2]} and {db[3]} dB against "
        f"{without:.2f} without"
    )


def _bn_prior_cells(results: Results) -> tuple[pd.Series, pd.Series]:
    board = results.csv("bn_prior/measured/leaderboard.csv")
    with_prior = board["attack_params"].map(_prior_weight).notna()
    return board[~with_prior].iloc[0], board[with_prior].iloc[0]


def _bn_prior_gain(results: Results) -> tuple[pd.Series, Any]:
    """Per image: PSNR with the prior minus without, and the paired t-test of the two."""
    trials = results.csv("bn_prior/measured/trials.csv").copy()
    trials["prior"] = trials["attack_params"].map(_prior_weight).notna()
    image = ["seed", "batch_index", "image_index"]
    plain = trials[~trials["prior"]].set_index(image)["psnr"]
    helped = trials[trials["prior"]].set_index(image)["psnr"]
    plain, helped = plain.align(helped)
    claim(not plain.isna().any() and not helped.isna().any(), "the two attacks saw other images")
    return helped - plain, stats.ttest_rel(helped, plain)


@block("bn-prior")
def bn_prior(results: Results) -> str:
    without, prior = _bn_prior_cells(results)
    gain, test = _bn_prior_gain(results)

    def cells(row: pd.Series) -> list[str]:
        return [
            f"{row['psnr_mean']:.2f} dB (+-{row['psnr_ci95']:.2f})",
            f"{row['ssim_mean']:.3f}",
            acc(row["label_acc"]),
        ]

    paired = (
        f"{(gain > 0).sum()} of {len(gain)} (paired mean {gain.mean():+.2f} dB, t-test p = "
        f"{test.pvalue:.2f})"
    )
    return "\n".join(
        [
            "| attack | mean PSNR (95% CI) | SSIM | labels | images better with the prior |",
            "| --- | --- | --- | --- | --- |",
            table_row(["`ig`", *cells(without), ""]),
            table_row(["`ig` + `bn_statistics`", *cells(prior), paired]),
        ]
    )


@span("bn-prior-findings")
def bn_prior_findings(results: Results) -> str:
    without, prior = _bn_prior_cells(results)
    gain, test = _bn_prior_gain(results)
    claim(test.pvalue >= 0.05, "the prior's effect is now significant: say how much it helps")
    claim(
        without["success_rate"] == 0 and prior["success_rate"] == 0,
        "an attack reconstructs an image of these batches",
    )
    around = {f"{row['psnr_mean']:.0f}" for row in (without, prior)}
    claim(len(around) == 1, "the two attacks' PSNRs are no longer about the same")
    return (
        f"changes nothing measurable ({gain.mean():+.2f} dB, p = {test.pvalue:.2f}), and neither "
        f"attack reconstructs these batches: about {around.pop()} dB"
    )


# --- Attack speed (results/perf/attack_speed*.csv) --------------------------------------------

SPEED = "perf/attack_speed.csv"
SPEED_DATA = {"cifar10": "CIFAR-10", "mnist": "MNIST"}
SPEED_ROWS = (
    ("pytorch-reference", "paper-6000", "PyTorch reference, paper (300 steps, <= 6,000 evals)"),
    ("leakbench", "paper-6000", 'leakbench `dlg`, `line_search = "none"`, 300 steps'),
    ("leakbench", "default-300", "leakbench `dlg` default (300 iterations)"),
)


def _speed(
    results: Results, dataset: str, implementation: str, budget: str, path: str = SPEED
) -> pd.DataFrame:
    table = results.csv(path)
    return table[
        (table["dataset"] == dataset)
        & (table["implementation"] == implementation)
        & (table["budget"] == budget)
    ].sort_values("width", kind="mergesort")


def _speed_at(
    results: Results, dataset: str, implementation: str, budget: str, width: int, path: str = SPEED
) -> pd.Series:
    rows = _speed(results, dataset, implementation, budget, path)
    rows = rows[rows["width"] == width]
    if len(rows) != 1:
        raise ReadmeError(f"{path}: no single {dataset} {implementation} {budget} at {width}")
    return rows.iloc[0]


def _ratio(value: float) -> str:
    return "1" if value == 1 else f"{value:.3f}"


@block("attack-speed")
def attack_speed(results: Results) -> str:
    lines = [
        "| data | implementation, budget | N | s / attack | evals / attack | evals / s | success "
        "(MSE <= 1e-3) | vs PyTorch |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for dataset, name in SPEED_DATA.items():
        for implementation, budget, label in SPEED_ROWS:
            rows = _speed(results, dataset, implementation, budget)
            data = f"{name} {rows['input_shape'].iloc[0]}"
            if budget == "paper-6000":
                for _, row in rows.iterrows():
                    lines.append(
                        table_row(
                            [
                                data,
                                label,
                                str(row["width"]),
                                f"{row['seconds_per_attack']:#.3g}",
                                count(row["evaluations_per_attack"]),
                                count(row["evaluations_per_second"]),
                                f"{row['successes']}/{row['attacks']}",
                                _ratio(row["torch_ratio"]),
                            ]
                        )
                    )
                continue
            if (rows["successes"] == 0).all():
                success = "0 of " + ", ".join(str(n) for n in rows["attacks"])
            else:
                success = ", ".join(
                    f"{k}/{n}" for k, n in zip(rows["successes"], rows["attacks"], strict=True)
                )
            lines.append(
                table_row(
                    [
                        data,
                        label,
                        " / ".join(str(width) for width in rows["width"]),
                        " / ".join(f"{s:.2f}" for s in rows["seconds_per_attack"]),
                        f"~{5 * round(rows['evaluations_per_attack'].mean() / 5)}",
                        " / ".join(count(e) for e in rows["evaluations_per_second"]),
                        success,
                        "",
                    ]
                )
            )
    return "\n".join(lines)


def _paper_budget(results: Results, dataset: str, width: int, path: str = SPEED) -> pd.Series:
    return _speed_at(results, dataset, "leakbench", "paper-6000", width, path)


def _reference(results: Results, dataset: str, path: str = SPEED) -> pd.Series:
    return _speed_at(results, dataset, "pytorch-reference", "paper-6000", 1, path)


@span("attack-speed-criterion-1")
def attack_speed_criterion_1(results: Results) -> str:
    single = {d: _paper_budget(results, d, 1) for d in SPEED_DATA}
    for dataset, row in single.items():
        claim(row["torch_ratio"] <= 1 / 3, f"criterion 1 fails on {dataset}: slower than a third")
        claim(
            row["successes"] >= _reference(results, dataset)["successes"],
            f"criterion 1 fails on {dataset}: fewer images than the reference",
        )
    cifar, mnist = single["cifar10"], single["mnist"]
    return (
        f"holds on both: {cifar['torch_ratio']:.3f}x on CIFAR-10 and {mnist['torch_ratio']:.3f}x "
        "on MNIST, recovering as\n"
        f"  many images as PyTorch ({cifar['successes']}/{cifar['attacks']} and "
        f"{mnist['successes']}/{mnist['attacks']})"
    )


@span("attack-speed-criterion-2")
def attack_speed_criterion_2(results: Results) -> str:
    batched = {d: _paper_budget(results, d, 32) for d in SPEED_DATA}
    claim(all(row["torch_ratio"] <= 0.1 for row in batched.values()), "criterion 2 fails")
    return (
        f"holds on both: {batched['cifar10']['torch_ratio']:.3f}x\n"
        f"  on CIFAR-10 and {batched['mnist']['torch_ratio']:.3f}x on MNIST"
    )


@span("attack-speed-steps")
def attack_speed_steps(results: Results) -> str:
    cifar, mnist = _paper_budget(results, "cifar10", 1), _paper_budget(results, "mnist", 1)
    ref_cifar, ref_mnist = _reference(results, "cifar10"), _reference(results, "mnist")
    claim(
        cifar["evaluations_per_attack"] < ref_cifar["evaluations_per_attack"]
        and mnist["evaluations_per_attack"] < ref_mnist["evaluations_per_attack"],
        "leakbench no longer needs fewer evaluations than PyTorch",
    )
    return (
        f"{count(cifar['evaluations_per_attack'])} evaluations per CIFAR-10 attack (PyTorch: "
        f"{count(ref_cifar['evaluations_per_attack'])}; leakbench does not evaluate again the "
        "point where a step that a\n"
        "    tolerance ended left off, nor the point where PyTorch stalls for its remaining "
        "steps,\n"
        f"    which is why MNIST needs {count(mnist['evaluations_per_attack'])} evaluations "
        f"against PyTorch's {count(ref_mnist['evaluations_per_attack'])}), recovering "
        f"{cifar['successes']} of {cifar['attacks']}\n"
        f"    CIFAR-10 and {mnist['successes']} of {mnist['attacks']} MNIST images"
    )


@span("attack-speed-lanes")
def attack_speed_lanes(results: Results) -> str:
    return count(_paper_budget(results, "cifar10", 32)["evaluations_per_second"])


@span("attack-speed-alone")
def attack_speed_alone(results: Results) -> str:
    single, batched = _paper_budget(results, "cifar10", 1), _paper_budget(results, "cifar10", 32)
    claim(
        single["evaluations_per_attack"] == batched["evaluations_per_attack"],
        "a CIFAR-10 trial no longer computes the same at N = 1 and N = 32",
    )
    return f"{count(single['evaluations_per_attack'])} evaluations per attack"


@span("attack-speed-reference")
def attack_speed_reference(results: Results) -> str:
    return f"{_reference(results, 'cifar10')['seconds_per_attack']:.1f} s"


@span("attack-speed-gflops")
def attack_speed_gflops(results: Results) -> str:
    table = results.csv(SPEED)
    gflops = table[table["implementation"] == "leakbench"]["gflops"]
    return whole_range(list(gflops), " GFLOP/s")


@span("attack-speed-old-default")
def attack_speed_old_default(results: Results) -> str:
    mnist = _speed(results, "mnist", "leakbench", "default-300")
    cifar = _speed(results, "cifar10", "leakbench", "default-300")
    mnist, cifar = mnist[mnist["attacks"] == 32], cifar[cifar["attacks"] == 32]
    claim(mnist["successes"].nunique() == 1, "the old budget's MNIST successes vary with N")
    claim(cifar["successes"].nunique() == 1, "the old budget's CIFAR-10 successes vary with N")
    seconds = mnist["seconds_per_attack"]
    return (
        f"recovered\n  {mnist['successes'].iloc[0]} of 32 MNIST images in {seconds.min():.2f}-"
        f"{seconds.max():.2f} s each but was far too short for CIFAR-10 "
        f"({cifar['successes'].iloc[0]} of 32)"
    )


@span("attack-speed-today")
def attack_speed_today(results: Results) -> str:
    board = results.csv(f"{CONVERGENCE}/leaderboard.csv")
    dlg, idlg = one(board, attack="dlg"), one(board, attack="idlg")
    return (
        f"{recovered(dlg)} of {dlg['n']} CIFAR-10 images with `dlg` and {recovered(idlg)} with "
        "`idlg`"
    )


# --- Inverting Gradients' loop (results/perf/ig_speed.csv) ------------------------------------

IG_MODELS = {
    "convnet": "`convnet` (width 8)",
    "convnet64": "`convnet64` (the paper's width)",
    "resnet18": "`resnet18`",
}


def _ig_speed(results: Results, model: str) -> dict[tuple[str, int], float]:
    table = results.csv("perf/ig_speed.csv")
    rows = table[table["model"] == model]
    return {
        (row["implementation"], row["threads"]): row["ms_per_iteration"]
        for _, row in rows.iterrows()
    }


@block("ig-speed")
def ig_speed(results: Results) -> str:
    table = results.csv("perf/ig_speed.csv")
    lines = [
        "| model | parameters | leakbench, ms / iteration | PyTorch 1 thread | PyTorch 2 threads | "
        "leakbench / PyTorch (1 thread) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for model, label in IG_MODELS.items():
        times = _ig_speed(results, model)
        ours = times[("leakbench", 2)]
        parameters = table[table["model"] == model]["parameters"].iloc[0]
        lines.append(
            table_row(
                [
                    label,
                    count(parameters),
                    f"{ours:.1f}",
                    f"{times[('pytorch', 1)]:.1f}",
                    f"{times[('pytorch', 2)]:.1f}",
                    f"{ours / times[('pytorch', 1)]:.2f}",
                ]
            )
        )
    return "\n".join(lines)


@span("ig-speed-finding")
def ig_speed_finding(results: Results) -> str:
    for model in IG_MODELS:
        times = _ig_speed(results, model)
        ours = times[("leakbench", 2)]
        claim(
            ours < times[("pytorch", 1)] and ours < times[("pytorch", 2)],
            f"leakbench is no longer faster than PyTorch on {model}",
        )
    return "2 threads) is now faster than PyTorch on one thread and on two"


# --- ig against the PyTorch implementation of the reference (results/ig_reference) ------------


@span("ig-reference")
def ig_reference(results: Results) -> str:
    table = results.csv("ig_reference/per_image.csv")
    ours, theirs = (mean_ci95(table[f"psnr_{side}"].to_numpy()) for side in ("leakbench", "torch"))
    paired = mean_ci95((table["psnr_leakbench"] - table["psnr_torch"]).to_numpy())
    previous = mean_ci95(table["psnr_previous_defaults"].to_numpy())
    claim(ours[0] >= theirs[0] - theirs[1], "leakbench's ig is weaker than the PyTorch interval")
    claim(previous[0] < ours[0], "the previous defaults are no longer weaker")
    return (
        f"defaults reach {ours[0]:.2f} dB mean PSNR (+-{ours[1]:.2f}), beside {theirs[0]:.2f} dB "
        f"(+-{theirs[1]:.2f}) for a PyTorch\n  implementation of the reference on the same images, "
        f"weights and starts (paired difference\n  {paired[0]:.2f} dB +-{paired[1]:.2f}), and "
        f"{previous[0]:.2f} dB (+-{previous[1]:.2f}) for the previous defaults"
    )


# --- Defenses the literature cites (results/cited_defenses) -----------------------------------

CITED = "cited_defenses/soteria_precode"
MIXUP = "cited_defenses/mixup"
SOTERIA = ({"share": 0.4}, {"share": 0.8})
PRECODE = {"beta": 0.001, "size": 256}
MIXES = ({"alpha": 1.0, "mixed": 2}, {"alpha": 1.0, "mixed": 4})
FEATURES = {"match": "features", "noise": None}
LEARNED_NOISE = {"match": "features", "noise": "learn"}
PLAIN_DLG = {"match": "all", "noise": None, "mixing": None}
LEARNED_MIXING = {"mixing": "learn"}


def _cited(results: Results, run: str) -> pd.DataFrame:
    return results.csv(f"{run}/leaderboard.csv")


@span("cited-utility")
def cited_utility(results: Results) -> str:
    epochs, rates, models = set(), set(), set()
    for run in (CITED, MIXUP):
        utility = results.csv(f"{run}/utility.csv")
        epochs |= set(utility["epochs"])
        rates |= set(utility["learning_rates"])
        models.add(_models(utility))
    claim(len(epochs) == len(rates) == len(models) == 1, "the cited runs train differently")
    nones = {
        (row["test_accuracy"], row["test_accuracy_ci95"])
        for row in (
            one(_cited(results, run), attack="dlg", defense="none", **PLAIN_DLG)
            for run in (CITED, MIXUP)
        )
    }
    claim(len(nones) == 1, "the cited runs' undefended models differ")
    accuracy, half_width = nones.pop()
    searched = listing([rate(value) for value in json.loads(rates.pop())])
    text = acc_ci(accuracy, half_width)
    return (
        f"Utility: {epochs.pop()} epochs, the\n"
        f"rate chosen from {searched} on the validation split, mean of {models.pop()} seeds "
        f"(none: {text.replace(' ± ', ' ±' + chr(10))})"
    )


def _cited_rows(results: Results) -> list[tuple[str, pd.Series, str, str]]:
    """Per row of the table: the defense's label, its `dlg` cell, and the texts of the paper's
    attack and of the adaptive one."""
    board, mixup = _cited(results, CITED), _cited(results, MIXUP)

    def found(row: pd.Series) -> str:
        return f"{decibels(row['psnr_mean'])} dB, {recovered(row)} of {row['n']}"

    def row(label: str, cells: pd.DataFrame, defense: str, params: dict, adaptive: dict) -> tuple:
        """The plain dlg's cell and what each adaptive variant (its wording -> its params)
        found, joined by semicolons."""
        dlg = one(cells, attack="dlg", defense=defense, params=params, **PLAIN_DLG)
        found_by = "; ".join(
            f"{words}: {found(one(cells, attack='dlg', defense=defense, params=params, **kw))}"
            for words, kw in adaptive.items()
        )
        return (label, dlg, found(dlg), found_by)

    features, noise = '`match = "features"`', 'with `noise = "learn"`'
    rows = [
        row(f"`soteria` share {p['share']}", board, "soteria", p, {features: FEATURES})
        for p in SOTERIA
    ]
    precode = {f"{features} alone": FEATURES, noise: LEARNED_NOISE}
    rows.append(row(f"`precode` size {PRECODE['size']}", board, "precode", PRECODE, precode))
    mixing = {'`mixing = "learn"`': LEARNED_MIXING}
    rows += [row(f"`mixup` {p['mixed']}", mixup, "mixup", p, mixing) for p in MIXES]
    return rows


@block("cited-defenses")
def cited_defenses(results: Results) -> str:
    lines = [
        "| defense | accuracy (drop) | the paper's attack (`dlg`) | adaptive attack | verdict |",
        "| --- | --- | --- | --- | --- |",
    ]
    for label, row, paper, adaptive in _cited_rows(results):
        lines.append(
            table_row(
                [
                    label,
                    f"{acc(row['test_accuracy'])} ({points(row['accuracy_drop'])})",
                    paper,
                    adaptive,
                    row["verdict"],
                ]
            )
        )
    return "\n".join(lines)


@block("cited-findings")
def cited_findings(results: Results) -> str:
    board, mixup = _cited(results, CITED), _cited(results, MIXUP)
    none = one(board, attack="dlg", defense="none", **PLAIN_DLG)
    for params in SOTERIA:
        dlg = one(board, attack="dlg", defense="soteria", params=params, **PLAIN_DLG)
        adaptive = one(board, attack="dlg", defense="soteria", params=params, **FEATURES)
        claim(dlg["success_rate"] == 0, f"DLG recovers images under Soteria {params}")
        claim(
            abs(dlg["accuracy_drop"]) <= max(dlg["test_accuracy_ci95"], none["test_accuracy_ci95"]),
            f"Soteria {params} has a measurable cost",
        )
        claim(adaptive["success_rate"] == 1, f"the features attack misses images of {params}")
    dlg = one(board, attack="dlg", defense="precode", params=PRECODE, **PLAIN_DLG)
    alone = one(board, attack="dlg", defense="precode", params=PRECODE, **FEATURES)
    noise = one(board, attack="dlg", defense="precode", params=PRECODE, **LEARNED_NOISE)
    claim(dlg["success_rate"] == 0, "DLG recovers images under PRECODE")
    claim(alone["success_rate"] == 0, "the features attack alone now breaks PRECODE")
    claim(noise["success_rate"] == 1, "learning PRECODE's noise no longer recovers every image")
    pairs, fours = (
        one(mixup, attack="dlg", defense="mixup", params=params, **PLAIN_DLG) for params in MIXES
    )
    pairs_learned, fours_learned = (
        one(mixup, attack="dlg", defense="mixup", params=params, **LEARNED_MIXING)
        for params in MIXES
    )
    claim(pairs["success_rate"] == 0 and fours["success_rate"] == 0, "DLG recovers mixed images")
    claim(recovered(pairs_learned) > 0, "learning the mixing of pairs recovers no digit")
    claim(recovered(fours_learned) == 0, "learning the mixing of four recovers a digit exactly")
    template = """
    - **Soteria** (Sun et al.): its claim holds against DLG, which recovers nothing at either
      share, at no measurable cost. It does not hold against an attacker that ignores the one
      tensor Soteria changes: the feature extractor's gradient alone gives back every image
      exactly, as without a defense, as Balunovic et al. (ICLR 2022) report for an attack on the
      layers Soteria leaves intact.
    - **PRECODE** (Scheliga et al.): its claim holds against DLG, which sees the server's own
      sample of the bottleneck's noise, not the client's. Omitting the gradients of the
      bottleneck and the layers after it, the attack of Scheliga et al.'s follow-up (2022), does
      *not* reproduce here: the feature extractor's gradient still depends on the client's draw
      through back-propagation ({alone_db} dB). Treating that draw as an unknown, as a Bayesian
      attacker (Balunovic et al., ICLR 2022) does, recovers all {noise_n} images exactly.
      PRECODE costs {precode_cost} accuracy points here.
    - **MixUp** (as Huang et al. evaluate it): DLG recovers the mixed examples, which resemble no
      single digit ({pairs_db} dB with pairs, {fours_db} dB with four). The adaptive attack,
      which also learns the mixing, recovers {pairs_found} of {pairs_n} digits exactly with
      pairs, so that configuration is `{pairs_verdict}`. With four mixed it recovers none
      exactly, but {fours_leaked} of {fours_n} of its reconstructions are identified or
      recognisable, so mixing four is `{fours_verdict}` too, at {fours_cost} points (before the
      per-image verdicts, this row said `holds`). Our mix partners come from the client's batch, not
      from its whole dataset as in Huang et al. Un-mixing without the labels is not identifiable
      (the mixes themselves fit the gradient), and a stronger un-mixing attacker may exist: read
      `holds` as "these attacks failed".
    """
    return prose(
        template,
        alone_db=decibels(alone["psnr_mean"]),
        noise_n=noise["n"],
        precode_cost=points(dlg["accuracy_drop"]),
        pairs_db=decibels(pairs["psnr_mean"]),
        fours_db=decibels(fours["psnr_mean"]),
        pairs_found=recovered(pairs_learned),
        pairs_n=pairs_learned["n"],
        pairs_verdict=pairs_learned["verdict"],
        fours_leaked=round(fours_learned["leaked_rate"] * fours_learned["n"]),
        fours_n=fours_learned["n"],
        fours_verdict=fours_learned["verdict"],
        fours_cost=points(fours["accuracy_drop"]),
    )


# --- DP-SGD's training recipe (results/dp_recipe) ---------------------------------------------

DP_OLD = "old (adam 1e-3, batch 32, 30 epochs)"
DP_RUN = "dp, default run (sgd, batch 128, 15 epochs, rates 4, 8)"
DP_DEFAULTS = "dp, defaults (sgd, batch 128, 30 epochs, rates 2, 4, 8)"
DP_CONFIGS = ({"noise_multiplier": 0.5, "norm": 1.0}, {"noise_multiplier": 1.0, "norm": 1.0})


@block("dp-recipe")
def dp_recipe(results: Results) -> str:
    summary = results.csv("dp_recipe/summary.csv")

    def cell(compared: str, params: dict) -> pd.Series:
        rows = summary[
            (summary["compared"] == compared)
            & summary["defense_params"].map(lambda text: json.loads(text) == params)
        ]
        if len(rows) != 1:
            raise ReadmeError(f"dp_recipe/summary.csv: no single row of {compared} {params}")
        return rows.iloc[0]

    def pair(compared: str) -> tuple[str, str]:
        rows = [cell(compared, params) for params in DP_CONFIGS]
        accuracies = " and ".join(acc_ci(r["test_accuracy"], r["test_accuracy_ci95"]) for r in rows)
        return accuracies, " and ".join(f"{r['epsilon']:.1f}" for r in rows)

    board = _board(results)
    for params in DP_CONFIGS:
        ran = one(board, attack="idlg", defense="dpsgd", params=params, **PLAIN)
        claim(
            math.isclose(ran["test_accuracy"], cell(DP_RUN, params)["test_accuracy"]),
            "the DP recipe's models are no longer the default run's",
        )
        claim(
            cell(DP_RUN, params)["epsilon"] > cell(DP_OLD, params)["epsilon"],
            "the DP recipe no longer spends more privacy budget than the old one",
        )
    claim(summary["models"].nunique() == 1, "the recipes trained different numbers of models")
    claim(
        {json.dumps(p, sort_keys=True) for p in DP_CONFIGS}
        == {
            json.dumps(json.loads(t), sort_keys=True)
            for t in select(board, defense="dpsgd")["defense_params"]
        },
        "the default run's DP-SGD configurations changed",
    )
    old, run = cell(DP_OLD, DP_CONFIGS[1]), cell(DP_RUN, DP_CONFIGS[1])
    old_acc, old_eps = pair(DP_OLD)
    run_acc, run_eps = pair(DP_RUN)
    defaults_acc, defaults_eps = pair(DP_DEFAULTS)
    template = """
    **DP-SGD's recipe matters more than its noise here.** `benchmarks/dp_recipe.py` trains the
    default run's two `dpsgd` configurations (clipping norm 1, noise multiplier 0.5 and 1.0)
    with {models} seeds each (`results/dp_recipe/`, 2026-12-01, the command is in its README).
    With the old recipe that every defense used before engine version 4 (Adam 1e-3, batch 32,
    30 epochs), test accuracy is {old_acc} (mean and 95% CI over seeds; epsilon {old_eps}). With
    the DP recipe as the default run configures it (SGD, batch 128, 15 epochs, rates 4 and 8) it
    is {run_acc} (epsilon {run_eps}), and with the recipe's defaults (30 epochs, rates 2, 4, 8)
    {defaults_acc} (epsilon {defaults_eps}). The epsilons are not equal: the DP recipe takes more
    steps at a higher sampling rate, so part of the gain is spent privacy budget; at noise
    multiplier 1.0 the default run's DP recipe gives epsilon {run_eps_10} against {old_eps_10}
    for {gain} more accuracy points.
    """
    return prose(
        template,
        models=summary["models"].iloc[0],
        old_acc=old_acc,
        old_eps=old_eps,
        run_acc=run_acc,
        run_eps=run_eps,
        defaults_acc=defaults_acc,
        defaults_eps=defaults_eps,
        run_eps_10=f"{run['epsilon']:.1f}",
        old_eps_10=f"{old['epsilon']:.1f}",
        gain=points(run["test_accuracy"] - old["test_accuracy"], 0),
    )


# --- The trainer's steady state (results/perf/train_steady_state.csv) -------------------------


def _steady(results: Results) -> pd.Series:
    return results.csv("perf/train_steady_state.csv").iloc[0]


@block("steady-state")
def steady_state(results: Results) -> str:
    run = _steady(results)
    nodes = (
        f"{count(run['graph_nodes_10'])} nodes"
        if run["graph_nodes_10"] == run["graph_nodes_final"]
        else f"{count(run['graph_nodes_10'])} / {count(run['graph_nodes_final'])} nodes"
    )
    steps = count(run["steps"])
    return "\n".join(
        [
            "| measure | value | target |",
            "| --- | --- | --- |",
            table_row(
                [
                    "mean step time, steps 1,000-2,000 / last 1,000",
                    f"{run['early_ms_mean']:.2f} / {run['late_ms_mean']:.2f} ms (ratio "
                    f"{run['time_ratio']:.2f})",
                    "within 10%",
                ]
            ),
            table_row(
                [
                    f"resident memory, step 1,000 / step {steps}",
                    f"{run['rss_mb_at_1000']:.1f} / {run['rss_mb_final']:.1f} MB "
                    f"({run['rss_growth_mb']:+.1f} MB)",
                    "< 50 MB growth",
                ]
            ),
            table_row(["traces of the step function", str(run["traces"]), "exactly 1"]),
            table_row(
                [
                    f"step graph, step 10 / step {steps}",
                    f"{count(run['graph_bytes_10'])} / {count(run['graph_bytes_final'])} bytes "
                    f"({nodes})",
                    "unchanged",
                ]
            ),
            table_row(
                [
                    "checkpoint after 10 / 2,000 steps",
                    f"{count(run['checkpoint_bytes_10'])} / "
                    f"{count(run['checkpoint_bytes_2000'])} bytes",
                    "< 1% apart",
                ]
            ),
        ]
    )


@span("steady-state-naive")
def steady_state_naive(results: Results) -> str:
    run = _steady(results)
    per_step = (run["naive_ms_first10"], run["naive_ms_last10"])
    return (
        f"{run['naive_steps']} steps (the same\n"
        f"step wrapped in a new `tf.function` every step): {run['naive_traces']} traces, "
        f"{min(per_step):.0f}-{max(per_step):.0f} ms per step "
        f"({run['naive_ms_last10'] / run['late_ms_mean']:.0f} times the\n"
        f"steady state) and {run['naive_rss_growth_mb'] / run['naive_steps']:+.1f} MB of "
        "resident memory per step"
    )


# --- Flower (results/flower, results/perf/flower_steady_state*.csv) ---------------------------


@block("flower-example")
def flower_example(results: Results) -> str:
    """What ``examples/flower/run_simulation.py`` printed for the two committed audits."""
    printed = [
        (results.root / "flower" / run / "printed.txt").read_text(encoding="utf-8").rstrip("\n")
        for run in ("none", "gaussian")
    ]
    commands = [
        "$ python examples/flower/run_simulation.py --out results/flower/none",
        "$ python examples/flower/run_simulation.py --defense gaussian --param sigma=0.1 \\\n"
        "    --out results/flower/gaussian",
    ]
    lines = ["```"]
    for command, text in zip(commands, printed, strict=True):
        lines += [command, text]
    return "\n".join([*lines, "```"])


@block("flower-steady-state")
def flower_steady_state(results: Results) -> str:
    run = results.csv("perf/flower_steady_state.csv").iloc[0]
    naive = results.csv("perf/flower_steady_state_naive.csv").iloc[0]
    claim(bool(run["pass_all"]), "the committed Flower steady-state run does not pass")
    last = int(run["rounds"])
    rows = ["| measure | round 1 | round 10 | round " + str(last) + " | target |"]
    rows.append("| --- | --- | --- | --- | --- |")
    rows.append(
        table_row(
            [
                "client process RSS (MB)",
                f"{run['rss_mb_round_1']:.1f}",
                f"{run['rss_mb_round_10']:.1f}",
                f"{run['rss_mb_final']:.1f} ({run['rss_growth_mb']:+.1f} from round 10)",
                "< 20 MB growth",
            ]
        )
    )
    for what, key in (("defense traces (`DefenseMod`)", "mod"), ("client-step traces", "client")):
        rows.append(
            table_row(
                [
                    what,
                    str(run[f"{key}_traces_round_1"]),
                    str(run[f"{key}_traces_round_10"]),
                    str(run[f"{key}_traces_final"]),
                    "exactly 1",
                ]
            )
        )
    rows.append(
        table_row(
            [
                "anti-pattern: RSS (MB) / defense traces",
                f"{naive['rss_mb_round_1']:.1f} / {naive['mod_traces_round_1']}",
                f"{naive['rss_mb_round_10']:.1f} / {naive['mod_traces_round_10']}",
                f"{naive['rss_mb_final']:.1f} / {naive['mod_traces_final']} "
                f"({naive['rss_growth_mb']:+.1f} MB from round 10)",
                "(contrast)",
            ]
        )
    )
    return "\n".join(rows)


# --- The malicious server (results/malicious) ------------------------------------------------

MALICIOUS = "malicious/summary.csv"
KAPPA = 1e-3  # the prior of benchmarks/malicious_summary.py's accounting bound
# The summary's runs in the order the table lists them.
MALICIOUS_RUNS = (
    "digits-b1", "digits-b4", "digits-b16", "digits-b64", "digits-b256", "digits-k4",
    "digits-k16", "digits-k16-dlg", "digits-b64-dlg", "digits-b64-fedavg", "cifar10-convnet-b64",
    "cifar10-resnet18-b64", "cifar10-convnet-k4", "cifar10-convnet-k16", "cifar10-convnet-k16-dlg",
    "cifar10-lenet-b64",
    "sa-k2", "sa-k4", "sa-k8", "sa-k16",
)  # fmt: skip


def _malicious_row(
    results: Results, run: str, attack: str = "imprint", defense: str = "none", **params: Any
) -> pd.Series:
    frame = results.csv(MALICIOUS)
    return one(frame[frame["run"] == run], attack=attack, defense=defense, params=params)


def _count(row: pd.Series) -> int:
    return round(row["recovered"] * row["images"])


def _recovered(row: pd.Series) -> str:
    """ "k of n (low-high%)": the images recovered exactly and the 95% interval of the share."""
    interval = whole_range([100 * row["recovered_low"], 100 * row["recovered_high"]], "%")
    return f"{_count(row)} of {row['images']} ({interval})"


def _closed_form_interval(row: pd.Series) -> tuple[int, int]:
    """The binomial 95% interval of the count the closed form predicts."""
    low, high = stats.binom.interval(0.95, int(row["images"]), float(row["predicted"]))
    return int(low), int(high)


def _inside(row: pd.Series) -> str:
    """ "inside" or "outside" the closed form's binomial 95% interval, with the interval."""
    low, high = _closed_form_interval(row)
    where = "inside" if low <= _count(row) <= high else "outside"
    return f"{where} its binomial 95% interval ({low}-{high})"


def _optional_pct(value: float) -> str:
    return "–" if pd.isna(value) else pct(value)


@block("malicious-table")
def malicious_table(results: Results) -> str:
    """Every cell of the committed malicious-server runs and of the honest runs beside them."""
    frame = results.csv(MALICIOUS)
    lines = [
        table_row(["run", "model", "clients x batch", "defense", "attack",
                   "recovered exactly (95% CI)", "closed form", ">= 60 dB", "flagged"]),
        table_row(["---"] * 9),
    ]  # fmt: skip
    for run in MALICIOUS_RUNS:
        rows = frame[frame["run"] == run]
        claim(not rows.empty, f"results/malicious/{run} is missing from the summary")
        for _, row in rows.iterrows():
            lines.append(table_row([
                f"`{run}`", row["model"], f"{row['clients']} x {row['batch_size']}",
                defense_label(row["defense"], row["defense_params"]), f"`{row['attack']}`",
                _recovered(row), _optional_pct(row["predicted"]), pct(row["psnr60"]),
                _optional_pct(row["flagged"]),
            ]))  # fmt: skip
    return "\n".join(lines)


def _share(row: pd.Series) -> str:
    return f"{pct(row['recovered'])} (closed form {pct(row['predicted'])})"


def _curve(results: Results, run: str, attack: str, defense: str, parameter: str) -> str:
    """ "value: share, ..." of one noise defense's sweep, weakest noise first."""
    frame = results.csv(MALICIOUS)
    rows = select(frame[frame["run"] == run], attack=attack, defense=defense)
    claim(not rows.empty, f"{run} has no {defense} rows for {attack}")
    points = sorted(
        (json.loads(text)[parameter], share)
        for text, share in zip(rows["defense_params"], rows["recovered"], strict=True)
    )
    return ", ".join(f"{value:g}: {pct(share)}" for value, share in points)


def _weighted_flags(rows: pd.DataFrame) -> tuple[float, int]:
    """The share of the trials of ``rows`` (summary cells) that the client flags, and how many
    trials there are; cells whose clients have nothing to check are left out."""
    rows = rows[rows["flagged"].notna()]
    trials = int(rows["trials"].sum())
    return float((rows["flagged"] * rows["trials"]).sum() / trials), trials


def _where_closed_form(rows: list[pd.Series]) -> tuple[list[str], list[str]]:
    """The batch sizes whose count lies inside the closed form's interval, and below it."""
    inside, below = [], []
    for row in rows:
        low, high = _closed_form_interval(row)
        claim(_count(row) <= high, f"batch {row['batch_size']} above its closed form")
        (inside if _count(row) >= low else below).append(str(row["batch_size"]))
    return inside, below


def _accounting(results: Results) -> dict[str, str]:
    """The DP-SGD accounting's reconstruction bound beside the measured shares, and its prior."""
    from leakbench.defenses.dpsgd import DPSGD

    frame = results.csv(MALICIOUS)
    dp = frame[frame["defense"] == "dpsgd"]
    claim(bool(dp["bound"].notna().all()), "a dpsgd cell has no accounting bound")
    claim(bool((dp["recovered_low"] <= dp["bound"]).all()), "a dpsgd share exceeds its bound")
    kappa = KAPPA

    def bound(z: float) -> float:
        return DPSGD(norm=1.0, noise_multiplier=z).reconstruction_bound(kappa)

    z_high = max(z for z in (0.05, 0.1, 0.15) if bound(z) >= 0.99)
    z_half = optimize.brentq(lambda z: bound(z) - 0.5, 0.1, 1.0, xtol=1e-3)
    imprint = dp[dp["attack"] == "imprint"]
    onsets = []  # per run, the weakest noise at which imprint reads nothing
    for _, rows in imprint.groupby("run"):
        noise = [json.loads(text)["noise_multiplier"] for text in rows["defense_params"]]
        shares = zip(noise, rows["recovered"], strict=True)
        onsets.append(min(z for z, share in shares if share == 0))
    zero = max(onsets)
    prior = results.csv("malicious/prior.csv")
    claim(bool((prior["near"] == 0).all()), "a public image is within MSE 1e-3 of a private one")
    claim(bool((prior["share_high"] < kappa).all()), "the prior is not generous")
    pairs = prior.drop_duplicates("dataset")
    named = {"digits": "digits"}
    prior_text = listing([
        f"{count(row['near'])} of the {count(row['pairs'])} (private, public) pairs of "
        f"{named.get(row['dataset'], 'CIFAR-10')} lie within MSE 1e-3 (95% upper bound "
        f"{row['share_high']:.1g})" for _, row in pairs.iterrows()
    ])  # fmt: skip
    norms = {("digits" if row["dataset"] == "digits" else "cifar"): row["norm_median"]
             for _, row in prior.iterrows()}  # fmt: skip
    floors = {name: math.sqrt(1e-3) / norm for name, norm in norms.items()}
    return {
        "digits_norm": f"{norms['digits']:.1f}",
        "cifar_norm": f"{norms['cifar']:.0f}",
        "digits_floor": f"{floors['digits']:.3f}",
        "cifar_floor": f"{floors['cifar']:.4f}",
        "kappa": f"{kappa:g}",
        "prior": prior_text,
        "zero": f"{zero:g}",
        "z_high": f"{z_high:g}",
        "bound_half": "50%",
        "z_half": f"{z_half:.2f}",
        "bound_one": pct(bound(1.0), 1),
        "gap": f"{z_half / zero:.0f}",
    }


@block("malicious-findings")
def malicious_findings(results: Results) -> str:
    """What the committed malicious-server runs show, each claim derived from summary.csv."""
    convnet = _malicious_row(results, "cifar10-convnet-b64")
    resnet = _malicious_row(results, "cifar10-resnet18-b64")
    k16, k4 = (_malicious_row(results, f"cifar10-convnet-k{k}") for k in (16, 4))
    digits64 = _malicious_row(results, "digits-b64")
    digits_k16 = _malicious_row(results, "digits-k16")
    dlg_k16 = _malicious_row(results, "digits-k16-dlg", attack="dlg")
    dlg64 = _malicious_row(results, "digits-b64-dlg", attack="dlg")
    dlg_cifar = _malicious_row(results, "cifar10-convnet-k16-dlg", attack="dlg")
    dlg_trials = results.csv("malicious/cifar10-convnet-k16-dlg/trials.csv")
    claim(set(dlg_trials["stop_reason"]) == {"stalled"}, "the CIFAR-10 dlg did not stall")
    fedavg = _malicious_row(results, "digits-b64-fedavg")
    trap = _malicious_row(results, "digits-b64", attack="trap_weights")
    trap_cifar = _malicious_row(results, "cifar10-convnet-b64", attack="trap_weights")
    trap_fedavg = _malicious_row(results, "digits-b64-fedavg", attack="trap_weights")
    sweep = [_malicious_row(results, f"digits-b{b}") for b in (1, 4, 16, 64, 256)]
    inside, below = _where_closed_form(sweep)
    claim(
        all(_count(r) < _closed_form_interval(r)[0] for r in (trap, trap_cifar)),
        "trap_weights reaches its closed form",
    )
    claim(_count(dlg_k16) == 0 and _count(dlg64) == 0, "the honest dlg recovers images")
    claim(_count(dlg_cifar) == 0, "the honest dlg recovers CIFAR-10 images")
    exact = [row["psnr60"] / row["recovered"] for row in (convnet, resnet)]
    frame = results.csv(MALICIOUS)
    malicious, trials = _weighted_flags(frame[(frame["attack"] != "dlg")])
    honest, honest_trials = _weighted_flags(frame[frame["attack"] == "dlg"])
    small = frame[(frame["attack"] != "dlg") & (frame["batch_size"] == 1)]
    calibration = results.csv("malicious/calibration.csv")
    calibrated = calibration[calibration["server"] == "honest"]
    claim(not calibrated["flagged"].any(), "the thresholds flag an honest calibration model")
    held = results.csv("malicious/held_out.csv")
    claim(set(held["seed"]).isdisjoint(calibration["seed"]), "held-out seeds were calibrated")
    checked = held[held["batch_size"] > 2]  # batches of 2 are never flagged (threshold inf)
    held_honest = checked[checked["server"] == "honest"]
    held_imprint = checked[checked["server"] == "malicious"]
    flagged_honest = int(held_honest["flagged"].sum())
    alarms = held_honest[held_honest["flagged"].astype(bool)]
    claim(alarms["model"].str.startswith("resnet").all(), "a held-out non-ResNet is flagged")
    per_batch = calibrated.groupby("batch_size").size()
    claim(per_batch.nunique() == 1, "the calibration has unequal models per batch size")
    per_batch_n = int(per_batch.iloc[0])
    interval = stats.binomtest(flagged_honest, len(held_honest)).proportion_ci(0.95)
    claim(interval.low <= 1 / (per_batch_n + 1), "held-out false alarms above the stated rate")
    held_high = interval.high
    bounds = _accounting(results)
    for run in ("digits-b64", "cifar10-lenet-b64"):
        board = results.csv(f"malicious/{run}/leaderboard.csv")
        dp = board[(board["defense"] == "dpsgd") & board["strongest"].astype(bool)]
        claim(not (dp["verdict"] == "holds").any(), f"a DP-SGD cell of {run} holds")
    template = """
    - **CIFAR-10, a batch of 64.** `imprint` recovers {convnet} images exactly on `convnet` and
      {resnet} on `resnet18`. The closed form predicts a {convnet_p} share of singletons; the
      counts lie {convnet_where} and {resnet_where}. Of the images recovered exactly,
      {exact} are at 60 dB or more; the rest are intervals of a few examples that one of
      them dominates.
    - **Secure aggregation.** With 16 clients of 4 images `imprint` recovers {k16} on `convnet`
      ({k16_where} too), where the honest `dlg` recovers {dlg_cifar} (median {dlg_cifar_psnr}
      dB; its search stalled after {dlg_cifar_iterations} iterations); with 4 clients of 16
      {k4}: the server's sum over the clients is a sum over
      the 64 images. On digits, 16 clients of 4 give {digits_k16}, {same} one client's batch of
      64 ({digits64}). The honest `dlg` recovers {dlg_k16} of the 16 clients' digits (median
      {dlg_k16_psnr} dB) and {dlg64} of one client's batch of 64.
    - **Batch size** (digits, `lenet`, one client; recovered, closed form): {sweep}. Inside the
      closed form's 95% interval at {inside}, below it at {below}: the closed form takes every
      interval to be equally likely for the private examples.
    - **`trap_weights`** (1,000 units, each firing for 1/64 of the public images) reads {trap}
      digits in batches of 64 and {trap_cifar} CIFAR-10 images on `convnet`, far below its
      closed form, which takes the units to fire independently: similar images fire the same
      units.
    - **FedAvg** (5 local steps at rate 0.1, one batch of 64 digits): `imprint` recovers
      {fedavg} exactly and `trap_weights` {trap_fedavg} (one step: {digits64_short} and
      {trap_short}). The client shares the sum of five steps' gradients; the block's
      thresholds move little over the steps, so each step bins the examples nearly alike.
    - **Noise** (a batch of 64; share recovered exactly). `gaussian` sigma on digits {gauss_digits};
      on CIFAR-10 (`convnet`) {gauss_cifar}. `dpsgd` (clip 1) noise multiplier on digits
      {dp_digits}; on CIFAR-10 (`lenet`) {dp_cifar}. Under DP-SGD an example's clipped gradient
      has norm at most 1 (the clip), so the rows it is read from carry it at most at that scale,
      while every coordinate carries noise of standard deviation z (the noise multiplier):
      reading an image x off them leaves an expected MSE of about z^2 ||x||^2 or more. With
      the private images' median norm ({digits_norm} on digits, {cifar_norm} on CIFAR-10), no
      such reading of the median image is exact (MSE <= 1e-3) above z = {digits_floor} and
      {cifar_floor}: where the measured shares reach 0.
    - **What the accounting allows.** One update of DP-SGD is one Gaussian release, so its
      accounting bounds any attacker's chance of reconstructing a given example
      (`DPSGD.reconstruction_bound`: reconstruction robustness, Balle et al. 2022, Hayes et al.
      2023), here for a prior success of {kappa}. That prior is generous: {prior}. The bound
      is above 99% up to a noise multiplier of {z_high}, {bound_half} at {z_half} and
      {bound_one} at 1 (the black line of the figure). Every measured share lies below it, but
      `imprint` reads nothing from a noise multiplier of {zero} on both datasets, {gap} times
      less noise than the bound needs to fall to 50%. Between {zero} and about {z_half} the
      accounting promises almost nothing, and this attack still reads nothing. That is the
      noise floor of reading an image off its own rows of the update, not a guarantee: an
      attacker with a prior over images (a denoiser, many rounds) is not run. DP-SGD's
      adaptive setting (`loss = "cosine"`) tunes optimisation
      attacks, which a malicious server does not run, so a DP-SGD cell where nothing leaks is
      `untested`, never `holds`.
    - **Would the client notice?** The D-SNR check flags {malicious} of the {trials} malicious
      trials whose clients hold more than one example, and {honest} of the {honest_trials}
      honest `dlg` trials beside them; none of the {calibrated} honest models of the
      calibration, by construction. Each threshold is the largest D-SNR of {per_batch} honest
      models at its batch size, so a new honest model exceeds it with a chance of about
      1/{per_batch_plus} = {nominal} (the models being exchangeable): the stated false-alarm
      rate. On {held_out} held-out honest models at batches of 4 to 64 (seeds the thresholds
      never saw; at 2 the check never flags) it flags {held_flagged} ({held_rate}; 95% upper
      bound {held_high}), all of them ResNets ({held_models}), and {held_malicious} of their
      {held_malicious_n} imprint models. Clients of one example ({small_trials} trials here) have
      nothing to check.
    """
    return prose(
        template,
        convnet=_recovered(convnet),
        resnet=_recovered(resnet),
        convnet_where=_inside(convnet),
        resnet_where=_inside(resnet),
        convnet_p=pct(convnet["predicted"]),
        exact=listing([pct(share) for share in exact]),
        k16=_recovered(k16),
        k16_where=_inside(k16),
        k4=_recovered(k4),
        digits_k16=_recovered(digits_k16),
        same="the same count as" if _count(digits_k16) == _count(digits64) else "against",
        digits64=_recovered(digits64),
        dlg_k16=_recovered(dlg_k16),
        dlg_k16_psnr=decibels(dlg_k16["psnr_median"]),
        dlg64=_recovered(dlg64),
        dlg_cifar=_recovered(dlg_cifar),
        dlg_cifar_psnr=decibels(dlg_cifar["psnr_median"]),
        dlg_cifar_iterations=count(dlg_trials["iterations"].max()),
        sweep=", ".join(f"{row['batch_size']}: {_share(row)}" for row in sweep),
        inside=listing(inside),
        below=listing(below),
        trap=_recovered(trap),
        trap_cifar=_recovered(trap_cifar),
        fedavg=_recovered(fedavg),
        trap_fedavg=_recovered(trap_fedavg),
        digits64_short=pct(digits64["recovered"]),
        trap_short=pct(trap["recovered"]),
        gauss_digits=_curve(results, "digits-b64", "imprint", "gaussian", "sigma"),
        gauss_cifar=_curve(results, "cifar10-convnet-b64", "imprint", "gaussian", "sigma"),
        dp_digits=_curve(results, "digits-b64", "imprint", "dpsgd", "noise_multiplier"),
        dp_cifar=_curve(results, "cifar10-lenet-b64", "imprint", "dpsgd", "noise_multiplier"),
        **bounds,
        malicious=pct(malicious),
        trials=count(trials),
        honest=pct(honest),
        honest_trials=count(honest_trials),
        calibrated=count(len(calibrated)),
        held_out=count(len(held_honest)),
        per_batch=count(per_batch_n),
        per_batch_plus=count(per_batch_n + 1),
        nominal=pct(1 / (per_batch_n + 1), 1),
        held_models=listing([f"`{m}` {n}" for m, n in alarms["model"].value_counts().items()]),
        held_flagged=count(flagged_honest),
        held_rate=pct(flagged_honest / len(held_honest), 1),
        held_high=pct(held_high, 1),
        held_malicious=pct(held_imprint["flagged"].mean()),
        held_malicious_n=count(len(held_imprint)),
        small_trials=count(small["trials"].sum()),
    )


@span("malicious-readme")
def malicious_readme(results: Results) -> str:
    """The README's line on the malicious server."""
    resnet = _malicious_row(results, "cifar10-resnet18-b64")
    k16 = _malicious_row(results, "cifar10-convnet-k16")
    # The honest attack on the same setting: CIFAR-10, `convnet`, 16 clients.
    dlg = _malicious_row(results, "cifar10-convnet-k16-dlg", attack="dlg")
    claim(dlg["clients"] == k16["clients"], "the honest dlg run has other clients than imprint's")
    frame = results.csv(MALICIOUS)
    share, trials = _weighted_flags(frame[frame["attack"] != "dlg"])
    flagged = round(share * trials)
    low, high = exact_interval(flagged, trials)
    return (
        f"reads {_count(resnet)} of {resnet['images']} CIFAR-10 images exactly off one "
        f"`resnet18` update of a batch of 64, and {_count(k16)} of {k16['images']} through 16 "
        f"clients' secure aggregation, where the honest `dlg` recovers {_count(dlg)} of "
        f"{dlg['images']} in the same setting; a client that checks its update (D-SNR) would "
        f"flag {flagged} of the {trials} malicious models it could check (95% CI "
        f"{100 * low:.1f}-{100 * high:.1f}%)"
    )


# --- Leakage over training (results/checkpoints) ---------------------------------------------

CHECKPOINT_RUNS = {
    "digits-lenet": "Digits, `lenet`",
    "cifar10-lenet": "CIFAR-10, `lenet`",
    "cifar10-convnet": "CIFAR-10, `convnet`",
}


def _checkpoint_heads(results: Results, run: str) -> pd.DataFrame:
    """The strongest attack's row per checkpoint and defense of a committed checkpoint run."""
    frame = results.csv(f"checkpoints/{run}/checkpoints.csv")
    return frame[frame["strongest"].astype(bool)]


def _checkpoint_curve(heads: pd.DataFrame, defense: str) -> str:
    """ "epoch 0 (accuracy 10%): 100% leaked, 100% exact; ..." for one defense."""
    rows = heads[heads["defense"] == defense].sort_values("progress")
    claim(not rows.empty, f"no {defense} rows in a checkpoint run")
    return "; ".join(
        f"{row['progress']:g} ({pct(row['model_accuracy'])}): {pct(row['leaked_rate'])} leaked, "
        f"{pct(row['success_rate'])} exact"
        for _, row in rows.iterrows()
    )


def _trend(heads: pd.DataFrame, defense: str) -> tuple[float, float]:
    """The leaked share at the first and at the last checkpoint."""
    rows = heads[heads["defense"] == defense].sort_values("progress")
    return float(rows["leaked_rate"].iloc[0]), float(rows["leaked_rate"].iloc[-1])


@block("checkpoints-findings")
def checkpoints_findings(results: Results) -> str:
    """What the committed leakage-over-training runs show, from their checkpoints.csv."""
    lines = []
    for run, label in CHECKPOINT_RUNS.items():
        heads = _checkpoint_heads(results, run)
        attacks = sorted(set(heads["attack"]))
        images = int(heads["n"].iloc[0])
        parts = [
            f"- **{label}** ({images} images; the strongest of {listing(attacks)} per defense; "
            "epochs: model accuracy, images leaked, recovered exactly). "
        ]
        for defense in dict.fromkeys(heads["defense"]):
            params = heads[heads["defense"] == defense]["defense_params"].iloc[0]
            parts.append(f"{defense_label(defense, params)}: {_checkpoint_curve(heads, defense)}. ")
        if (heads["verdict"] == "inconclusive").all():
            budget = float(heads["budget_share"].min())
            iterations = sorted({json.loads(t).get("iterations") for t in heads["attack_params"]})
            parts.append(
                "Every checkpoint is `inconclusive`: the attack leaks no image even at the "
                "initialisation (median PSNR "
                f"{whole_range(list(heads['psnr_median']), ' dB')}), and {pct(budget)} of its "
                f"attacks ended on their budget of {listing([count(i) for i in iterations])} "
                "iterations, so this run cannot say where leakage concentrates: a stronger "
                "attack (more iterations and starts) is needed on this model."
            )
        lines.append("".join(parts).strip())
    peaks = []
    for run in ("digits-lenet", "cifar10-lenet"):
        rows = _checkpoint_heads(results, run)
        rows = rows[rows["defense"] == "none"].sort_values("progress")
        top = rows["leaked_rate"].max()
        at = [f"{v:g}" for v in rows[rows["leaked_rate"] == top]["progress"]]
        claim(max(float(v) for v in at) <= 5, f"{run}: leakage peaks after 5 epochs")
        final = rows.iloc[-1]
        budget = float(rows["budget_share"].max())
        peaks.append(
            f"{CHECKPOINT_RUNS[run]} leaks most ({pct(top)}) at epochs {listing(at)} and "
            f"{pct(final['leaked_rate'])} at the last checkpoint ({final['progress']:g} epochs, "
            f"{pct(final['model_accuracy'])} accuracy)"
            + (f"; there {pct(budget, 1)} of its attacks ended on their iteration budget"
               if budget > 0 else "")
        )  # fmt: skip
    digits_first, digits_last = _trend(_checkpoint_heads(results, "digits-lenet"), "none")
    claim(digits_last < digits_first, "digits leakage does not fall by the last checkpoint")
    lines.append(
        "- **Beside the published finding.** Du et al. (USENIX Security 2025) find that leakage "
        "concentrates early in training. Without a defense, " + "; ".join(peaks) + ". Both "
        "LeNet runs leak most within the first 5 epochs; on digits the share falls once the "
        "model has converged, as they find, while the CIFAR-10 model after 10 epochs is still "
        "early in its training and leaks nearly as much as at its peak. One seed and 8 to 16 "
        "images per checkpoint: the intervals of the figure are wide."
    )
    return wrap("\n".join(lines))


@span("checkpoints-readme")
def checkpoints_readme(results: Results) -> str:
    """The README's line on leakage over training."""
    digits = _checkpoint_heads(results, "digits-lenet")
    rows = digits[digits["defense"] == "none"].sort_values("progress")
    start, final = rows.iloc[0], rows.iloc[-1]

    def leaked(row: pd.Series) -> str:
        k, n = round(row["leaked_rate"] * row["n"]), int(row["n"])
        return f"{k} of {n} (95% CI {100 * row['leaked_low']:.0f}-{100 * row['leaked_high']:.0f}%)"

    return (
        f"on digits the undefended LeNet leaks {leaked(start)} of its images at "
        f"initialisation and {leaked(final)} after {final['progress']:g} epochs of training "
        f"({pct(final['model_accuracy'])} accuracy; by engine 5's rules, before the suite)"
    )


# --- Measured privacy (results/epsilon_audit) ------------------------------------------------

AUDIT_RUN = "epsilon_audit/digits-lenet"


def _audit_rows(results: Results, defense: str, key: str) -> pd.DataFrame:
    """A committed audit's rows of one defense, ordered by the parameter it sweeps."""
    rows = select(results.csv(f"{AUDIT_RUN}/epsilon_audit.csv"), defense=defense)
    claim(not rows.empty, f"no {defense} rows in the committed epsilon audit")
    order = rows["defense_params"].map(lambda text: json.loads(text)[key])
    return rows.assign(_x=order).sort_values("_x")


def _at_cap(row: pd.Series) -> bool:
    return bool(row["epsilon_audit"] >= row["epsilon_audit_cap"] - 0.05)


@block("epsilon-audit-findings")
def epsilon_audit_findings(results: Results) -> str:
    """What the committed epsilon audit shows, from its epsilon_audit.csv."""
    audit = results.csv(f"{AUDIT_RUN}/epsilon_audit.csv")
    claim(not (audit["audit"] == "failed").any(), "a committed audit failed")
    rounds = int(audit["rounds"].iloc[0])
    cap = float(audit["epsilon_audit_cap"].max())
    confidence = float(audit["epsilon_audit_confidence"].iloc[0])
    none = one(audit, defense="none")
    claim(_at_cap(none), "none is below the ceiling")
    dp = _audit_rows(results, "dpsgd", "noise_multiplier")
    norm = json.loads(dp["defense_params"].iloc[0])["norm"]
    dp_parts = [
        f"z = {row['_x']:g}: {row['epsilon_audit']:.2f} against {row['epsilon_update']:.2f} "
        f"({row['epsilon_update'] / row['epsilon_audit']:.1f} times less)"
        for _, row in dp.iterrows()
    ]
    at_one = dp[dp["_x"] == 1.0]
    claim(len(at_one) == 1, "no DP-SGD at noise multiplier 1 in the committed audit")
    gauss = _audit_rows(results, "gaussian", "sigma")
    bounds = list(gauss["epsilon_audit"])
    falls = all(a >= b for a, b in zip(bounds, bounds[1:], strict=False))
    claim(falls, "the Gaussian bound does not fall")
    first_below = gauss[~gauss.apply(_at_cap, axis=1)]
    claim(not first_below.empty, "every Gaussian sigma is at the ceiling")
    gauss_parts = [
        f"sigma {row['_x']:g}: {row['epsilon_audit']:.2f}" for _, row in gauss.iterrows()
    ]
    capped = [
        defense_label(row["defense"], row["defense_params"])
        for _, row in audit.iterrows()
        if row["defense"] not in ("none", "gaussian", "dpsgd") and _at_cap(row)
    ]
    below = [
        defense_label(row["defense"], row["defense_params"])
        for _, row in audit.iterrows()
        if row["defense"] not in ("none", "gaussian", "dpsgd") and not _at_cap(row)
    ]
    claim(not below, "a defense other than noise and DP-SGD is below the ceiling")
    seconds = float(audit["seconds"].sum())
    delta = sci(float(audit["delta"].iloc[0]))
    norm_text = f"{audit['canary_norm'].iloc[0]:.2f}"
    return wrap(
        f"- **Every audit passed.** {len(audit)} defense configurations, {count(rounds)} rounds "
        f"each, bounds at confidence {confidence:g} and delta {delta}; "
        f"the most {count(rounds)} rounds can show is {cap:.2f}, and `none` reaches it.\n"
        f"- **DP-SGD** (clip norm {norm:g}): the measured lower bound against the accountant's "
        f"epsilon of one update, {'; '.join(dp_parts)}. Every bound lies below the accountant, "
        "as it must for a correct implementation; the gap is what a finite audit cannot see "
        "(the accountant's epsilon at delta 1e-5 lives in the tails of the noise).\n"
        f"- **Gaussian noise without clipping** (canary norm {norm_text}, the largest example "
        f"gradient of the audited batch): {'; '.join(gauss_parts)}. The bound falls as sigma "
        "grows, and never reaches 0 in theory: without clipping, a larger canary shows through "
        "any noise.\n"
        f"- **At the ceiling** (nothing measurable separates them from no defense): "
        f"{listing(capped)}. Pruning, quantisation, clipping without noise and Soteria leave a "
        "large coordinate standing; PRECODE changes the model, not the update's sensitivity.\n"
        f"- **Cost**: {seconds:.0f} s of audit rounds for the {len(audit)} configurations on the "
        "2-core machine (the `seconds` column), beside the run's attacks."
    )


@span("epsilon-audit-readme")
def epsilon_audit_readme(results: Results) -> str:
    """The README's line on the epsilon audit."""
    dp = _audit_rows(results, "dpsgd", "noise_multiplier")
    row = dp[dp["_x"] == 1.0].iloc[0]
    none = one(results.csv(f"{AUDIT_RUN}/epsilon_audit.csv"), defense="none")
    return (
        f"DP-SGD at noise multiplier 1 measures at least {row['epsilon_audit']:.2f} against its "
        f"accountant's {row['epsilon_update']:.2f}, and no defense but DP-SGD and strong "
        f"Gaussian noise stays below the {none['epsilon_audit']:.2f} that "
        f"{count(int(row['rounds']))} rounds show without one"
    )


# ---------------------------------------------------------------------------------------------
# Checking and rewriting the pages

# A page's path -> its text.
Documents = dict[Path, str]


def documents() -> list[Path]:
    """The pages that may hold generated passages: README.md, then the documentation pages."""
    return [README, *sorted(DOCS.glob("*.md"))]


def read_documents() -> Documents:
    return {path: path.read_text(encoding="utf-8") for path in documents()}


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def passages_in(text: str) -> dict[str, str]:
    """The generated passages of one page by name (their text between the markers)."""
    found: dict[str, str] = {}
    for match in PASSAGE.finditer(text):
        name = match.group(1)
        if name in found:
            raise ReadmeError(f"the passage {name} appears twice")
        found[name] = match.group(2)
    if text.count(OPEN) != len(found) or text.count(CLOSE) != len(found):
        raise ReadmeError("a generated passage's markers do not pair up")
    return found


def passages_of(docs: Documents) -> dict[str, tuple[Path, str]]:
    """Every page's passages by name, with the page that holds each; a name on two pages is
    refused."""
    found: dict[str, tuple[Path, str]] = {}
    for path, text in docs.items():
        try:
            here = passages_in(text)
        except ReadmeError as err:
            raise ReadmeError(f"{_name(path)}: {err}") from None
        for name, body in here.items():
            if name in found:
                raise ReadmeError(
                    f"the passage {name} is in both {_name(found[name][0])} and {_name(path)}"
                )
            found[name] = (path, body)
    return found


def misplaced(text: str) -> dict[str, str]:
    """Passages of `text` whose markers sit where Markdown would render them wrongly, by name: a
    span whose opening comment starts a line (the comment would open an HTML block, leaving the
    rest of the line unrendered) or a block whose markers do not stand on lines of their own."""
    problems = {}
    for match in PASSAGE.finditer(text):
        passage = PASSAGES.get(match.group(1))
        if passage is None:
            continue
        before = text[text.rfind("\n", 0, match.start()) + 1 : match.start()]
        opens_line = not before.strip()
        if passage.block:
            body, after = match.group(2), text[match.end() : match.end() + 1]
            if not (opens_line and body.startswith("\n") and body.endswith("\n")) or after not in (
                "",
                "\n",
            ):
                problems[passage.name] = "a block's markers must stand on lines of their own"
        elif opens_line:
            problems[passage.name] = "a span must not start a line"
    return problems


def _render(passage: Passage, results: Results) -> str:
    try:
        return passage.text(results)
    except ReadmeError as err:
        raise type(err)(f"{passage.name}: {err}") from err


def stale(docs: Documents, results: Results | None = None) -> dict[str, str]:
    """What is wrong with each passage of the pages ``docs`` that is not what the committed
    results give, by passage name; empty when all agree."""
    results = results or Results()
    found = passages_of(docs)
    problems = {
        name: f"marked in {_name(path)}, but benchmarks/readme_numbers.py has no such passage"
        for name, (path, _) in found.items()
        if name not in PASSAGES
    }
    for text in docs.values():
        problems.update(misplaced(text))
    for name, passage in PASSAGES.items():
        if name not in found:
            problems[name] = "missing from README.md and docs/"
            continue
        if name in problems:
            continue
        path, body = found[name]
        try:
            expected = passage.text(results)
        except StaleClaim as err:
            problems[name] = f"its wording no longer holds: {err}"
            continue
        except ReadmeError as err:
            problems[name] = f"cannot be rendered from results/: {err}"
            continue
        if body != expected:
            diff = difflib.unified_diff(
                body.splitlines(), expected.splitlines(), _name(path), "results", lineterm=""
            )
            problems[name] = "differs from the committed results:\n" + "\n".join(diff)
    return problems


def rewrite(docs: Documents, results: Results | None = None) -> tuple[Documents, list[str]]:
    """The pages with every passage rendered anew, and the names of those that changed."""
    results = results or Results()
    found = passages_of(docs)
    unknown = sorted(found.keys() - PASSAGES.keys())
    missing = sorted(PASSAGES.keys() - found.keys())
    if unknown or missing:
        raise ReadmeError(f"passages unknown {unknown}, missing {missing}")
    for text in docs.values():
        for name, problem in misplaced(text).items():
            raise ReadmeError(f"{name}: {problem}")
    rendered = {name: _render(passage, results) for name, passage in PASSAGES.items()}
    updated = {
        path: PASSAGE.sub(lambda m: f"{OPEN}{m.group(1)} -->{rendered[m.group(1)]}{CLOSE}", text)
        for path, text in docs.items()
    }
    return updated, [name for name in PASSAGES if found[name][1] != rendered[name]]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--check", action="store_true", help="compare only; exit 1 naming each passage that differs"
    )
    args = parser.parse_args(argv)
    docs = read_documents()
    try:
        if args.check:
            problems = stale(docs)
            for name, problem in problems.items():
                print(f"{name}: {problem}")
            if not problems:
                print(f"all {len(PASSAGES)} generated passages match results/")
            return 1 if problems else 0
        updated, changed = rewrite(docs)
    except ReadmeError as err:
        print(f"readme_numbers: {err}", file=sys.stderr)
        return 1
    for path, text in updated.items():
        if text != docs[path]:
            path.write_text(text, encoding="utf-8")
    print(f"rewrote {', '.join(changed)}" if changed else "unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
