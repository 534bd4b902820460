"""Every committed result says which engine made it, and one made by an older engine is listed
as stale with the command that regenerates it (results/README.md, "Stale results").

A result is a folder under results/ that holds a CSV. A run directory records its engine
version in ``environment.json`` (`leakbench run` writes it); a benchmark script's output in
``run.json``. A folder with neither counts as unrecorded.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from leakbench.core.versions import ENGINE_VERSION

RESULTS = Path(__file__).resolve().parents[1] / "results"
# A row of the stale table: | `folder/` | engine version or "unrecorded" | command |
STALE_ROW = re.compile(r"^\| `([^`]+)/` \| (\d+|unrecorded) \| (.+) \|$")


def recorded_engine(folder: Path) -> str:
    """The engine version a result folder records, as text ("unrecorded" when none)."""
    for name in ("environment.json", "run.json"):
        path = folder / name
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            # environment.json files written before engine versions existed have no entry.
            return str(data.get("engine_version", 1 if name == "environment.json" else "?"))
    return "unrecorded"


def result_folders() -> list[Path]:
    return sorted({path.parent for path in RESULTS.rglob("*.csv")})


def stale_table() -> dict[str, tuple[str, str]]:
    text = (RESULTS / "README.md").read_text(encoding="utf-8")
    section = text.split("## Stale results", 1)
    assert len(section) == 2, "results/README.md has no 'Stale results' section"
    rows = {}
    for line in section[1].split("\n## ", 1)[0].splitlines():
        match = STALE_ROW.match(line.strip())
        if match:
            rows[match.group(1)] = (match.group(2), match.group(3))
    return rows


def test_every_result_is_of_this_engine_or_listed_as_stale() -> None:
    stale = stale_table()
    wrong = []
    for folder in result_folders():
        name = folder.relative_to(RESULTS).as_posix()
        engine = recorded_engine(folder)
        if engine == str(ENGINE_VERSION):
            assert name not in stale, f"results/{name} is of engine {engine}: unlist it"
        elif stale.get(name, ("",))[0] != engine:
            wrong.append(f"results/{name} (engine {engine})")
    assert not wrong, (
        f"made by another engine than {ENGINE_VERSION} and not listed as such in results/"
        f"README.md's 'Stale results': {', '.join(wrong)}"
    )


def test_every_stale_entry_names_a_result_and_a_command() -> None:
    folders = {f.relative_to(RESULTS).as_posix() for f in result_folders()}
    for name, (_, command) in stale_table().items():
        assert name in folders, f"the stale table lists results/{name}, which holds no result"
        assert "`" in command, f"results/{name}: give the command that regenerates it"


def test_the_readme_names_the_current_engine() -> None:
    """The sentence that tells a reader which engine is current names this one."""
    text = (RESULTS / "README.md").read_text(encoding="utf-8")
    named = re.findall(r"The current version is\s+(\d+)", text)
    assert named == [str(ENGINE_VERSION)]
