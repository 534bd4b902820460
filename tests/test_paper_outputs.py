"""Figures, tables and the report, built from one small real run and checked through their
content: matplotlib's objects, the LaTeX and markdown text against the CSV, the parsed HTML."""

from __future__ import annotations

import base64
import html.parser
import io
import json
import math
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from leakbench.cli import main
from leakbench.components import lpips_weights
from leakbench.datasets import load_dataset
from leakbench.outputs.arrays import load_cell, to_uint8
from leakbench.outputs.figures import (
    GRID_KEY,
    clipped_errors,
    convergence,
    image_flags,
    leakage,
    leakage_metrics,
    load_run,
    point_labels,
    privacy_utility,
    reconstruction_grid,
    strength_panels,
    write_figures,
)
from leakbench.outputs.paper_tables import COLUMNS, best_rows, format_table, load_leaderboard
from leakbench.outputs.plotting import FigureSkipped, log_axis, strength
from leakbench.outputs.report import write_report
from leakbench.outputs.summary import PRINT_WIDTH, headline_rows, headline_table, verdict_cell
from leakbench.run.config import parse_config
from leakbench.run.judge import BUDGET_FACTOR
from leakbench.run.runner import run_benchmark

# adaptive = false: the figures' tests count the configured attacks' curves and cells
# (tests/test_verdicts.py covers the adaptive attacks the planner adds).
CONFIG = """
name = "outputs"
dataset = "digits"
suite = "listed"
images = 4
seeds = [0]
adaptive = false

[[attack]]
name = "idlg"
iterations = 40

[[attack]]
name = "dlg"
iterations = 30

[[defense]]
name = "none"

[[defense]]
name = "gaussian"
sigma = [0.001, 0.1]

[[defense]]
name = "prune"
ratio = 0.5

[training]
epochs = 1
seeds = 2
learning_rates = [1e-3, 1e-2]
"""

RESULTS = Path(__file__).resolve().parents[1] / "results"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("run") / "outputs"
    run_benchmark(parse_config(CONFIG), out, progress=False)
    return out


@pytest.fixture(scope="module")
def run(run_dir):
    return load_run(run_dir)


def test_arrays_are_the_scored_images(run_dir, run) -> None:
    # Each cell file lines up with trials.csv: the private images of the test split, and
    # reconstructions whose 8-bit PSNR agrees with the stored full-precision PSNR.
    test = load_dataset("digits").test
    for _, row in run.leaderboard.iterrows():
        arrays = load_cell(run_dir, row)
        trials = run.cell_trials(row)
        assert arrays is not None
        np.testing.assert_array_equal(arrays.image_index, trials["image_index"])
        np.testing.assert_array_equal(arrays.original, to_uint8(test.x[arrays.image_index]))
        for recon, orig, psnr in zip(
            arrays.reconstruction, arrays.original, trials["psnr"], strict=True
        ):
            mse = np.mean((recon / 255.0 - orig / 255.0) ** 2)
            if psnr < 35:  # beyond that the 8-bit rounding of both images dominates
                assert 10 * math.log10(1 / max(mse, 1e-10)) == pytest.approx(psnr, abs=1.0)
        assert arrays.loss.shape[0] == trials[["seed", "batch_index"]].drop_duplicates().shape[0]


def test_privacy_utility_figure(run) -> None:
    fig = privacy_utility(run)
    (ax,) = fig.axes
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert sorted(legend) == sorted(["none", "gaussian", "prune", "Pareto front"])
    assert "images leaked" in ax.get_xlabel() and ax.get_ylabel() == "test accuracy"
    # One error-bar line per family; the gaussian line joins its two strengths.
    assert len(ax.containers) == 3
    heads = run.heads()
    gaussian = next(c for c in ax.containers if c.get_label() == "gaussian")
    x, y = gaussian.lines[0].get_data()
    expected = heads[heads["defense"] == "gaussian"]
    np.testing.assert_allclose(np.asarray(x, float), 100 * expected["leaked_rate"])
    np.testing.assert_allclose(np.asarray(y, float), expected["test_accuracy"])
    front = next(line for line in ax.lines if line.get_label() == "Pareto front")
    assert len(front.get_xdata()) == int(heads["pareto"].sum()) >= 1
    # The accuracy's error bars: the 95% interval over the two training seeds, cut at 0 and 1.
    _, _, (_, ybars) = gaussian.lines
    ends = np.array([[seg[0][1], seg[1][1]] for seg in ybars.get_segments()])
    accuracy, half = expected["test_accuracy"].to_numpy(), expected["test_accuracy_ci95"]
    assert half.notna().all()
    np.testing.assert_allclose(ends[:, 0], np.maximum(accuracy - half, 0.0))
    np.testing.assert_allclose(ends[:, 1], np.minimum(accuracy + half, 1.0))


def _with_clients(run_dir, folder, clients: int, shift: float):
    """A copy of ``run_dir`` as if run with ``clients`` clients, its PSNRs lowered by ``shift``."""
    shutil.copytree(run_dir, folder)
    config = folder / "config.toml"
    config.write_text(config.read_text().replace("clients = 1\n", f"clients = {clients}\n"))
    board = pd.read_csv(folder / "leaderboard.csv")
    board["psnr_mean"] -= shift
    board.to_csv(folder / "leaderboard.csv", index=False)
    return folder


def test_secure_aggregation_is_a_family_with_clients_as_its_strength(run_dir, tmp_path) -> None:
    others = [_with_clients(run_dir, tmp_path / f"k{k}", k, shift) for k, shift in ((2, 5.0),
              (4, 9.0))]  # fmt: skip
    run = load_run(run_dir, others)
    assert (run.clients, [o.clients for o in run.others]) == (1, [2, 4])
    panels = {p.label: p for p in strength_panels(run.strength_board())}
    assert list(panels) == [
        "gaussian: sigma",
        "gaussian, 2 clients: sigma",
        "gaussian, 4 clients: sigma",
        "secure aggregation: clients",
        "defense",
    ]
    aggregated = panels["secure aggregation: clients"].rows
    assert set(aggregated["defense"]) == {"none"}
    board = run.leaderboard
    none = board[(board["defense"] == "none") & (board["attack"] == "idlg")]["psnr_mean"].item()
    idlg = aggregated[aggregated["attack"] == "idlg"].sort_values("x")
    assert list(idlg["x"]) == [1.0, 2.0, 4.0]
    np.testing.assert_allclose(idlg["psnr_mean"], [none, none - 5.0, none - 9.0])
    # Prune (one configuration) under 1, 2 and 4 clients: three ticks of the shared panel.
    ticks = panels["defense"].ticks
    assert list(ticks.values()) == ["prune ratio=0.5", "prune ratio=0.5, 2 clients",
                                    "prune ratio=0.5, 4 clients"]  # fmt: skip
    fig = leakage(run)
    axes = np.asarray(fig.axes).reshape(len(panels), -1)
    assert [ax.get_xlabel() for ax in axes[:, 0]] == list(panels)
    # Alone, the run has no aggregation family; a run of K > 1 clients has one of one point.
    assert "secure aggregation: clients" not in [p.label for p in strength_panels(board)]
    alone = strength_panels(load_run(others[1]).strength_board())
    assert [p.label for p in alone] == [
        "gaussian, 4 clients: sigma", "secure aggregation: clients", "defense",
    ]  # fmt: skip
    # The CLI passes --with on: five rows of panels instead of two make a taller figure.
    heights = {}
    for name, extra in (("alone", []), ("with", ["--with", *map(str, others)])):
        assert main(["figures", str(run_dir), "--out", str(tmp_path / name), *extra]) == 0
        with Image.open(tmp_path / name / "leakage.png") as png:
            heights[name] = png.size[1]
    assert heights["with"] > 2 * heights["alone"]
    assert main(["figures", str(run_dir), "--with", str(tmp_path / "missing")]) == 2
    # The report's leakage figure takes the same --with.
    for name, extra in (("alone", []), ("with", ["--with", *map(str, others)])):
        page = tmp_path / f"{name}.html"
        assert main(["report", str(run_dir), "--out", str(page), *extra]) == 0
        data = page.read_text(encoding="utf-8").split('<figure id="leakage">')[1]
        data = data.split('src="data:image/png;base64,')[1].split('"')[0]
        with Image.open(io.BytesIO(base64.b64decode(data))) as png:
            heights[f"report {name}"] = png.size[1]
    assert heights["report with"] > 2 * heights["report alone"]


def test_reconstruction_grid(run) -> None:
    fig = reconstruction_grid(run, images=3)
    heads = run.heads()
    assert len(fig.axes) == 3 * (len(heads) + 1)
    titles = [ax.get_title() for ax in fig.axes[3:]]
    first = heads.iloc[0]
    shown = run.cell_trials(first).iloc[:3]
    # Each image: its PSNR, and its flags where it leaked (R recovered, I identified, V
    # recognisable), e.g. "100 RIV"; "4.3 dB" where it did not.
    expected = []
    for _, row in shown.iterrows():
        flags = ("R" if row["mse"] <= 1e-3 else "") + ("I" if row["identified"] == 1 else "")
        flags += "V" if row["recognisable"] == 1 else ""
        if flags and row["leaked"] != 1:
            flags = f"({flags})"
        expected.append(f"{row['psnr']:.0f} {flags}" if flags else f"{row['psnr']:.1f} dB")
    assert titles[:3] == expected
    # The first row shows the private images themselves.
    test = load_dataset("digits").test
    indices = run.cell_trials(first)["image_index"].to_numpy()[:3]
    for ax, index in zip(fig.axes[:3], indices, strict=True):
        shown = np.asarray(ax.images[0].get_array())
        np.testing.assert_array_equal(shown, to_uint8(test.x[index])[..., 0])


def test_convergence_figure(run) -> None:
    fig = convergence(run)
    panels = [ax for ax in fig.axes if ax.axison]
    # Small multiples: a panel per (attack, family), the undefended line in each.
    assert [ax.get_title() for ax in panels] == [
        "gaussian | idlg iterations=40",
        "prune | idlg iterations=40",
        "gaussian | dlg iterations=30",
        "prune | dlg iterations=30",
    ]
    for ax in panels:
        assert ax.get_yscale() == "log" and ax.get_xlabel() == "iteration"
        # A trial the judge reran (`leakbench.run.judge`) may show its doubled budget.
        assert all(len(line.get_xdata()) <= 40 * BUDGET_FACTOR for line in ax.get_lines())
        for line in ax.get_lines():  # a dot where the cell's last trial stopped
            assert list(line.get_markevery()) == [len(line.get_xdata()) - 1]
    labels = [t.get_text() for t in panels[0].get_legend().get_texts()]
    assert labels == ["gaussian sigma=0.001", "gaussian sigma=0.1", "none"]
    assert [t.get_text() for t in panels[1].get_legend().get_texts()] == ["prune ratio=0.5", "none"]


def test_leakage_figure(run) -> None:
    fig = leakage(run)
    # LPIPS is a fourth column where the run scored it (the weights were installed).
    scored = bool(run.leaderboard["lpips_mean"].notna().any())
    assert scored == lpips_weights.available("alex")
    axes = np.asarray(fig.axes).reshape(2, -1)
    assert axes.shape == (2, 3 + scored)  # gaussian (swept), one row for single settings
    assert [ax.get_ylabel() for ax in axes[0]] == ["PSNR (dB)", "SSIM", "label accuracy"] + (
        ["LPIPS"] if scored else []
    )
    assert axes[0, 0].get_xlabel() == "gaussian: sigma" and axes[0, 0].get_xscale() == "log"
    assert axes[1, 0].get_xlabel() == "defense"
    for ax in axes.ravel():
        assert len(ax.containers) == 2  # one per attack
    board = run.leaderboard
    idlg = next(c for c in axes[0, 0].containers if c.get_label() == "idlg iterations=40")
    x, y = idlg.lines[0].get_data()
    rows = board[(board["attack"] == "idlg") & (board["defense"] == "gaussian")]
    np.testing.assert_allclose(np.asarray(x, float), [0.001, 0.1])
    np.testing.assert_allclose(np.asarray(y, float), rows["psnr_mean"])
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "no defense (strongest attack)" in legend and "dlg iterations=30" in legend


def test_the_leakage_figure_has_an_lpips_column_only_where_it_was_scored() -> None:
    board = pd.DataFrame({"lpips_mean": [float("nan"), float("nan")]})
    assert [m[0] for m in leakage_metrics(board)] == ["psnr_mean", "ssim_mean", "label_acc"]
    board["lpips_mean"] = [0.2, float("nan")]
    assert [m[2] for m in leakage_metrics(board)][-1] == "LPIPS"
    # LPIPS has no upper end; its bars stop at 0 below.
    bars = clipped_errors(pd.Series([0.05, 0.5]), pd.Series([0.1, 0.1]), "lpips_mean")
    np.testing.assert_allclose(bars, [[0.05, 0.1], [0.1, 0.1]])


def test_strength_picks_the_swept_parameter() -> None:
    params = pd.Series(['{"clip":1.0,"sigma":0.1}', '{"clip":1.0,"sigma":0.2}'])
    assert strength(params) == ("sigma", [0.1, 0.2])
    assert strength(pd.Series(['{"ratio":0.5}'])) == ("configuration", None)


def test_written_figures_are_vector_pdfs_and_pngs(run_dir, tmp_path) -> None:
    written, skipped = write_figures(run_dir, tmp_path / "figs")
    assert skipped == {}
    assert sorted(p.name for p in written) == sorted(
        f"{n}.{f}"
        for n in ("privacy_utility", "reconstructions", "convergence", "leakage")
        for f in ("pdf", "png")
    )
    pdf = (tmp_path / "figs" / "privacy_utility.pdf").read_bytes()
    assert b"/FontFile2" in pdf  # TrueType embedded: the text stays text
    assert b"CreationDate" not in pdf
    with Image.open(tmp_path / "figs" / "leakage.png") as png:
        assert png.size[0] > 1000  # 300 dpi at two columns
    assert not list((tmp_path / "figs").glob(".*"))  # no temporary files left


def test_figures_without_training_or_arrays_are_skipped(run_dir, tmp_path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    shutil.rmtree(copy / "arrays")
    board = pd.read_csv(copy / "leaderboard.csv")
    board["test_accuracy"] = np.nan
    board.to_csv(copy / "leaderboard.csv", index=False)
    written, skipped = write_figures(copy)
    assert set(skipped) == {"privacy_utility", "reconstructions", "convergence"}
    assert "training" in skipped["privacy_utility"] and "arrays" in skipped["convergence"]
    assert {p.stem for p in written} == {"leakage"}
    with pytest.raises(FigureSkipped):
        reconstruction_grid(load_run(copy))


def _latex_rows(text: str) -> list[list[str]]:
    body = text.split("\\midrule\n", 1)[1].split("\\bottomrule", 1)[0]
    return [line.removesuffix(" \\\\").split(" & ") for line in body.strip().splitlines()]


def test_latex_table_structure(run_dir) -> None:
    board = load_leaderboard(run_dir)
    text = format_table(board, "latex")
    lines = text.splitlines()
    assert lines[0].startswith("\\begin{tabular}{ll") and lines[-1] == "\\end{tabular}"
    assert [text.count(r) for r in ("\\toprule", "\\midrule", "\\bottomrule")] == [1, 1, 1]
    assert lines.index("\\toprule") < lines.index("\\midrule") < lines.index("\\bottomrule")
    rows = _latex_rows(text)
    assert len(rows) == len(board)
    assert all(len(r) == len(COLUMNS) for r in rows)
    psnr = [c.header for c in COLUMNS].index("PSNR (dB)")
    bold = [i for i, r in enumerate(rows) if r[psnr].startswith("\\textbf{")]
    assert bold == sorted(best_rows(board, COLUMNS[psnr]))
    assert board["psnr_mean"].iloc[bold[0]] == board["psnr_mean"].min()
    assert "_" not in text.replace("\\_", "")  # escaped (noise_multiplier, ...)


def test_markdown_table_matches_the_csv(run_dir) -> None:
    board = pd.read_csv(run_dir / "leaderboard.csv")
    lines = format_table(board, "markdown").splitlines()
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    assert header == [c.header for c in COLUMNS]
    rows = [[c.strip().strip("*") for c in line.strip("|").split("|")] for line in lines[2:]]
    assert len(rows) == len(board)
    for cells, (_, row) in zip(rows, board.iterrows(), strict=True):
        shown = dict(zip(header, cells, strict=True))
        assert shown["Defense"].split()[0] == row["defense"]
        assert shown["n"] == str(row["n"])
        assert shown["PSNR (dB)"] == f"{row['psnr_mean']:.1f} ± {row['psnr_ci95']:.1f}"
        assert shown["Success"] == f"{row['success_rate']:.2f}"
        accuracy = f"{row['test_accuracy']:.3f} ± {row['test_accuracy_ci95']:.3f}"
        assert shown["Test acc."] == accuracy  # mean and 95% CI over the 2 training seeds
        assert shown["Rank"] == ("–" if pd.isna(row["rank"]) else str(int(row["rank"])))
    assert format_table(board, "csv") == board.to_csv(index=False)


class _Page(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.rows = 0
        self.in_leaderboard = False
        self.text: list[str] = []
        self.tables: list[str] = []  # each table's class, in page order
        self.headline: list[list[str]] = []  # the cells of the headline table's rows
        self.in_headline = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attrs_d = dict(attrs)
        if tag == "img":
            self.images.append(attrs_d.get("src") or "")
        if tag == "table":
            self.tables.append(attrs_d.get("class") or "")
            self.in_leaderboard = attrs_d.get("class") == "leaderboard"
            self.in_headline = attrs_d.get("class") == "headline"
        if tag == "tr" and self.in_leaderboard:
            self.rows += 1
        if tag == "tr" and self.in_headline:
            self.headline.append([])

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self.in_leaderboard = self.in_headline = False

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self.in_headline and self.headline:
            self.headline[-1].append(data)


def test_the_report_leads_with_the_printed_table(tmp_path) -> None:
    # The report's first table is the one `leakbench run` prints: a row per defense
    # configuration in its order, each verdict on its row, every label in full.
    board = pd.read_csv(RESULTS / "default" / "leaderboard.csv")
    header, rows, _ = headline_rows(board)
    run = tmp_path / "default"
    shutil.copytree(RESULTS / "default", run, ignore=shutil.ignore_patterns("store.sqlite"))
    page = _Page()
    page.feed(write_report(run, tmp_path / "report.html").read_text(encoding="utf-8"))
    assert page.tables[0] == "headline" and page.tables.index("leaderboard") > 0
    assert page.headline == [header, *rows]
    assert not any("~" in cell for row in rows for cell in row)


def test_report_is_self_contained(run_dir, tmp_path) -> None:
    path = write_report(run_dir, tmp_path / "report.html")
    page = _Page()
    page.feed(path.read_text(encoding="utf-8"))
    assert len(page.images) == 4
    for src in page.images:
        assert src.startswith("data:image/png;base64,")
        with Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))) as image:
            assert image.format == "PNG" and image.size[0] > 300
    assert page.rows == 1 + len(load_leaderboard(run_dir))  # header + one per row
    text = "".join(page.text)
    assert 'name = "outputs"' in text  # the config
    environment = json.loads((run_dir / "environment.json").read_text())
    assert environment["tensorflow"] in text and "this report" in text
    assert "http://" not in path.read_text() and "https://" not in path.read_text()
    found = [shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")]
    browser = next((b for b in found if b), None)
    if browser is not None:  # also open it in a real browser where one is installed
        dom = subprocess.run(
            [browser, "--headless", "--no-sandbox", "--dump-dom", path.as_uri()],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        assert "leakbench report: outputs" in dom


def test_cli_commands(run_dir, tmp_path, capsys) -> None:
    assert main(["table", str(run_dir), "--format", "latex"]) == 0
    assert capsys.readouterr().out.startswith("\\begin{tabular}")
    assert main(["table", str(run_dir), "--out", str(tmp_path / "t.md")]) == 0
    assert (tmp_path / "t.md").read_text().startswith("| Defense |")
    assert capsys.readouterr().out == f"wrote {tmp_path / 't.md'}\n"
    assert main(["figures", str(run_dir), "--out", str(tmp_path / "f")]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 8
    assert main(["report", str(run_dir), "--out", str(tmp_path / "r.html")]) == 0
    assert (tmp_path / "r.html").is_file()
    for command in (["table"], ["figures"], ["report"]):
        assert main([*command, str(tmp_path / "missing")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "leaderboard.csv" in err[0]
    assert not (tmp_path / "missing").exists()


def test_printed_leaderboard_is_one_headline_row_per_defense_within_100_columns() -> None:
    board = pd.read_csv(RESULTS / "default" / "leaderboard.csv")
    lines = headline_table(board).splitlines()
    heads = board[board["strongest"]]
    # A row's first line holds its verdict; a long label continues on indented lines.
    table = [line for line in lines[1:] if not line.startswith(" ")]
    rows = table[: len(heads)]
    assert lines[0].split()[:2] == ["verdict", "rank"]
    assert max(len(line) for line in lines) <= PRINT_WIDTH
    # Every row leads with its verdict, then its rank; ranked ones first, in order.
    assert [line.split()[0] for line in rows] == [
        verdict_cell(heads.set_index(["defense", "defense_params"]).loc[key, "verdict"]).split()[0]
        for key in heads.assign(_o=heads["rank"].fillna(np.inf))
        .sort_values("_o", kind="mergesort")[["defense", "defense_params"]]
        .itertuples(index=False, name=None)
    ]
    ranks = [line.split()[1] for line in rows]
    ranked = [int(r) for r in ranks if r != "-"]
    # Ranked in order from 1; a tie (protocol 2: intervals that overlap) repeats a rank and the
    # next row takes its position.
    assert ranked == sorted(ranked) and ranked[0] == 1
    assert all(ranked[k] in (ranked[k - 1], k + 1) for k in range(1, len(ranked)))
    assert ranks[len(ranked) :] == ["-"] * (len(ranks) - len(ranked))  # unranked last
    # The top line is the top-ranked configuration's strongest attack, with its numbers.
    top = heads[heads["rank"] == 1].iloc[0]
    assert (
        rows[0]
        .rstrip()
        .endswith(f"{100 * top['test_accuracy']:.1f}+-{100 * top['test_accuracy_ci95']:.1f}")
    )
    assert f"{round(top['leaked_rate'] * top['n'])}/{top['n']}" in rows[0]
    # Below the table: a line per verdict that occurs, naming its defenses.
    for name in heads["verdict"].unique():
        assert any(line.startswith(f"{name}: ") for line in table[len(heads) :])
    # Two (dataset, model) pairs: each pair's rows follow a line naming it, within the width.
    other = board.assign(model="a-much-longer-model-name")
    both = headline_table(pd.concat([board, other], ignore_index=True)).splitlines()
    assert max(len(line) for line in both) <= PRINT_WIDTH
    assert both[0].startswith("verdict")
    assert both.index("digits/lenet") > both.index("digits/a-much-longer-model-name") == 1
    assert not any("~" in line for line in both)


def test_error_bars_stop_at_the_ends_of_each_metrics_range() -> None:
    values = pd.Series([100.0, 99.0, 40.0, 1.0])
    bars = clipped_errors(values, pd.Series([8.9, 8.9, 8.9, np.nan]), "psnr_mean")
    np.testing.assert_allclose(bars[0], [8.9, 8.9, 8.9, 0.0])  # below
    np.testing.assert_allclose(bars[1], [0.0, 1.0, 8.9, 0.0])  # above: never past 100 dB
    ssim = clipped_errors(pd.Series([0.794, -0.9]), pd.Series([0.246, 0.3]), "ssim_mean")
    np.testing.assert_allclose(ssim, [[0.246, 0.1], [0.206, 0.3]])
    assert (values + bars[1] <= 100).all() and (values - bars[0] >= 0).all()


def test_one_axis_rule_for_every_sweep() -> None:
    assert log_axis(pd.Series([1e-3, 1e-2]))  # two values a decade apart: log, like three
    assert log_axis(pd.Series([1e-3, 1e-2, 1e-1]))
    assert log_axis(pd.Series([0.1, 1.0]))
    assert not log_axis(pd.Series([0.2, 0.5, 0.9]))
    assert not log_axis(pd.Series([0.0, 1.0]))  # zero: no log axis


def test_the_grid_says_when_it_shows_a_subset(tmp_path: Path) -> None:
    run = load_run(RESULTS / "default")
    shown = reconstruction_grid(run, images=6)
    assert "the first 6 of 36 images" in [t.get_text() for t in shown.texts]
    everything = reconstruction_grid(run, images=36)
    assert [t.get_text() for t in everything.texts] == [GRID_KEY]  # the key of the titles only


def test_privacy_utility_points_are_labelled_with_their_strength() -> None:
    heads = load_run(RESULTS / "default").heads()
    gaussian = heads[heads["defense"] == "gaussian"]
    labels = point_labels(gaussian)
    assert [t for _, _, t in labels] == ["0.001", "0.01", "0.1"]
    assert [x for x, _, _ in labels] == pytest.approx((100 * gaussian["leaked_rate"]).tolist())
    assert point_labels(heads[heads["defense"] == "none"]) == []  # one point: the legend names it
    fig = privacy_utility(load_run(RESULTS / "default"))
    texts = {t.get_text() for t in fig.axes[0].texts}
    assert {"0.001", "0.1", "0.9", "0.5", "0.2"} <= texts


def _grid_row(cell: str, column: str, value: str):
    """A board cell's run, its 6-image reconstruction grid, the grid row (1-based, below the
    originals) of the first configuration whose ``column`` is ``value``, and that row's first
    6 trials."""
    run = load_run(RESULTS / "board" / cell)
    fig = reconstruction_grid(run, images=6)
    heads = run.heads().reset_index(drop=True)
    row = int(heads.index[heads[column] == value][0]) + 1
    return run, fig, row, run.cell_trials(heads.iloc[row - 1]).iloc[:6]


def test_the_grid_frames_only_what_the_verdict_counts() -> None:
    # An identification that its cell's hits do not lift above chance is flagged and not
    # counted: on the board's engine-8 trained CIFAR-10 cell, ig (match=kept) picked image 68
    # out of 1,000 under pruning 90%, beside a "holds". The grid used to title it "17 I" in
    # red and frame it; it now brackets the flag, in black, without a frame. Here the third
    # image of the MNIST trained cell's Gaussian row is given such a flag by hand.
    run = load_run(RESULTS / "board" / "mnist-lenet-trained")
    heads = run.heads().reset_index(drop=True)
    row = int(heads.index[heads["defense"] == "gaussian"][0]) + 1
    trials = run.cell_trials(heads.iloc[row - 1]).iloc[:6]
    assert (trials["leaked"] == 0).all() and (trials["identified"] == 0).all()
    run.trials.loc[trials.index[2], ["identified", "leaked"]] = [1.0, 0.0]
    fig = reconstruction_grid(run, images=6)
    third = fig.axes[row * 6 + 2]
    assert third.get_title().endswith(" (I)")
    assert third.title.get_color() == "black"
    assert not any(spine.get_visible() for spine in third.spines.values())
    assert not fig.axes[row * 6 + 1].get_title().endswith(")")  # its neighbour has no flag
    # The undefended row's leaks are still red and framed.
    base = int(heads.index[heads["defense"] == "none"][0]) + 1
    counted = run.cell_trials(heads.iloc[base - 1]).iloc[:6]["leaked"].to_numpy() == 1
    assert counted.any()
    for i, leaked in enumerate(counted):
        ax = fig.axes[base * 6 + i]
        assert (ax.title.get_color() == "#b2182b") == leaked == ax.spines["top"].get_visible()


def test_the_grid_marks_a_leak_found_by_another_reconstruction_of_the_batch() -> None:
    # The board's MixUp cell attacks batches of 4. Under MixUp mixing 2 examples, the batch
    # matching (`leakbench.run.identification`) counts image 68 of the first batch as leaked by
    # another reconstruction of its batch; the reconstruction in its own place scores 17.0 dB
    # and no flag. The grid framed it in red with a title that said nothing but "17.0 dB"; it
    # now says "17 M".
    run, fig, row, trials = _grid_row(
        "mnist-lenet-mixup", "defense_params", '{"alpha":1.0,"mixed":2}'
    )
    third = fig.axes[row * 6 + 2]
    assert trials.iloc[2]["image_index"] == 68 and trials.iloc[2]["leaked"] == 1
    assert image_flags(trials.iloc[2], run.success_mse) == ""  # nothing of its own
    assert third.get_title() == "17 M"
    assert third.title.get_color() == "#b2182b" and third.spines["top"].get_visible()
    # An image that leaks on its own keeps its own flags.
    second = fig.axes[row * 6 + 1]
    assert image_flags(trials.iloc[1], run.success_mse) == "IV"
    assert second.get_title() == "24 IV"
