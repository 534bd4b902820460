"""Run configuration: defaults, sweep expansion, the resolved TOML and validation messages."""

from __future__ import annotations

import dataclasses
import itertools
import math
import sys
import warnings
from pathlib import Path

import pytest

from leakbench.attacks import ATTACKS, attacks_of
from leakbench.components.models import MODELS
from leakbench.core.errors import ConfigError, LeakbenchError, UnknownNameError
from leakbench.core.params import keyed_when_set
from leakbench.defenses import DEFENSES, Chain, ClipGlobalNorm, GaussianNoise, NoDefense
from leakbench.run.config import (
    DEFAULT_CONFIG_FILE,
    ComponentSpec,
    RunSpec,
    load_config,
    parse_config,
)

DEFAULT_CONFIG = DEFAULT_CONFIG_FILE.read_text(encoding="utf-8")

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

IDLG = '[[attack]]\nname = "idlg"\niterations = 5\n'


def _attack_defaults(name: str) -> dict[str, object]:
    # Parameters declared keyed_when_set (priors, ...) are part of a resolved config only when
    # they are set.
    cls = ATTACKS.get(name)
    late = keyed_when_set(cls)
    return {f.name: f.default for f in dataclasses.fields(cls) if f.name not in late}


# --- defaults -------------------------------------------------------------------------------

# dlg's resolved defaults, written out by hand (the test must not derive them from the code).
DLG_DEFAULTS = {
    "history_size": 100,
    "iterations": 10_000,
    "line_search": "armijo",
    "loss": "l2",
    "loss_tolerance": 1e-10,
    "match": "all",
    "retries": 2,
    "stall_progress": 1e-3,
    "stall_window": 500,
}


def test_minimal_config_gets_every_default() -> None:
    spec = parse_config('[[attack]]\nname = "dlg"\n')

    assert spec == RunSpec(
        name="run",
        dataset="digits",
        model="lenet",
        images=8,
        batch_size=1,
        seeds=(0,),
        success_mse=1e-3,
        attacks=(
            ComponentSpec(
                "dlg",
                DLG_DEFAULTS,
            ),
        ),
        defenses=(ComponentSpec("none", {}),),
        image_size=None,
    )
    assert spec.attacks[0].params == _attack_defaults("dlg")
    assert spec.defense_grid() == [NoDefense()]


def test_given_values_override_defaults_and_an_int_seed_becomes_a_list() -> None:
    spec = parse_config(
        'name = "my-run_2"\nsuite = "listed"\nimages = 6\nbatch_size = 2\nseeds = 7\n'
        "success_mse = 1\n"
        'image_size = [12, 10]\n[[attack]]\nname = "dlg"\niterations = 9\n'
    )

    assert (spec.name, spec.images, spec.batch_size, spec.seeds) == ("my-run_2", 6, 2, (7,))
    assert spec.success_mse == 1.0 and isinstance(spec.success_mse, float)
    assert spec.image_size == (12, 10)
    assert spec.attacks[0].params == {**DLG_DEFAULTS, "iterations": 9}


# --- sweeps ---------------------------------------------------------------------------------


def test_a_list_sweeps_one_parameter() -> None:
    spec = parse_config(IDLG + '[[defense]]\nname = "gaussian"\nsigma = [1e-3, 1e-1]\n')

    assert spec.defense_grid() == [GaussianNoise(sigma=1e-3), GaussianNoise(sigma=1e-1)]


def test_two_swept_parameters_give_their_product() -> None:
    with pytest.warns(FutureWarning, match="'restarts' is deprecated"):
        spec = parse_config(
            '[[attack]]\nname = "dlg"\niterations = [5, 10, 20]\nhistory_size = [3, 4]\n'
            "restarts = 1\n"
        )

    grid = spec.attack_grid()
    assert len(grid) == 6
    assert sorted((a.iterations, a.history_size) for a in grid) == sorted(
        itertools.product([5, 10, 20], [3, 4])
    )
    assert {a.retries for a in grid} == {1}
    assert all(a.name == "dlg" for a in grid)


def test_sweeps_of_several_tables_are_concatenated_in_order() -> None:
    spec = parse_config(
        IDLG + '[[defense]]\nname = "none"\n'
        '[[defense]]\nname = "prune"\nratio = [0.2, 0.9]\n'
        '[[defense]]\nname = "clip"\nnorm = 1.0\n'
    )

    assert [(d.name, d.params()) for d in spec.defense_grid()] == [
        ("none", {}),
        ("prune", {"ratio": 0.2}),
        ("prune", {"ratio": 0.9}),
        ("clip", {"norm": 1.0}),
    ]


def test_chain_steps_are_not_a_sweep() -> None:
    spec = parse_config(
        IDLG + '[[defense]]\nname = "chain"\n'
        'steps = [{ name = "clip", norm = 1.0 }, { name = "gaussian", sigma = 0.01 }]\n'
    )

    (chain,) = spec.defense_grid()
    assert chain == Chain(steps=(ClipGlobalNorm(norm=1.0), GaussianNoise(sigma=0.01)))


def test_chain_written_as_array_of_tables_is_the_same_chain() -> None:
    inline = parse_config(
        IDLG + '[[defense]]\nname = "chain"\n'
        'steps = [{ name = "clip", norm = 1.0 }, { name = "gaussian", sigma = 0.01 }]\n'
    )
    tables = parse_config(
        IDLG + '[[defense]]\nname = "chain"\n'
        '[[defense.steps]]\nname = "clip"\nnorm = 1.0\n'
        '[[defense.steps]]\nname = "gaussian"\nsigma = 0.01\n'
    )

    assert inline == tables


# --- the resolved config ----------------------------------------------------------------------

FULL = """\
name = "full"
dataset = "digits"
model = "lenet"
image_size = [10, 9]
suite = "listed"
images = 4
batch_size = 2
seeds = [3, 1]
success_mse = 0.01

[[attack]]
name = "dlg"
iterations = [5, 10]

[[defense]]
name = "gaussian"
sigma = [1e-4, 0.5]

[[defense]]
name = "chain"
steps = [{ name = "clip", norm = 1.0 }, { name = "laplace", b = 0.01 }]
"""


def test_to_toml_round_trips_to_an_equal_spec() -> None:
    spec = parse_config(FULL)

    text = spec.to_toml()
    again = parse_config(text)

    assert again == spec
    assert again.to_toml() == text
    assert again.attack_grid() == spec.attack_grid()
    assert again.defense_grid() == spec.defense_grid()


def test_to_toml_does_not_depend_on_key_order_or_spelled_out_defaults() -> None:
    short = parse_config('[[attack]]\nname = "dlg"\niterations = 5\n')
    with pytest.warns(FutureWarning, match="'restarts' is deprecated"):
        spelled = parse_config(
            '[[attack]]\nname = "dlg"\nrestarts = 2\niterations = 5\nhistory_size = 100\n'
            '[[defense]]\nname = "none"\n'
        )

    assert spelled == short
    assert spelled.to_toml() == short.to_toml()


def _parse_with_notices(text: str) -> tuple[RunSpec, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec = parse_config(text)
    assert all(w.category is FutureWarning for w in caught)
    return spec, [str(w.message) for w in caught]


def test_the_old_restarts_name_resolves_to_retries_with_one_notice() -> None:
    spec, notices = _parse_with_notices(
        '[[attack]]\nname = "dlg"\nrestarts = 1\niterations = [5, 10]\n'
    )

    # One notice for the table, not one per swept configuration.
    assert notices == ["attack dlg: 'restarts' is deprecated; use 'retries' (same meaning)"]
    assert spec == parse_config('[[attack]]\nname = "dlg"\nretries = 1\niterations = [5, 10]\n')
    assert [a.retries for a in spec.attack_grid()] == [1, 1]
    # The resolved config holds only the new name, and loads back without a notice.
    text = spec.to_toml()
    assert "retries = 1" in text and "restarts" not in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert parse_config(text) == spec


def test_the_old_restarts_name_of_ig_resolves_to_starts_also_in_sweeps() -> None:
    spec, notices = _parse_with_notices('[[attack]]\nname = "ig"\nrestarts = [0, 2]\n')

    assert notices == [
        "attack ig: 'restarts' is deprecated; use 'starts' (restarts = k is starts = k + 1)"
    ]
    assert spec.attacks[0].params["starts"] == [1, 3]
    assert spec.attacks[0].params["retries"] == 0
    assert [a.starts for a in spec.attack_grid()] == [1, 3]
    assert "starts = [" in spec.to_toml() and "restarts" not in spec.to_toml()


def test_each_table_with_the_old_name_gives_its_own_notice() -> None:
    _, notices = _parse_with_notices(
        '[[attack]]\nname = "dlg"\nrestarts = 1\n[[attack]]\nname = "idlg"\nrestarts = 0\n'
        '[[attack]]\nname = "dlg"\nretries = 0\n'
    )

    assert [n.split(":")[0] for n in notices] == ["attack dlg", "attack idlg"]


@pytest.mark.parametrize(
    "table",
    [
        'name = "dlg"\nrestarts = 1\nretries = 1\n',
        'name = "ig"\nrestarts = 1\nstarts = 2\n',
        'name = "dlg"\nrestarts = [1, 2]\nretries = 1\n',
    ],
)
def test_the_old_and_the_new_name_together_are_refused(table: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ConfigError, match="restarts cannot be given together with"):
            parse_config("[[attack]]\n" + table)


@pytest.mark.parametrize("value", ["1.5", "[1, 1.5]", "-1", '"2"'])
def test_a_bad_old_name_value_names_restarts(value: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ConfigError, match=r"^attack ig: restarts must be an integer"):
            parse_config(f'[[attack]]\nname = "ig"\nrestarts = {value}\n')


def test_default_config_parses_and_is_the_builtin_benchmark() -> None:
    spec = parse_config(DEFAULT_CONFIG)

    assert load_config(None) == spec
    assert parse_config(spec.to_toml()) == spec
    assert spec.model in MODELS
    assert {a.name for a in spec.attack_grid()} <= set(ATTACKS)
    assert {d.name for d in spec.defense_grid()} <= set(DEFENSES)
    # One defense per combination of swept values in each [[defense]] table.
    tables = tomllib.loads(DEFAULT_CONFIG)["defense"]
    expected = sum(
        math.prod(len(v) for k, v in t.items() if isinstance(v, list) and k != "steps")
        for t in tables
    )
    assert len(spec.defense_grid()) == expected > len(tables)


def test_load_config_reads_a_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(FULL, encoding="utf-8")

    assert load_config(path) == parse_config(FULL)
    assert load_config(str(path)) == parse_config(FULL)


# --- validation ---------------------------------------------------------------------------------

BAD_CONFIGS = [
    # (id, config text, exception type, substring of the message)
    ("unknown-top-key", "imagez = 4\n" + IDLG, ConfigError, "unknown key 'imagez'"),
    ("name-with-spaces", 'name = "my run"\n' + IDLG, ConfigError, "name must be"),
    ("empty-name", 'name = ""\n' + IDLG, ConfigError, "name must be"),
    ("name-not-a-string", "name = 3\n" + IDLG, ConfigError, "name must be"),
    ("dataset-not-a-string", "dataset = 3\n" + IDLG, ConfigError, "dataset must be"),
    ("images-zero", 'suite = "listed"\nimages = 0\n' + IDLG, ConfigError, "images must be"),
    ("images-string", 'images = "4"\n' + IDLG, ConfigError, "images must be"),
    ("images-float", 'suite = "listed"\nimages = 4.0\n' + IDLG, ConfigError, "images must be"),
    ("images-bool", "images = true\n" + IDLG, ConfigError, "images must be"),
    (
        "images-not-multiple",
        'suite = "listed"\nimages = 3\nbatch_size = 2\n[[attack]]\nname = "dlg"\n',
        ConfigError,
        "multiple of batch_size",
    ),
    ("batch-size-zero", "batch_size = 0\n" + IDLG, ConfigError, "batch_size must be"),
    (
        "batch-size-257",
        'suite = "listed"\nimages = 257\nbatch_size = 257\n' + IDLG,
        ConfigError,
        "batch_size must be",
    ),
    ("seeds-string", 'seeds = ["a"]\n' + IDLG, ConfigError, "seeds must be"),
    ("seeds-negative", "seeds = [0, -1]\n" + IDLG, ConfigError, "seeds must be"),
    ("seeds-repeated", "seeds = [1, 2, 1]\n" + IDLG, ConfigError, "without repeats"),
    ("seeds-empty", "seeds = []\n" + IDLG, ConfigError, "seeds must be"),
    ("seeds-bool", "seeds = [true]\n" + IDLG, ConfigError, "seeds must be"),
    # Attack seeds are derived as seed * 1_000_003 + batch in int64.
    ("seeds-too-large", "seeds = [9223372036854775807]\n" + IDLG, ConfigError, "seeds must be"),
    ("success-mse-zero", "success_mse = 0\n" + IDLG, ConfigError, "success_mse"),
    ("success-mse-negative", "success_mse = -1e-3\n" + IDLG, ConfigError, "success_mse"),
    ("success-mse-string", 'success_mse = "1e-3"\n' + IDLG, ConfigError, "success_mse"),
    ("success-mse-nan", "success_mse = nan\n" + IDLG, ConfigError, "success_mse"),
    ("image-size-one-value", "image_size = [8]\n" + IDLG, ConfigError, "image_size"),
    ("image-size-zero", "image_size = [0, 8]\n" + IDLG, ConfigError, "image_size"),
    ("image-size-string", 'image_size = "8x8"\n' + IDLG, ConfigError, "image_size"),
    ("image-size-floats", "image_size = [8.0, 8.0]\n" + IDLG, ConfigError, "image_size"),
    ("unknown-model", 'model = "resnet9000"\n' + IDLG, UnknownNameError, "model 'resnet9000'"),
    # Under the standard suite (the default) the table is optional (tests/test_plugins_cli.py).
    ("missing-attack", 'name = "x"\nsuite = "listed"\n', ConfigError, "[[attack]]"),
    ("attack-as-table", '[attack]\nname = "dlg"\n', ConfigError, "attack must be"),
    ("attack-without-name", "[[attack]]\niterations = 5\n", ConfigError, "attack[0].name"),
    ("unknown-attack", '[[attack]]\nname = "nope"\n', UnknownNameError, "attack 'nope'"),
    (
        "unknown-attack-parameter",
        '[[attack]]\nname = "dlg"\niteration = 5\n',
        ConfigError,
        "unknown parameter 'iteration'",
    ),
    ("attack-parameter-float", IDLG + "restarts = 1.5\n", ConfigError, "restarts"),
    ("attack-parameter-zero", '[[attack]]\nname = "dlg"\niterations = 0\n', ConfigError, "iter"),
    (
        "idlg-batch-size-2",
        'suite = "listed"\nimages = 2\nbatch_size = 2\n[[attack]]\nname = "idlg"\n',
        ConfigError,
        "batch_size must be <= 1",
    ),
    (
        "defense-without-name",
        IDLG + "[[defense]]\nsigma = 0.1\n",
        ConfigError,
        "defense[0].name",
    ),
    (
        "unknown-defense",
        IDLG + '[[defense]]\nname = "blur"\n',
        UnknownNameError,
        "defense 'blur'",
    ),
    (
        "unknown-defense-parameter",
        IDLG + '[[defense]]\nname = "gaussian"\nstd = 0.1\n',
        ConfigError,
        "unknown parameter 'std'",
    ),
    (
        "missing-defense-parameter",
        IDLG + '[[defense]]\nname = "gaussian"\n',
        ConfigError,
        "'sigma' is required",
    ),
    (
        "negative-sigma",
        IDLG + '[[defense]]\nname = "gaussian"\nsigma = -0.1\n',
        ConfigError,
        "sigma",
    ),
    (
        "negative-sigma-in-sweep",
        IDLG + '[[defense]]\nname = "gaussian"\nsigma = [0.1, -0.1]\n',
        ConfigError,
        "sigma",
    ),
    (
        "sigma-string",
        IDLG + '[[defense]]\nname = "gaussian"\nsigma = "0.1"\n',
        ConfigError,
        "sigma",
    ),
    (
        "prune-ratio-1.5",
        IDLG + '[[defense]]\nname = "prune"\nratio = 1.5\n',
        ConfigError,
        "ratio",
    ),
    (
        "empty-sweep",
        IDLG + '[[defense]]\nname = "gaussian"\nsigma = []\n',
        ConfigError,
        "sigma sweep list is empty",
    ),
    (
        "empty-attack-sweep",
        '[[attack]]\nname = "dlg"\niterations = []\n',
        ConfigError,
        "iterations sweep list is empty",
    ),
    (
        "chain-without-steps",
        IDLG + '[[defense]]\nname = "chain"\nsteps = []\n',
        ConfigError,
        "steps",
    ),
    (
        "chain-bad-step",
        IDLG + '[[defense]]\nname = "chain"\nsteps = [{ name = "prune", ratio = 1.5 }]\n',
        ConfigError,
        "steps[0]",
    ),
    (
        "duplicate-defense-in-sweep",
        IDLG + '[[defense]]\nname = "gaussian"\nsigma = [0.1, 0.1]\n',
        ConfigError,
        "listed twice",
    ),
    (
        "duplicate-defense-tables",
        IDLG + '[[defense]]\nname = "prune"\nratio = 1\n[[defense]]\nname = "prune"\nratio = 1.0\n',
        ConfigError,
        "listed twice",
    ),
    ("duplicate-attack", IDLG + IDLG, ConfigError, "listed twice"),
    ("malformed-toml", "images = \n" + IDLG, ConfigError, "not valid TOML"),
    ("malformed-toml-string", 'name = "open\n' + IDLG, ConfigError, "not valid TOML"),
]


@pytest.mark.parametrize(
    ("text", "error", "needle"),
    [pytest.param(text, error, needle, id=case) for case, text, error, needle in BAD_CONFIGS],
)
def test_bad_config_raises_an_error_that_names_the_field(
    text: str, error: type[LeakbenchError], needle: str
) -> None:
    with pytest.raises(LeakbenchError) as info:
        parse_config(text)

    assert type(info.value) is error
    assert needle in str(info.value)
    # The CLI prints the message as one line.
    assert "\n" not in str(info.value)


def test_unknown_names_are_leakbench_errors_not_config_errors() -> None:
    with pytest.raises(UnknownNameError) as info:
        parse_config('[[attack]]\nname = "nope"\n')

    assert isinstance(info.value, LeakbenchError)
    assert not isinstance(info.value, ConfigError)
    # The message lists what is allowed: the image attacks (an image run).
    assert all(name in str(info.value) for name in attacks_of("image"))
    assert "span" not in str(info.value)


def test_a_valid_config_is_not_refused_by_the_checks_above() -> None:
    # Guards the table above: its cases fail for their own reason, not for the shared parts.
    spec = parse_config(
        'name = "ok"\nsuite = "listed"\nimages = 4\nbatch_size = 2\n'
        "seeds = [0, 2147483647]\nsuccess_mse = 1e-3\n"
        'image_size = [8, 8]\n[[attack]]\nname = "dlg"\niterations = 5\n'
        '[[defense]]\nname = "gaussian"\nsigma = [0.0, 0.1]\n'
        '[[defense]]\nname = "prune"\nratio = 1.0\n'
    )

    assert spec.seeds == (0, 2147483647)


def test_malformed_toml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.toml"
    path.write_text("[[attack]\nname = 'dlg'\n", encoding="utf-8")

    with pytest.raises(ConfigError, match="not valid TOML") as info:
        load_config(path)

    assert str(path) in str(info.value)


def test_missing_config_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"

    with pytest.raises(ConfigError, match="does not exist") as info:
        load_config(path)

    assert str(path) in str(info.value)


@pytest.mark.parametrize("kind", ["directory", "not-utf8"])
def test_unreadable_config_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "c.toml"
    if kind == "directory":
        path.mkdir()
    else:
        path.write_bytes(b"\xff\xfe" + IDLG.encode())

    with pytest.raises(ConfigError, match="cannot be read") as info:
        load_config(path)

    assert str(path) in str(info.value)
    assert "\n" not in str(info.value)
