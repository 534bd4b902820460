"""The board, the report and docs pages in a real browser at a narrow (720 px) and a wide
(1,400 px) window: headless Chromium driven by Selenium, as tests/test_report_browser.py does.

Each page fails on horizontal scroll of the page, on a code block whose text is cut off (wider
than its box), on a table cell whose text overflows it, and on overlapping text (two text
lines' boxes that intersect). The board is built from every committed run directory; the docs
pages come from a small mkdocs build of the real docs (skipped without mkdocs). Chromium and
its driver come from the system; without them the tests are skipped and nothing is downloaded.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from leakbench.outputs.board import build_board
from leakbench.outputs.board_html import board_page
from leakbench.outputs.report import write_report

webdriver = pytest.importorskip(
    "selenium.webdriver", reason="selenium is not installed (it is in the `test` extra)"
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common import selenium_manager  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
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


def committed_runs() -> list[Path]:
    return sorted(p.parent for p in RESULTS.rglob("leaderboard.csv"))


@pytest.fixture(scope="module")
def board(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("board") / "board.html"
    path.write_text(board_page(build_board(committed_runs(), root=ROOT)), encoding="utf-8")
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
    """A mkdocs build of a few real docs pages and the committed board page, with the docs'
    theme and stylesheet (the API reference, which needs the installed package, left out)."""
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (the `docs` extra)")
    yaml = pytest.importorskip("yaml", reason="PyYAML comes with mkdocs (the `docs` extra)")
    root = tmp_path_factory.mktemp("docs")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    docs = root / "docs"
    shutil.copytree(ROOT / "docs", docs, ignore=shutil.ignore_patterns("reference.md"))
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
    table = browser.find_elements(By.CSS_SELECTOR, ".lb-board table")[0]
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
    rows = browser.find_elements(By.CSS_SELECTOR, ".lb-board tbody tr")
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
