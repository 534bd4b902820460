"""The report opened in a real browser: headless Chromium driven by Selenium.

The page is the report of the committed default run (`results/default`: its tables, arrays and
config copied into a temporary directory, the report written there by `write_report`). The
tests check that every figure decodes, that a click on a header sorts the leaderboard (and a
second click reverses it), that the console stays free of errors, and take a screenshot.

Chromium and its driver come from the system (Debian's ``chromium`` and ``chromium-driver``;
``.ci/run`` installs them); without either, the tests are skipped. Nothing is downloaded: the
driver's path is given to Selenium, and Selenium Manager (which would fetch a driver) is
replaced by a function that fails.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from PIL import Image

from leakbench.outputs.paper_tables import COLUMNS, HTML_TABLE_ID, load_leaderboard
from leakbench.outputs.report import write_report

webdriver = pytest.importorskip(
    "selenium.webdriver", reason="selenium is not installed (it is in the `test` extra)"
)
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common import selenium_manager  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results" / "default"
# What write_report reads from a run directory.
RUN_FILES = ("config.toml", "environment.json", "leaderboard.csv", "trials.csv", "utility.csv")
BROWSER = next(filter(None, (shutil.which(b) for b in ("chromium", "chromium-browser"))), None)
DRIVER = shutil.which("chromedriver")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1200,900",
)
EMPTY = ("", "–")

pytestmark = [
    pytest.mark.skipif(
        BROWSER is None, reason="no chromium on PATH (Debian: apt-get install chromium)"
    ),
    pytest.mark.skipif(
        DRIVER is None, reason="no chromedriver on PATH (Debian: apt-get install chromium-driver)"
    ),
]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("browser") / "default"
    run_dir.mkdir()
    for name in RUN_FILES:
        shutil.copy2(RESULTS / name, run_dir / name)
    shutil.copytree(RESULTS / "arrays", run_dir / "arrays")
    return write_report(run_dir)


def _no_selenium_manager(*args: object, **kwargs: object) -> None:
    raise AssertionError("Selenium Manager was called: it would download a driver")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[webdriver.Chrome]:
    options = webdriver.ChromeOptions()
    options.binary_location = BROWSER
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(selenium_manager.SeleniumManager, "binary_paths", _no_selenium_manager)
        driver = webdriver.Chrome(service=Service(executable_path=DRIVER), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
def page(browser: webdriver.Chrome, report: Path) -> webdriver.Chrome:
    """The browser with the report freshly opened."""
    browser.get(report.as_uri())
    return browser


def _column(driver: webdriver.Chrome, header: str) -> list[str]:
    """The texts of one leaderboard column, top to bottom, as the DOM holds them now."""
    index = [c.header for c in COLUMNS].index(header)
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]),"
        " tr => tr.cells[arguments[1]].textContent.trim());",
        f"#{HTML_TABLE_ID} tbody tr",
        index,
    )


def _rows_html(driver: webdriver.Chrome) -> list[str]:
    return driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0]), tr => tr.innerHTML);",
        f"#{HTML_TABLE_ID} tbody tr",
    )


def _click(driver: webdriver.Chrome, header: str) -> None:
    index = [c.header for c in COLUMNS].index(header)
    th = driver.find_elements(By.CSS_SELECTOR, f"#{HTML_TABLE_ID} thead th")[index]
    # The table scrolls inside its own box: bring the header to the middle of the window first,
    # clear of the box's scroll bar.
    driver.execute_script("arguments[0].scrollIntoView({block: 'center', inline: 'center'});", th)
    th.click()


def _sort_state(driver: webdriver.Chrome) -> list[tuple[str | None, str]]:
    """Each header's aria-sort and its text (with the marker)."""
    heads = driver.find_elements(By.CSS_SELECTOR, f"#{HTML_TABLE_ID} thead th")
    return [(th.get_attribute("aria-sort"), th.text) for th in heads]


def _number(text: str) -> float | None:
    """A numeric cell's leading number (``27.1 ± 3.2`` -> 27.1); None for an empty cell."""
    return None if text in EMPTY else float(text.split()[0])


def _assert_sorted(keys: list, descending: bool) -> None:
    """``keys`` in order (None, an empty cell, after every value)."""
    values = [k for k in keys if k is not None]
    assert keys == values + [None] * (len(keys) - len(values)), "empty cells are not last"
    assert values == sorted(values, reverse=descending)


def test_every_figure_decodes(page: webdriver.Chrome) -> None:
    images = page.execute_script(
        "return Array.from(document.images, i => ({alt: i.alt, complete: i.complete,"
        " width: i.naturalWidth, inFigure: i.closest('figure') !== null}));"
    )
    assert [i["alt"] for i in images] == [
        "privacy_utility",
        "reconstructions",
        "convergence",
        "leakage",
    ]
    for image in images:
        assert image["complete"] and image["width"] > 0 and image["inFigure"], image
    # Nothing came over the network (resource timing lists no file: URLs; a file that fails
    # to load is a console error, see below).
    assert page.execute_script("return performance.getEntriesByType('resource').length;") == 0


@pytest.mark.parametrize("header", ["PSNR (dB)", "Rank"])
def test_a_header_click_sorts_numerically_and_a_second_reverses(
    page: webdriver.Chrome, report: Path, header: str
) -> None:
    plan = _column(page, header)
    column = next(c for c in COLUMNS if c.header == header)
    board = load_leaderboard(report.parent)
    assert plan == [column.text(row) or "–" for _, row in board.iterrows()]  # plan order
    keys = [_number(t) for t in plan]
    assert keys != sorted(keys, key=lambda k: (k is None, k or 0.0)), "already in order"
    rows = sorted(_rows_html(page))
    assert all(state is None for state, _ in _sort_state(page))

    for clicks, descending, state, marker in (
        (1, False, "ascending", "▲"),
        (2, True, "descending", "▼"),
    ):
        _click(page, header)
        _assert_sorted([_number(t) for t in _column(page, header)], descending)
        assert sorted(_rows_html(page)) == rows, "rows changed, not just their order"
        sorted_heads = [(s, text) for s, text in _sort_state(page) if s is not None]
        assert sorted_heads == [(state, f"{header} {marker}")], clicks


def test_a_text_column_sorts_alphabetically(page: webdriver.Chrome) -> None:
    _click(page, "Verdict")
    verdicts = _column(page, "Verdict")
    _assert_sorted([None if v in EMPTY else v for v in verdicts], descending=False)
    assert len(set(verdicts)) > 1
    _click(page, "Verdict")
    _assert_sorted([None if v in EMPTY else v for v in _column(page, "Verdict")], descending=True)


def test_the_console_shows_no_errors(page: webdriver.Chrome) -> None:
    for header in [c.header for c in COLUMNS]:
        _click(page, header)
        _click(page, header)
    errors = [e for e in page.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
    # The log is read for real: an error the page writes shows up.
    page.execute_script("console.error('leakbench probe');")
    assert any("leakbench probe" in e["message"] for e in page.get_log("browser"))


def test_screenshot(page: webdriver.Chrome, tmp_path: Path) -> None:
    path = tmp_path / "report.png"
    assert page.save_screenshot(str(path))
    with Image.open(path) as shot:
        assert shot.format == "PNG" and shot.size[0] >= 1000 and shot.size[1] >= 600
        colours = shot.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 50  # text and lines, not a blank page
