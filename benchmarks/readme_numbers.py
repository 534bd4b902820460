"""Writes the result numbers of README.md and the documentation pages (`docs/*.md`) from the
committed results under `results/`, so that no page can quote a number its committed results do
not hold.

Each generated passage sits in one of those pages between two HTML comments, which do not
render:

    <!-- generated: NAME -->TEXT<!-- /generated -->

Its text is the template `results/<folder>/passages/NAME.md` filled by the function registered
for NAME in `results/<folder>/numbers.py`, beside the results it reads (`benchmarks/passages.py`
describes both, spans and blocks). This script loads every `numbers.py`, checks the markers and
compares or rewrites each passage. Timings measured by hand stay in the README, outside the
passages.

    PYTHONSAFEPATH=1 python benchmarks/readme_numbers.py          # rewrite the passages
    PYTHONSAFEPATH=1 python benchmarks/readme_numbers.py --check  # exit 1 naming each stale one

`tests/test_readme.py` runs the same comparison.
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import re
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from passages import (  # noqa: E402
    PASSAGES,
    RESULTS,
    ROOT,
    Passage,
    ReadmeError,
    Results,
    StaleClaim,
)

README = ROOT / "README.md"
DOCS = ROOT / "docs"
OPEN = "<!-- generated: "
CLOSE = "<!-- /generated -->"
PASSAGE = re.compile(r"<!-- generated: ([a-z0-9-]+) -->(.*?)<!-- /generated -->", re.S)

__all__ = ["ReadmeError", "Results", "StaleClaim", "main", "rewrite", "stale"]


def _load_numbers() -> None:
    """Imports every `results/<folder>/numbers.py`, which registers its passages."""
    for path in sorted(RESULTS.glob("*/numbers.py")):
        name = f"numbers_{path.parent.name}"
        if name in sys.modules:
            continue
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)


_load_numbers()


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
        name: f"marked in {_name(path)}, but no results/*/numbers.py fills such a passage"
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
