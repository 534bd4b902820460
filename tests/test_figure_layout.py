"""The figures' layout, measured with matplotlib's renderer: no two texts drawn (titles, axis
and tick labels, legend entries, point labels) overlap, and no legend covers a text that is not
its own. Drawn from committed runs (real data): the default run (24 convergence panels, every
defense family, the shared panel of one-configuration defenses) and the leakage over training
of digits-lenet."""

from __future__ import annotations

import itertools
from pathlib import Path

import pandas as pd
import pytest
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.legend import Legend
from matplotlib.text import Annotation, Text
from matplotlib.transforms import Bbox

from leakbench.outputs.figures import convergence, leakage, load_run, privacy_utility
from leakbench.outputs.plotting import paper_style, renderer_of
from leakbench.run.checkpoints import leakage_over_training

RESULTS = Path(__file__).resolve().parents[1] / "results"


def drawn_texts(fig: Figure, monkeypatch: pytest.MonkeyPatch) -> list[tuple[Text, Bbox]]:
    """Every text the renderer actually draws (visible, non-empty, its axis on and its tick in
    view), with its own box: an annotation's text without its leader line."""
    renderer = renderer_of(fig)
    seen: list[Text] = []
    draw = Text.draw

    def recording(self: Text, r) -> None:  # type: ignore[no-untyped-def]
        if self.get_visible() and self.get_text().strip():
            seen.append(self)
        draw(self, r)

    with monkeypatch.context() as patch:
        patch.setattr(Text, "draw", recording)
        fig.canvas.draw()
    boxes = []
    for text in dict.fromkeys(seen):
        box = Text.get_window_extent(text, renderer)
        if box.width > 0 and box.height > 0:
            boxes.append((text, box))
    return boxes


def _legends(fig: Figure) -> list[Legend]:
    found = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    return [*found, *fig.legends]


def _meet(a: Bbox, b: Bbox, slack: float = 0.5) -> bool:
    """Whether two boxes share more than a hair (``slack`` pixels) in both directions."""
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w > slack and h > slack


def collisions(fig: Figure, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The pairs of drawn texts that overlap, and the texts a legend covers that are not its
    own, in words."""
    texts = drawn_texts(fig, monkeypatch)
    found = [
        f"{a.get_text()!r} overlaps {b.get_text()!r}"
        for (a, box_a), (b, box_b) in itertools.combinations(texts, 2)
        if _meet(box_a, box_b)
    ]
    renderer = renderer_of(fig)
    for legend in _legends(fig):
        own = set(legend.get_texts())
        frame = legend.get_window_extent(renderer)
        found += [
            f"the legend covers {text.get_text()!r}"
            for text, box in texts
            if text not in own and _meet(frame, box)
        ]
    return found


@pytest.fixture(scope="module")
def default_run():  # type: ignore[no-untyped-def]
    return load_run(RESULTS / "default")


@pytest.fixture(scope="module")
def cifar10_run():  # type: ignore[no-untyped-def]
    # Long attack labels (iterations=6000 line_search=none) and losses within one decade.
    return load_run(RESULTS / "cifar10")


@pytest.mark.parametrize("draw", [privacy_utility, convergence, leakage])
@pytest.mark.parametrize("name", ["default_run", "cifar10_run"])
def test_a_run_s_figures_have_no_overlapping_text(draw, name, request, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    with paper_style():
        fig = draw(request.getfixturevalue(name))
        assert collisions(fig, monkeypatch) == []


def test_every_loss_panel_labels_two_decades_or_more(cifar10_run, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # A loss that moves within one decade still gets labelled ticks (whole decades), and the
    # labels of minor ticks (6e-1, 4e-1, ...) are never drawn.
    with paper_style():
        fig = convergence(cifar10_run)
        drawn = {id(t) for t, _ in drawn_texts(fig, monkeypatch)}
        for ax in fig.axes:
            if not ax.axison:
                continue
            labels = [t for t in ax.get_yticklabels() if id(t) in drawn]
            assert len(labels) >= 2
            assert all(t.get_text().startswith("$\\mathdefault{10^") for t in labels)


def test_the_privacy_utility_strengths_are_all_labelled_apart(default_run, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # Several strengths of a family sit at 100% leaked: each keeps its own label, inside the
    # axes, each label exactly once.
    with paper_style():
        fig = privacy_utility(default_run)
        (ax,) = fig.axes
        notes = [t for t in ax.texts if isinstance(t, Annotation)]
        renderer = renderer_of(fig)
        fig.canvas.draw()  # the annotations at their drawn places
        frame = ax.get_window_extent(renderer)
        for note in notes:
            box = Text.get_window_extent(note, renderer)
            assert frame.x0 <= box.x0 and box.x1 <= frame.x1
            assert frame.y0 <= box.y0 and box.y1 <= frame.y1
    heads = default_run.heads()
    swept = heads.groupby("defense")["defense_params"].nunique()
    expected = int(swept[swept > 1].sum())
    assert len(notes) == expected > 5


def test_a_crowded_privacy_utility_figure_keeps_its_labels_off_the_error_bars(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The MNIST board cell: 22 settings, a dozen at 100% leaked with their error bars on one
    # vertical; no label sits on a bar (beyond a hair) or on another text.
    run = load_run(RESULTS / "board" / "mnist-lenet-init")
    with paper_style():
        fig = privacy_utility(run)
        (ax,) = fig.axes
        assert collisions(fig, monkeypatch) == []
        renderer = renderer_of(fig)
        bars = [
            Bbox(ax.transData.transform(segment))
            for container in ax.containers
            if isinstance(container, ErrorbarContainer)
            for lines in container.lines[2]
            for segment in lines.get_segments()
        ]
        notes = [t for t in ax.texts if isinstance(t, Annotation)]
        assert len(notes) == 18  # the 18 settings of the 9 families swept at two strengths
        crossed = [
            note.get_text()
            for note in notes
            for bar in bars
            if _meet(Text.get_window_extent(note, renderer), bar, slack=-0.5)
        ]
        assert crossed == []


def test_the_leakage_over_training_figure_has_no_overlapping_text(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    frame = pd.read_csv(RESULTS / "checkpoints" / "digits-lenet" / "checkpoints.csv")
    fig = leakage_over_training(frame)
    assert collisions(fig, monkeypatch) == []
    # The x axis shows the checkpoints themselves.
    left = fig.axes[0]
    ticks = [t.get_text() for t in left.get_xticklabels()]
    assert ticks == [f"{p:g}" for p in sorted(set(frame["progress"]))]


def test_the_check_finds_overlapping_text(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The check itself: two labels drawn on one spot, and a legend over a tick label.
    fig = Figure(figsize=(2, 2))
    ax = fig.add_subplot()
    ax.plot([0, 1], [0, 1], label="a long line label")
    ax.annotate("here", (0.5, 0.5))
    ax.annotate("there", (0.5, 0.5))
    assert collisions(fig, monkeypatch) == ["'here' overlaps 'there'"]
    ax.texts[1].remove()
    ax.legend(loc="upper left", bbox_to_anchor=(-0.3, 0.1))
    assert any(line.startswith("the legend covers") for line in collisions(fig, monkeypatch))


@pytest.mark.parametrize("cell", ["mnist-lenet-trained", "cifar10-lenet-init"])
def test_a_leakage_figure_of_few_defenses_fits_its_long_labels(cell, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # One row of panels, three defenses whose vertical tick labels are long ("dpsgd
    # noise_multiplier=1 norm=1") and a legend of eight attacks over three rows: the figure
    # grows to hold them, so no text meets another and the legend sits above every panel.
    run = load_run(RESULTS / "board" / cell)
    with paper_style():
        fig = leakage(run)
        assert collisions(fig, monkeypatch) == []
        renderer = renderer_of(fig)
        (legend,) = fig.legends
        top = legend.get_window_extent(renderer).y0
        panels = [ax.get_tightbbox(renderer) for ax in fig.axes]
        assert all(box.y1 <= top + 0.5 for box in panels)
        assert all(box.y0 >= -0.5 for box in panels)
