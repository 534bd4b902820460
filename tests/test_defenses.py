"""Tests of the gradient defenses: the registry-wide contract and hand-computed values."""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, ClassVar

import numpy as np
import pytest
import tensorflow as tf

from leakbench.defenses import DEFENSES, Defense, make_defense
from leakbench.defenses.base import tensor_seed
from leakbench.defenses.chain import Chain
from leakbench.defenses.clip import ClipGlobalNorm
from leakbench.defenses.gaussian import GaussianNoise
from leakbench.defenses.laplace import LaplaceNoise
from leakbench.defenses.prune import Prune
from leakbench.errors import ConfigError

# Sample parameters for every registered defense, and whether its output depends on the seed.
# A newly registered defense without an entry here fails `test_every_defense_has_sample_params`.
DEFAULT_PARAMS: dict[str, tuple[dict[str, Any], bool]] = {
    "none": ({}, False),
    "gaussian": ({"sigma": 0.1}, True),
    "laplace": ({"b": 0.1}, True),
    "clip": ({"norm": 1.0}, False),
    "prune": ({"ratio": 0.5}, False),
    "chain": (
        {"steps": [{"name": "clip", "norm": 1.0}, {"name": "gaussian", "sigma": 0.01}]},
        True,
    ),
}

NAMES = DEFENSES.names()


def sample_params(name: str) -> dict[str, Any]:
    if name not in DEFAULT_PARAMS:
        pytest.fail(f"defense {name!r} has no entry in DEFAULT_PARAMS")
    return DEFAULT_PARAMS[name][0]


def sample_grads(dtype: tf.DType = tf.float32) -> list[tf.Tensor]:
    """Gradients shaped like a tiny model's: kernel, bias, 4-D kernel and a scalar."""
    rng = np.random.default_rng(0)
    shapes = [(3, 4), (5,), (2, 2, 1, 3), ()]
    return [tf.constant(rng.normal(size=s), dtype=dtype) for s in shapes]


def seed(a: int, b: int = 0, dtype: tf.DType = tf.int64) -> tf.Tensor:
    return tf.constant([a, b], dtype=dtype)


def as_numpy(grads: list[tf.Tensor]) -> list[np.ndarray]:
    return [np.asarray(g.numpy(), dtype=np.float64) for g in grads]


def assert_same(a: list[tf.Tensor], b: list[tf.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(as_numpy(a), as_numpy(b), strict=True):
        np.testing.assert_array_equal(x, y)


def differs(a: list[tf.Tensor], b: list[tf.Tensor]) -> bool:
    return any(not np.array_equal(x, y) for x, y in zip(as_numpy(a), as_numpy(b), strict=True))


# --- registry-wide contract ---------------------------------------------------------------------


def test_every_defense_has_sample_params() -> None:
    assert set(NAMES) == set(DEFAULT_PARAMS), "keep DEFAULT_PARAMS in step with the registry"


def test_expected_defenses_are_registered() -> None:
    assert {"none", "gaussian", "laplace", "clip", "prune", "chain"} <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_class_metadata(name: str) -> None:
    cls = DEFENSES.get(name)
    assert issubclass(cls, Defense)
    assert dataclasses.is_dataclass(cls)
    assert cls.name == name
    assert cls.level in {"batch", "example"}
    # The conventions ask every defense to cite its paper.
    assert cls.__doc__ and "Reference:" in cls.__doc__


@pytest.mark.parametrize("name", NAMES)
def test_frozen_hashable_and_params_round_trip(name: str) -> None:
    defense = make_defense(name, **sample_params(name))
    assert defense.level in {"batch", "example"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        defense.foo = 1  # type: ignore[attr-defined]
    hash(defense)
    params = defense.params()
    json.dumps(params, sort_keys=True)  # canonical keys need JSON-able params
    assert make_defense(name, **params) == defense
    assert make_defense(name, **params).params() == params


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.float16])
@pytest.mark.parametrize("name", NAMES)
def test_structure_shapes_and_dtypes_preserved(name: str, dtype: tf.DType) -> None:
    defense = make_defense(name, **sample_params(name))
    grads = sample_grads(dtype)
    out = defense(grads, seed=seed(1))
    assert isinstance(out, list)
    assert len(out) == len(grads)
    for g, o in zip(grads, out, strict=True):
        assert o.shape == g.shape
        assert o.dtype == g.dtype
        assert np.all(np.isfinite(o.numpy()))


@pytest.mark.parametrize("name", NAMES)
def test_empty_gradient_list(name: str) -> None:
    assert make_defense(name, **sample_params(name))([], seed=seed(0)) == []


@pytest.mark.parametrize("seed_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_output(name: str, seed_dtype: tf.DType) -> None:
    defense = make_defense(name, **sample_params(name))
    grads = sample_grads()
    assert_same(
        defense(grads, seed=seed(7, 3, seed_dtype)), defense(grads, seed=seed(7, 3, seed_dtype))
    )


@pytest.mark.parametrize("name", NAMES)
def test_seed_dependence(name: str) -> None:
    defense = make_defense(name, **sample_params(name))
    random = DEFAULT_PARAMS[name][1]
    grads = sample_grads()
    outs = [defense(grads, seed=seed(s)) for s in (1, 2)] + [defense(grads, seed=seed(1, 1))]
    if random:
        assert differs(outs[0], outs[1])
        assert differs(outs[0], outs[2])  # the second seed word matters too
    else:
        assert_same(outs[0], outs[1])
        assert_same(outs[0], outs[2])


@pytest.mark.parametrize("name", NAMES)
def test_traced_once_for_different_seeds(name: str) -> None:
    defense = make_defense(name, **sample_params(name))
    traces = []

    @tf.function
    def step(grads: list[tf.Tensor], s: tf.Tensor) -> list[tf.Tensor]:
        traces.append(1)  # Python side effect: runs only while tracing
        return defense(grads, seed=s)

    grads = sample_grads()
    outs = [step(grads, seed(s)) for s in range(5)]
    assert len(traces) == 1
    assert step.experimental_get_tracing_count() == 1
    if DEFAULT_PARAMS[name][1]:
        assert differs(outs[0], outs[1])


@pytest.mark.parametrize("name", NAMES)
def test_graph_mode_matches_eager(name: str) -> None:
    defense = make_defense(name, **sample_params(name))
    grads = sample_grads()
    graph = tf.function(lambda g, s: defense(g, seed=s), jit_compile=False)
    assert_same(graph(grads, seed(11, 5)), defense(grads, seed=seed(11, 5)))


@pytest.mark.parametrize("name", NAMES)
def test_unknown_shapes_in_graph(name: str) -> None:
    # Gradients whose static shape is unknown still work (e.g. a generic tf.function signature).
    defense = make_defense(name, **sample_params(name))
    grads = [tf.constant(np.arange(-5.0, 5.0).reshape(2, 5), tf.float32)]
    graph = tf.function(
        lambda g, s: defense(g, seed=s),
        input_signature=[
            [tf.TensorSpec(None, tf.float32)],
            tf.TensorSpec([2], tf.int64),
        ],
    )
    assert_same(graph(grads, seed(4)), defense(grads, seed=seed(4)))


# --- none ---------------------------------------------------------------------------------------


def test_none_is_identity() -> None:
    grads = sample_grads()
    out = make_defense("none")(grads, seed=seed(0))
    assert out is not grads
    assert_same(out, grads)


# --- clip ---------------------------------------------------------------------------------------


def test_clip_hand_computed() -> None:
    (out,) = make_defense("clip", norm=5.0)([tf.constant([-6.0, 8.0])], seed=seed(0))
    np.testing.assert_allclose(out.numpy(), [-3.0, 4.0], rtol=1e-6)


def test_clip_below_bound_unchanged() -> None:
    g = tf.constant([[0.3, -0.4], [1.2, 0.0]])  # norm 1.3
    (out,) = make_defense("clip", norm=2.0)([g], seed=seed(0))
    np.testing.assert_array_equal(out.numpy(), g.numpy())


def test_clip_uses_global_norm() -> None:
    a, b = make_defense("clip", norm=2.5)([tf.constant([3.0]), tf.constant([4.0])], seed=seed(0))
    np.testing.assert_allclose(a.numpy(), [1.5], rtol=1e-6)
    np.testing.assert_allclose(b.numpy(), [2.0], rtol=1e-6)


def test_clip_matches_tf_clip_by_global_norm() -> None:
    grads = sample_grads()
    expected, _ = tf.clip_by_global_norm(grads, 0.7)
    assert_same(make_defense("clip", norm=0.7)(grads, seed=seed(0)), expected)
    global_norm = float(tf.linalg.global_norm(make_defense("clip", norm=0.7)(grads, seed=seed(0))))
    assert global_norm == pytest.approx(0.7, rel=1e-5)


# --- prune --------------------------------------------------------------------------------------


def prune(values: Any, ratio: float) -> np.ndarray:
    (out,) = make_defense("prune", ratio=ratio)([tf.constant(values, tf.float32)], seed=seed(0))
    return out.numpy()


def test_prune_hand_computed() -> None:
    np.testing.assert_array_equal(
        prune([0.1, -0.5, 0.3, -0.05], 0.5), np.float32([0.0, -0.5, 0.3, 0.0])
    )


def test_prune_counts_floor_of_ratio_times_size() -> None:
    # 5 entries at ratio 0.5: floor(2.5) = 2 zeroed, the rest passed through unchanged.
    np.testing.assert_array_equal(
        prune([0.4, -0.1, 0.3, 0.2, -0.5], 0.5), np.float32([0.4, 0.0, 0.3, 0.0, -0.5])
    )
    # 0.3 * 3 = 0.9 -> nothing pruned.
    np.testing.assert_array_equal(prune([1.0, 2.0, 3.0], 0.3), np.float32([1.0, 2.0, 3.0]))


def test_prune_decimal_ratio_is_not_lost_to_round_off() -> None:
    # 0.29 * 100 is 28.999999999999996 in floating point; the intended count is 29.
    values = np.arange(1, 101, dtype=np.float32)
    out = prune(values, 0.29)
    assert int(np.sum(out == 0)) == 29
    np.testing.assert_array_equal(out[29:], values[29:])


def test_prune_ties_broken_by_position() -> None:
    np.testing.assert_array_equal(
        prune([0.2, -0.2, 0.2, 0.5], 0.5), np.float32([0.0, 0.0, 0.2, 0.5])
    )
    np.testing.assert_array_equal(prune([-1.0, 1.0, -1.0], 0.34), np.float32([0.0, 1.0, -1.0]))
    # Row-major position in a 2-D tensor: the tie at [0, 1] goes before the one at [1, 0].
    np.testing.assert_array_equal(
        prune([[3.0, 1.0], [1.0, 2.0]], 0.25), np.float32([[3.0, 0.0], [1.0, 2.0]])
    )


def test_prune_zero_is_identity_and_one_is_zeros() -> None:
    grads = sample_grads()
    assert_same(make_defense("prune", ratio=0)(grads, seed=seed(0)), grads)
    for out in make_defense("prune", ratio=1)(grads, seed=seed(0)):
        assert not np.any(out.numpy())


def test_prune_is_per_tensor() -> None:
    small = tf.constant([0.01, 0.02, 0.03, 0.04])
    large = tf.constant([10.0, 20.0, 30.0, 40.0])
    a, b = make_defense("prune", ratio=0.5)([small, large], seed=seed(0))
    np.testing.assert_array_equal(a.numpy(), np.float32([0.0, 0.0, 0.03, 0.04]))
    np.testing.assert_array_equal(b.numpy(), np.float32([0.0, 0.0, 30.0, 40.0]))


@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.9])
def test_prune_exact_mask_on_random_tensor(ratio: float) -> None:
    rng = np.random.default_rng(3)
    g = rng.normal(size=(7, 11)).astype(np.float32)
    out = prune(g, ratio)
    k = math.floor(ratio * g.size)
    order = np.argsort(np.abs(g).ravel(), kind="stable")
    expected = g.ravel().copy()
    expected[order[:k]] = 0.0
    np.testing.assert_array_equal(out.ravel(), expected)


# --- noise --------------------------------------------------------------------------------------

N_DRAWS = 200_000


def noise_of(defense: Defense, s: tf.Tensor, offset: float = 0.25) -> np.ndarray:
    # A non-zero gradient checks that the noise is added to it rather than replacing it.
    g = tf.fill([N_DRAWS], tf.constant(offset, tf.float32))
    (out,) = defense([g], seed=s)
    return out.numpy().astype(np.float64) - offset


@pytest.mark.parametrize("sigma", [0.01, 1.0, 3.0])
def test_gaussian_std_and_mean(sigma: float) -> None:
    noise = noise_of(make_defense("gaussian", sigma=sigma), seed(42))
    assert noise.std() == pytest.approx(sigma, rel=0.01)
    assert abs(noise.mean()) < 5 * sigma / math.sqrt(N_DRAWS)
    assert np.mean(np.abs(noise) < sigma) == pytest.approx(0.6827, abs=0.005)


@pytest.mark.parametrize("b", [0.01, 1.0, 3.0])
def test_laplace_std_mean_and_mad(b: float) -> None:
    defense = make_defense("laplace", b=b)
    noise = noise_of(defense, seed(42))
    assert np.all(np.isfinite(noise))
    assert noise.std() == pytest.approx(b * math.sqrt(2.0), rel=0.02)
    assert defense.std == pytest.approx(b * math.sqrt(2.0))
    assert abs(noise.mean()) < 5 * b * math.sqrt(2.0 / N_DRAWS)
    assert np.mean(np.abs(noise)) == pytest.approx(b, rel=0.02)
    # P(|x| > b) = exp(-1) tells Laplace apart from a Gaussian of the same std (0.480).
    assert np.mean(np.abs(noise) > b) == pytest.approx(math.exp(-1.0), abs=0.005)


@pytest.mark.parametrize("name", ["gaussian", "laplace"])
def test_noise_independent_across_tensors(name: str) -> None:
    key = "sigma" if name == "gaussian" else "b"
    zeros = tf.zeros([10_000])
    a, b = make_defense(name, **{key: 1.0})([zeros, zeros], seed=seed(5))
    assert abs(np.corrcoef(a.numpy(), b.numpy())[0, 1]) < 0.05


@pytest.mark.parametrize("name,key", [("gaussian", "sigma"), ("laplace", "b")])
def test_zero_scale_is_identity(name: str, key: str) -> None:
    grads = sample_grads()
    assert_same(make_defense(name, **{key: 0.0})(grads, seed=seed(3)), grads)


def test_gaussian_noise_matches_stateless_normal() -> None:
    grads = sample_grads()
    out = make_defense("gaussian", sigma=0.5)(grads, seed=seed(9, 2))
    for i, (g, o) in enumerate(zip(grads, out, strict=True)):
        noise = tf.random.stateless_normal(g.shape, seed=tensor_seed(seed(9, 2), i), stddev=0.5)
        np.testing.assert_allclose(o.numpy(), (g + noise).numpy(), rtol=0, atol=1e-6)


def test_noise_on_half_precision_is_not_degenerate() -> None:
    (out,) = make_defense("laplace", b=1.0)([tf.zeros([50_000], tf.float16)], seed=seed(1))
    noise = out.numpy().astype(np.float64)
    assert noise.std() == pytest.approx(math.sqrt(2.0), rel=0.03)


# --- chain --------------------------------------------------------------------------------------

CLIP_THEN_NOISE = [{"name": "clip", "norm": 1.0}, {"name": "gaussian", "sigma": 0.01}]


def test_chain_equals_manual_composition() -> None:
    chain = make_defense("chain", steps=CLIP_THEN_NOISE)
    grads = sample_grads()
    s = seed(123, 4)
    clipped = ClipGlobalNorm(norm=1.0)(grads, seed=tensor_seed(s, 0))
    expected = GaussianNoise(sigma=0.01)(clipped, seed=tensor_seed(s, 1))
    assert_same(chain(grads, seed=s), expected)
    # The clip really acted: the input norm is well above 1.
    assert float(tf.linalg.global_norm(grads)) > 2.0


def test_chain_steps_get_distinct_seeds() -> None:
    # Two identical noise steps must not add the same noise twice.
    chain = make_defense("chain", steps=[{"name": "gaussian", "sigma": 1.0}] * 2)
    zeros = [tf.zeros([20_000])]
    (out,) = chain(zeros, seed=seed(8))
    assert out.numpy().std() == pytest.approx(math.sqrt(2.0), rel=0.03)


def test_chain_params_canonical_form() -> None:
    chain = make_defense(
        "chain", steps=[{"name": "clip", "norm": 1}, {"name": "prune", "ratio": 0.25}]
    )
    assert chain.params() == {
        "steps": [{"name": "clip", "norm": 1.0}, {"name": "prune", "ratio": 0.25}]
    }
    assert isinstance(chain.params()["steps"][0]["norm"], float)
    assert chain == Chain(steps=(ClipGlobalNorm(norm=1.0), Prune(ratio=0.25)))
    assert chain.steps == (ClipGlobalNorm(norm=1.0), Prune(ratio=0.25))


def test_chain_from_instances_accepts_list() -> None:
    chain = Chain(steps=[ClipGlobalNorm(norm=1.0), LaplaceNoise(b=0.1)])  # type: ignore[arg-type]
    assert isinstance(chain.steps, tuple)
    hash(chain)


@dataclasses.dataclass(frozen=True)
class _PerExample(Defense):
    """An unregistered example-level defense for the level rule. Reference: none (test)."""

    name: ClassVar[str] = "per_example_test"
    level: ClassVar[str] = "example"

    def __call__(self, grads: list[tf.Tensor], *, seed: tf.Tensor) -> list[tf.Tensor]:
        return list(grads)


def test_chain_level() -> None:
    assert make_defense("chain", steps=CLIP_THEN_NOISE).level == "batch"
    assert Chain(steps=(ClipGlobalNorm(norm=1.0), _PerExample())).level == "example"
    assert Chain(steps=(_PerExample(),)).level == "example"
    assert Chain.level == "batch"


@pytest.mark.parametrize(
    "params,fragments",
    [
        ({}, ["steps", "required"]),
        ({"steps": CLIP_THEN_NOISE, "seed": 1}, ["unknown", "seed"]),
        ({"steps": []}, ["steps", "non-empty"]),
        ({"steps": {"name": "clip", "norm": 1.0}}, ["steps", "non-empty list"]),
        ({"steps": "clip"}, ["steps", "non-empty list"]),
        ({"steps": [{"name": "clip", "norm": 1.0}, "gaussian"]}, ["steps[1]", "table"]),
        ({"steps": [{"norm": 1.0}]}, ["steps[0]", "name"]),
        ({"steps": [{"name": 3}]}, ["steps[0]", "name"]),
        ({"steps": [{"name": "clip", "norm": 1.0}, {"name": "nope"}]}, ["steps[1]", "nope"]),
        (
            {"steps": [{"name": "clip", "norm": 1.0}, {"name": "gaussian", "sigma": -1.0}]},
            ["steps[1]", "gaussian", "sigma"],
        ),
        ({"steps": [{"name": "clip"}]}, ["steps[0]", "clip", "norm", "required"]),
        ({"steps": [{"name": "prune", "ratio": 0.1, "k": 3}]}, ["steps[0]", "prune", "'k'"]),
        ({"steps": [{"name": "chain", "steps": CLIP_THEN_NOISE}]}, ["steps[0]", "nest"]),
    ],
)
def test_chain_from_params_errors(params: dict[str, Any], fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        make_defense("chain", **params)
    message = str(info.value)
    assert "chain" in message
    for fragment in fragments:
        assert fragment in message


def test_chain_direct_construction_errors() -> None:
    with pytest.raises(ConfigError, match="non-empty"):
        Chain(steps=())
    with pytest.raises(ConfigError, match=r"steps\[1\].*Defense"):
        Chain(steps=(ClipGlobalNorm(norm=1.0), {"name": "gaussian"}))  # type: ignore[arg-type]
    inner = Chain(steps=(ClipGlobalNorm(norm=1.0),))
    with pytest.raises(ConfigError, match=r"steps\[0\].*nest"):
        Chain(steps=(inner,))


# --- parameter validation -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,params,param",
    [
        ("gaussian", {"sigma": -1.0}, "sigma"),
        ("gaussian", {"sigma": float("nan")}, "sigma"),
        ("gaussian", {"sigma": float("inf")}, "sigma"),
        ("gaussian", {"sigma": True}, "sigma"),
        ("gaussian", {"sigma": "0.1"}, "sigma"),
        ("gaussian", {}, "sigma"),
        ("gaussian", {"sigma": 0.1, "variance": 0.01}, "variance"),
        ("laplace", {"b": -0.1}, "b"),
        ("laplace", {"b": None}, "b"),
        ("laplace", {}, "b"),
        ("prune", {"ratio": 1.5}, "ratio"),
        ("prune", {"ratio": -0.1}, "ratio"),
        ("prune", {"ratio": "0.5"}, "ratio"),
        ("prune", {"ratio": False}, "ratio"),
        ("clip", {"norm": 0.0}, "norm"),
        ("clip", {"norm": -1.0}, "norm"),
        ("clip", {"norm": True}, "norm"),
        ("clip", {}, "norm"),
        ("clip", {"norm": 1.0, "ratio": 0.5}, "ratio"),
        ("none", {"sigma": 0.1}, "sigma"),
    ],
)
def test_invalid_params_raise(name: str, params: dict[str, Any], param: str) -> None:
    with pytest.raises(ConfigError) as info:
        make_defense(name, **params)
    message = str(info.value)
    assert f"defense {name}" in message
    assert param in message


@pytest.mark.parametrize(
    "cls,kwargs,param",
    [
        (GaussianNoise, {"sigma": -0.5}, "sigma"),
        (LaplaceNoise, {"b": -0.5}, "b"),
        (Prune, {"ratio": 2}, "ratio"),
        (ClipGlobalNorm, {"norm": 0}, "norm"),
    ],
)
def test_direct_construction_validates(
    cls: type[Defense], kwargs: dict[str, Any], param: str
) -> None:
    with pytest.raises(ConfigError, match=f"defense {cls.name}: {param}"):
        cls(**kwargs)


def test_boundary_values_accepted_and_stored_as_float() -> None:
    assert make_defense("prune", ratio=1).params() == {"ratio": 1.0}
    assert isinstance(make_defense("prune", ratio=0).ratio, float)
    assert make_defense("gaussian", sigma=0).params() == {"sigma": 0.0}
    assert make_defense("clip", norm=1e-12).norm == 1e-12
    assert make_defense("gaussian", sigma=1) == make_defense("gaussian", sigma=1.0)
