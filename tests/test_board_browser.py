"""The board, the report and docs pages in a real browser at a narrow (720 px) and a wide
(1,400 px) window: headless Chromium driven by Selenium, as tests/test_report_browser.py does.

Each page fails on horizontal scroll of the page, on a code block whose text is cut off (wider
than its box), on a table cell whose text overflows it, and on overlapping text (two text
lines' boxes that intersect). The board's pages are rendered by this checkout from the committed
board (docs/board/board.csv: every committed run directory's rows), so that they test the page
rather than how rows are computed; the docs pages come from a small mkdocs build of the real
docs (skipped without mkdocs), with the board's page written again the same way. Inside the
docs' content column (and inside a 700 px column of a plain page) the board must show its rows
as tables at a desktop width, in rank order, on a page under 30,000 px tall; a table wider
than its column scrolls in its own box, never the page; a phone-sized window shows cards.
Chromium and its driver come from the system; without them the tests are skipped and nothing
is downloaded.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from leakbench.outputs.board import Board
from leakbench.outputs.board_html import board_page, docs_page, read_board
from leakbench.outputs.report import write_report

webdriver = pytest.importorskip(
    "selenium.webdriver", reason="selenium is not installed (it is in the `test` extra)"
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common import selenium_manager  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.wait import WebDriverWait  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
BOARD_DIR = ROOT / "docs" / "board"
BUILD_COMMAND = "bash docs/board/build.sh"
MAX_HEIGHT = 30_000  # px: the docs' board page at 1,400 px, tables not cards
PHONE = 480  # px: a window where each row is a card
BROWSER = next(filter(None, (shutil.which(b) for b in ("chromium", "chromium-browser"))), None)
DRIVER = shutil.which("chromedriver")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars")  # fmt: skip
WIDTHS = (720, 1400)
DOCS_PAGES = ("getting-started.md", "malicious.md", "outputs.md", "privacy-audit.md")
RUN_FILES = ("config.toml", "environment.json", "leaderboard.csv", "trials.csv", "utility.csv")

pytestmark = [
    pytest.mark.skipif(BROWSER is None, reason="no chromium on PATH"),
    pytest.mark.skipif(DRIVER is None, reason="no chromedriver on PATH"),
]

# Finds what a reader would see as broken; returns one line per defect.
_DEFECTS = """
const out = [];
const doc = document.documentElement;
if (doc.scrollWidth > window.innerWidth + 1) {
  out.push(`page scrolls sideways: ${doc.scrollWidth} > ${window.innerWidth}`);
}
const visible = el => el.checkVisibility({contentVisibilityAuto: true,
  visibilityProperty: true, opacityProperty: true});
for (const el of document.querySelectorAll("pre, pre > code, td, th")) {
  if (!visible(el)) { continue; }
  const style = getComputedStyle(el);
  if (el.scrollWidth > el.clientWidth + 1 && !(el.tagName === "PRE" && style.overflowX === "auto"
      && el.querySelector("code") === null)) {
    out.push(`${el.tagName.toLowerCase()} cut off: ${el.textContent.trim().slice(0, 60)}`);
  }
}
const boxes = [];
const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
while (walker.nextNode()) {
  const node = walker.currentNode;
  if (!node.textContent.trim() || !node.parentElement || !visible(node.parentElement)) {
    continue;
  }
  if (node.parentElement.closest("script, style, svg, .md-search, .md-sidebar, .md-header")) {
    continue;
  }
  const range = document.createRange();
  range.selectNodeContents(node);
  for (const r of range.getClientRects()) {
    if (r.width > 1 && r.height > 1) {
      boxes.push({l: r.left + scrollX, r: r.right + scrollX, t: r.top + scrollY,
                  b: r.bottom + scrollY, text: node.textContent.trim().slice(0, 30)});
    }
  }
}
boxes.sort((a, b) => a.t - b.t);
for (let i = 0; i < boxes.length; i++) {
  for (let j = i + 1; j < boxes.length && boxes[j].t < boxes[i].b - 2; j++) {
    const a = boxes[i], b = boxes[j];
    const x = Math.min(a.r, b.r) - Math.max(a.l, b.l);
    const y = Math.min(a.b, b.b) - Math.max(a.t, b.t);
    if (x > 2 && y > 2) { out.push(`text overlaps: "${a.text}" and "${b.text}"`); }
  }
}
return out.slice(0, 10);
"""


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = BROWSER
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")

    def no_manager(*args: object, **kwargs: object) -> None:
        raise AssertionError("Selenium Manager was called: it would download a driver")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(selenium_manager.SeleniumManager, "binary_paths", no_manager)
        driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def committed_board() -> Board:
    """The committed board (docs/board/board.csv and apart.csv), read back to render again."""
    if not (BOARD_DIR / "board.csv").is_file():
        pytest.skip("no committed board (docs/board/board.csv)")
    return read_board(BOARD_DIR)


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("board") / "board.html"
    path.write_text(board_page(committed_board()), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def column(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The board's docs block in a 700 px column of a plain page, as the docs' content column
    holds it (without needing mkdocs)."""
    fragment = board_page(committed_board(), fragment=True)
    path = tmp_path_factory.mktemp("column") / "column.html"
    path.write_text(
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<title>board in a column</title></head><body style="margin: 0">'
        '<div style="max-width: 700px; margin: 0 auto; padding: 0 16px">'
        f"<h1>Board</h1>\n{fragment}</div></body></html>\n",
        encoding="utf-8",
    )
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("report") / "default"
    run_dir.mkdir()
    for name in RUN_FILES:
        shutil.copy2(RESULTS / "default" / name, run_dir / name)
    shutil.copytree(RESULTS / "default" / "arrays", run_dir / "arrays")
    return write_report(run_dir)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A mkdocs build of a few real docs pages and the board page (rendered from the committed
    board by this checkout), with the docs' theme and stylesheet (the API reference, which
    needs the installed package, left out)."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (the `docs` extra)")
    yaml = pytest.importorskip("yaml", reason="PyYAML comes with mkdocs (the `docs` extra)")
    root = tmp_path_factory.mktemp("docs")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    docs = root / "docs"
    shutil.copytree(ROOT / "docs", docs, ignore=shutil.ignore_patterns("reference.md"))
    (docs / "board" / "index.md").write_text(
        docs_page(committed_board(), BUILD_COMMAND), encoding="utf-8"
    )
    config.update(docs_dir=str(docs), site_dir=str(root / "site"), strict=False)
    config["nav"] = [{"Board": "board/index.md"}, *DOCS_PAGES]
    config["plugins"] = ["search"]
    (root / "mkdocs.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "-q", "-f", str(root / "mkdocs.yml")],
        check=True,
        timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    return root / "site"


def _defects(browser: webdriver.Chrome, url: str, width: int) -> list[str]:
    browser.set_window_size(width, 900)
    browser.get(url)
    assert browser.find_element(By.TAG_NAME, "body").text.strip()
    return browser.execute_script(_DEFECTS)


@pytest.mark.parametrize("width", WIDTHS)
def test_the_board_reads_at(browser, board: Path, width: int, tmp_path: Path) -> None:
    assert _defects(browser, board.as_uri(), width) == []
    tables = browser.find_elements(By.CSS_SELECTOR, ".lb-board table")
    assert len(tables) > 5
    browser.save_screenshot(str(tmp_path / f"board-{width}.png"))


def test_the_board_sorts_and_filters(browser, board: Path) -> None:
    browser.set_window_size(1400, 900)
    browser.get(board.as_uri())
    table = browser.find_elements(By.CSS_SELECTOR, ".lb-board section table.lb")[0]
    column = 4  # leaked over the suite

    def shares() -> list[float]:
        cells = table.find_elements(By.CSS_SELECTOR, f"tbody td:nth-child({column + 1})")
        return [float(c.get_attribute("data-sort")) for c in cells]

    table.find_elements(By.CSS_SELECTOR, "thead th button")[column].click()
    assert shares() == sorted(shares())
    table.find_elements(By.CSS_SELECTOR, "thead th button")[column].click()
    assert shares() == sorted(shares(), reverse=True)
    box = browser.find_element(By.ID, "lb-filter")
    box.send_keys("mnist broken")
    rows = browser.find_elements(By.CSS_SELECTOR, ".lb-board section tbody tr")
    shown = [r.text.lower() for r in rows if r.is_displayed()]
    assert 0 < len(shown) < len(rows)
    assert all("broken" in text for text in shown)
    for section in browser.find_elements(By.CSS_SELECTOR, ".lb-board section"):
        if section.is_displayed():
            assert "| mnist |" in section.find_element(By.TAG_NAME, "h2").text


@pytest.mark.parametrize("width", WIDTHS)
def test_the_report_reads_at(browser, report: Path, width: int) -> None:
    assert _defects(browser, report.as_uri(), width) == []
    # the leaderboard comes before the figures, on the first screens
    top = browser.execute_script(
        "return document.querySelector('table').getBoundingClientRect().top + scrollY;"
    )
    figure = browser.execute_script(
        "return document.querySelector('figure').getBoundingClientRect().top + scrollY;"
    )
    assert top < figure and top < 1200


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("page", ["board/index.md", *DOCS_PAGES])
def test_docs_pages_read_at(browser, site: Path, page: str, width: int) -> None:
    name = page.removesuffix(".md").removesuffix("index")
    target = site / name / "index.html" if name else site / "index.html"
    assert _defects(browser, target.as_uri(), width) == []


# The board's layout as a reader meets it: the page's size, how its tables display, what lies
# outside the window other than inside a table's scroll box, and each table's rank column.
_LAYOUT = """
const shown = el => el.checkVisibility();
const tables = [...document.querySelectorAll(".lb-board section table.lb")].filter(shown);
const outside = [...document.querySelectorAll(".lb-board *")].filter(el => {
  const r = el.getBoundingClientRect();
  return r.width > 0 && (r.right > innerWidth + 1 || r.left < -1)
    && el.closest(".lb-scroll") === null;
});
const boxes = [...document.querySelectorAll(".lb-board .lb-scroll")].filter(shown);
return {
  height: document.documentElement.scrollHeight,
  width: document.documentElement.scrollWidth,
  window: innerWidth,
  displays: [...new Set(tables.map(t => getComputedStyle(t).display))],
  outside: outside.slice(0, 5).map(el => `${el.tagName} ${el.textContent.slice(0, 40)}`),
  boxes_out: boxes.filter(b => b.getBoundingClientRect().right > innerWidth + 1).length,
  scrolling: boxes.filter(b => b.scrollWidth > b.clientWidth + 1).length,
  ranks: [...document.querySelectorAll(".lb-board section")].map(section =>
    [...section.querySelectorAll(':scope > .lb-scroll td[data-label="rank"]')]
      .map(td => td.textContent.trim())),
};
"""


def _layout(browser: webdriver.Chrome, url: str, width: int) -> dict:
    browser.set_window_size(width, 900)
    # A blank page first: loading the URL the window already shows may return before the new
    # document is parsed, and the layout would be read off a page half built.
    browser.get("about:blank")
    browser.get(url)
    WebDriverWait(browser, 60).until(
        lambda b: b.execute_script("return document.readyState") == "complete"
    )
    return browser.execute_script(_LAYOUT)


def _in_rank_order(ranks: list[str]) -> bool:
    """Ranked rows first, in rank order, then the unranked ones."""
    numbers = [int(r) for r in ranks if r]
    return ranks == [str(n) for n in sorted(numbers)] + [""] * (len(ranks) - len(numbers))


@pytest.fixture(params=["docs", "column"])
def board_in_column(request: pytest.FixtureRequest) -> Path:
    """The board inside a ~700 px content column: the real docs page, or a plain page's."""
    if request.param == "docs":
        return request.getfixturevalue("site") / "board" / "index.html"
    return request.getfixturevalue("column")


@pytest.mark.parametrize("width", WIDTHS)
def test_the_board_shows_tables_in_the_docs_column_at(
    browser, board_in_column: Path, width: int, tmp_path: Path
) -> None:
    layout = _layout(browser, board_in_column.as_uri(), width)
    browser.save_screenshot(str(tmp_path / f"column-{width}.png"))
    assert layout["displays"] == ["table"], layout["displays"]  # not cards
    assert layout["width"] <= layout["window"], "the page scrolls sideways"
    assert layout["outside"] == [], "outside the window, and not in a table's scroll box"
    assert layout["boxes_out"] == 0
    if width == 1400:
        assert layout["height"] < MAX_HEIGHT, layout["height"]
    assert layout["scrolling"] > 0  # the widest tables scroll in their box, inside the column
    ranks = layout["ranks"]
    assert len(ranks) == committed_board().rows["table"].nunique()
    assert any(any(r) for r in ranks)
    for table in ranks:
        assert _in_rank_order(table), table


def test_the_board_turns_into_cards_on_a_phone(browser, board_in_column: Path) -> None:
    layout = _layout(browser, board_in_column.as_uri(), PHONE)
    assert layout["displays"] == ["block"], layout["displays"]
    assert layout["width"] <= layout["window"], "the page scrolls sideways"
    assert layout["outside"] == []


def test_the_board_sorts_model_states_in_natural_order(browser, board: Path) -> None:
    browser.set_window_size(1400, 900)
    browser.get(board.as_uri())
    column = 3  # model state
    for table in browser.find_elements(By.CSS_SELECTOR, ".lb-board section table.lb"):
        cells = table.find_elements(By.CSS_SELECTOR, f"tbody td:nth-child({column + 1})")
        states = [c.get_attribute("textContent") for c in cells]
        if len({s for s in states if s.startswith("checkpoint epoch-")}) > 2:
            break
    else:
        pytest.skip("no table of the committed board holds three checkpoints")
    browser.execute_script("arguments[0].closest('details')?.setAttribute('open', '')", table)
    table.find_elements(By.CSS_SELECTOR, "thead th button")[column].click()
    cells = table.find_elements(By.CSS_SELECTOR, f"tbody td:nth-child({column + 1})")
    epochs = [
        int(c.get_attribute("textContent").rsplit("-", 1)[1])
        for c in cells
        if c.get_attribute("textContent").startswith("checkpoint epoch-")
    ]
    assert epochs == sorted(epochs) and len(set(epochs)) > 2
