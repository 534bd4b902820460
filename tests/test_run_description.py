"""The run description reaches only what needs the whole run (issue 64): execution, scoring and
the integrations take the parts of a `RunSpec` they read (its threat model, its audit or text
settings, a model name, a batch size), so that a change of the run description touches the
few functions that need all of it.

An AST count of the functions of ``bench/`` and ``attacks/`` that take a whole `RunSpec` (a
parameter annotated with it) stays within `MAX_WHOLE_RUN`, and the Flower auditor, a record of
what ran elsewhere, builds none: it neither imports nor calls `build_run` or `RunSpec`. Both
checks read the source only, and each is shown to flag a planted violation.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# The folders whose functions are counted.
FOLDERS = ("bench", "attacks")
# The most functions that may take a whole RunSpec: the runner, the pipelines' constructor and
# planning, the top-level audit runners and the config's own checks (42 before issue 64).
MAX_WHOLE_RUN = 20
FLOWER = Path("bench") / "integrations" / "flower.py"
# What the Flower auditor may not touch: the run description and its one constructor.
RUN_NAMES = ("RunSpec", "build_run")


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[ast.arg]:
    args = node.args
    extra = [a for a in (args.vararg, args.kwarg) if a is not None]
    return [*args.posonlyargs, *args.args, *args.kwonlyargs, *extra]


def whole_run_functions(root: Path = ROOT) -> list[str]:
    """``path:line:name`` of every function under ``root``'s `FOLDERS` with a parameter whose
    annotation names ``RunSpec`` (``spec: RunSpec``, ``spec: "RunSpec | None"``, ...)."""
    found = []
    for folder in FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                if any(
                    arg.annotation is not None and "RunSpec" in ast.unparse(arg.annotation)
                    for arg in _parameters(node)
                ):
                    found.append(f"{path.relative_to(root)}:{node.lineno}:{node.name}")
    return found


def run_description_uses(path: Path) -> list[str]:
    """Where the module at ``path`` imports or names (calls, annotates with) `RUN_NAMES`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [alias.name.rpartition(".")[2] for alias in node.names]
            found += [f"line {node.lineno}: imports {n}" for n in names if n in RUN_NAMES]
        elif isinstance(node, ast.Name) and node.id in RUN_NAMES:
            found.append(f"line {node.lineno}: {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in RUN_NAMES:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # A string annotation ("RunSpec") names it too.
            if node.value.strip() in RUN_NAMES:
                found.append(f"line {node.lineno}: {node.value!r}")
    return found


def test_few_functions_take_the_whole_run() -> None:
    found = whole_run_functions()
    assert found, "the counter found no function at all: is it reading the package?"
    assert len(found) <= MAX_WHOLE_RUN, (
        f"{len(found)} functions take a whole RunSpec (at most {MAX_WHOLE_RUN}); give the new "
        "ones the parts they read:\n" + "\n".join(found)
    )


def test_the_flower_auditor_builds_no_run_description() -> None:
    assert run_description_uses(ROOT / FLOWER) == []


def _plant(root: Path, relative: str, source: str) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "source",
    [
        "def run(spec: RunSpec) -> None: ...\n",
        "class C:\n    def run(self, data, *, spec: 'RunSpec | None' = None) -> None: ...\n",
        "async def run(*specs: list[RunSpec]) -> None: ...\n",
    ],
)
def test_a_planted_whole_run_parameter_is_counted(tmp_path: Path, source: str) -> None:
    _plant(tmp_path, "bench/run/planted.py", "def parts(threat: ThreatModel) -> None: ...\n")
    _plant(tmp_path, "attacks/planted.py", "from x import RunSpec\n" + source)
    assert [f.rpartition(":")[2] for f in whole_run_functions(tmp_path)] == ["run"]


@pytest.mark.parametrize(
    "source",
    [
        "from leakbench.run.config import build_run\n",
        "from leakbench.run.config import RunSpec as Spec\n",
        "import leakbench.run.config as config\nconfig.build_run({})\n",
        "def spec(self) -> 'RunSpec': ...\n",
    ],
)
def test_a_planted_run_description_in_the_auditor_is_flagged(tmp_path: Path, source: str) -> None:
    assert run_description_uses(_plant(tmp_path, "flower.py", source))
    clean = "from leakbench.run.config import check_values, threat_table\n"
    assert run_description_uses(_plant(tmp_path, "clean.py", clean)) == []


def test_the_auditor_s_record_is_the_run_description_s_text(tmp_path: Path) -> None:
    """The auditor writes its config.toml without a RunSpec: the text is the one the RunSpec
    of the same audit writes, and its trials' setting is that RunSpec's."""
    pytest.importorskip("flwr", reason="the flower extra is not installed: pip install '.[flower]'")
    import tomli_w
    from flwr.serverapp.strategy import FedAvg

    from leakbench.core.federated import LocalTraining
    from leakbench.integrations import flower
    from leakbench.run.config import build_run
    from leakbench.run.plan import Setting

    cases = [
        ({}, []),
        (
            {"attack": "dlg", "attack_params": {"priors": [{"name": "tv", "weight": 0.01}]},
             "clients": [3, 1], "local": LocalTraining(2, 0.05), "lpips": "alex",
             "labels_known": True, "success_mse": 2e-3, "deployment": "fl-2"},
            [("gaussian", {"sigma": 0.1}),
             ("chain", {"steps": [{"name": "clip", "norm": 1.0},
                                  {"name": "gaussian", "sigma": 0.01}]})],
        ),
    ]  # fmt: skip
    for i, (changes, declared) in enumerate(cases):
        auditor = flower.LeakageAuditor(
            FedAvg(), out=tmp_path / f"audit-{i}", private_data=lambda c, r: (None, None),
            figures=False, **changes,
        )  # fmt: skip
        for name, params in declared:
            text = flower.canonical_json(params)
            auditor._defenses[flower.canonical_json([name, text])] = flower._Declared(name, text)
            auditor.trials.append(None)  # an audited trial: the record counts its images
        doc = {
            "name": auditor.deployment,
            "dataset": auditor.dataset,
            "model": auditor.model_name,
            "images": max(1, len(auditor.trials)) * auditor.batch_size,
            "batch_size": auditor.batch_size,
            "seeds": list(auditor.clients),
            "success_mse": auditor.success_mse,
            "parallel_trials": 1,
            "lpips": auditor.lpips,
            "attack": [{"name": auditor.attack.name, **auditor.attack.params()}],
            "defense": [{"name": n, **p} for n, p in declared] or [{"name": "none"}],
            "training": {"enabled": False},
            "threat_model": auditor._threat,
        }
        spec = build_run(doc, runnable=False)
        assert tomli_w.dumps(auditor._record()) == spec.to_toml()
        assert auditor._setting() == Setting.of(spec)
