"""Tests of the gradient defenses: the registry-wide contract and hand-computed values."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
from typing import Any, ClassVar

import numpy as np
import pytest
import tensorflow as tf

from leakbench.core.errors import ConfigError
from leakbench.defenses import DEFENSES, ClientView, Defense, Sample, make_defense
from leakbench.defenses.base import tensor_seed
from leakbench.defenses.chain import Chain
from leakbench.defenses.clip import ClipGlobalNorm
from leakbench.defenses.dpsgd import DPSGD
from leakbench.defenses.gaussian import GaussianNoise
from leakbench.defenses.laplace import LaplaceNoise
from leakbench.defenses.prune import Prune
from leakbench.defenses.relative_noise import percentile_of_magnitudes
from leakbench.defenses.topk import TopK

NAMES = DEFENSES.names()


def samples_of(name: str) -> tuple[Sample, ...]:
    """The contract-test samples ``name`` declares on its class, or a failure that says so."""
    samples = DEFENSES.get(name).samples
    if not samples:
        pytest.fail(
            f"defense {name!r} declares no samples: set samples = (Sample({{...}}),) on its class "
            "(the configurations the contract tests build)"
        )
    return samples


# Every registered defense with each of its samples: (name, index), index 0 first.
CASES = [
    pytest.param(name, i, id=name if i == 0 else f"{name}-{i}")
    for name in NAMES
    for i in range(max(1, len(DEFENSES.get(name).samples)))
]


def sample_of(name: str, index: int = 0) -> Sample:
    return samples_of(name)[index]


def sample_params(name: str, index: int = 0) -> dict[str, Any]:
    return dict(sample_of(name, index).params)


VARIABLE_SHAPES = [(3, 4), (5,), (2, 2, 1, 3), ()]
EXAMPLES = 3  # batch size of the per-example gradients fed to example-level defenses


def sample_grads(dtype: tf.DType = tf.float32) -> list[tf.Tensor]:
    """Gradients shaped like a tiny model's: kernel, bias, 4-D kernel and a scalar."""
    rng = np.random.default_rng(0)
    return [tf.constant(rng.normal(size=s), dtype=dtype) for s in VARIABLE_SHAPES]


def sample_per_example_grads(dtype: tf.DType = tf.float32) -> list[tf.Tensor]:
    """Per-example gradients of the same variables: a leading batch axis of `EXAMPLES`."""
    rng = np.random.default_rng(1)
    return [tf.constant(rng.normal(size=(EXAMPLES, *s)), dtype=dtype) for s in VARIABLE_SHAPES]


def sample_input(defense: Defense, dtype: tf.DType = tf.float32) -> list[tf.Tensor]:
    """What the contract says ``defense`` receives: per-example gradients if example-level."""
    if defense.level == "example":
        return sample_per_example_grads(dtype)
    return sample_grads(dtype)


def stand_in_view(grads: list[tf.Tensor]) -> ClientView | None:
    """A client view for defenses that read one (Soteria): one example whose representation
    unit ``f`` is ``2 * x_f`` with ``x_f = f + 1``, as many units as ``grads[0]`` has rows."""
    if not grads:
        return None
    units = tf.shape(grads[0])[0]
    images = tf.cast(tf.range(1, units + 1), tf.float32)[None, :]
    return ClientView(images=images, representation=lambda x: 2.0 * x, head_kernel=0)


def call(defense: Defense, grads: list[tf.Tensor], *, seed: tf.Tensor) -> list[tf.Tensor]:
    """The defended gradient as the client computes it (`Defense.apply`, with a view for the
    defenses that need one)."""
    view = stand_in_view(grads) if defense.needs_view else None
    return defense.apply(grads, seed=seed, view=view)


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


@pytest.mark.parametrize("name", NAMES)
def test_every_defense_declares_samples(name: str) -> None:
    for sample in samples_of(name):
        assert isinstance(sample, Sample)


def test_expected_defenses_are_registered() -> None:
    expected = {"none", "gaussian", "laplace", "clip", "prune", "chain"}
    expected |= {"dpsgd", "fp16", "int8", "topk"}
    assert expected <= set(NAMES)
    assert DEFENSES.get("dpsgd").level == "example"


@pytest.mark.parametrize(("name", "index"), CASES)
def test_epsilon_only_for_dp_defenses(name: str, index: int) -> None:
    params = sample_params(name, index)
    epsilon = make_defense(name, **params).epsilon(0.01, 100, 1e-5)
    if name == "dpsgd" or any(step["name"] == "dpsgd" for step in params.get("steps", [])):
        assert isinstance(epsilon, float) and 0.0 < epsilon < math.inf
    else:
        assert epsilon is None


@pytest.mark.parametrize("name", NAMES)
def test_class_metadata(name: str) -> None:
    cls = DEFENSES.get(name)
    assert issubclass(cls, Defense)
    assert dataclasses.is_dataclass(cls)
    assert cls.name == name
    assert cls.level in {"batch", "example"}
    # The conventions ask every defense to cite its paper.
    assert cls.__doc__ and "Reference:" in cls.__doc__


@pytest.mark.parametrize(("name", "index"), CASES)
def test_frozen_hashable_and_params_round_trip(name: str, index: int) -> None:
    defense = make_defense(name, **sample_params(name, index))
    assert defense.level in {"batch", "example"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        defense.foo = 1  # type: ignore[attr-defined]
    hash(defense)
    params = defense.params()
    json.dumps(params, sort_keys=True)  # canonical keys need JSON-able params
    assert make_defense(name, **params) == defense
    assert make_defense(name, **params).params() == params


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64, tf.float16])
@pytest.mark.parametrize(("name", "index"), CASES)
def test_structure_shapes_and_dtypes_preserved(name: str, index: int, dtype: tf.DType) -> None:
    # Every defense returns the batch gradient: variable shapes, also from per-example input.
    defense = make_defense(name, **sample_params(name, index))
    grads = sample_input(defense, dtype)
    out = call(defense, grads, seed=seed(1))
    assert isinstance(out, list)
    assert len(out) == len(grads)
    for g, o, shape in zip(grads, out, VARIABLE_SHAPES, strict=True):
        assert o.shape == shape
        assert o.dtype == g.dtype
        assert np.all(np.isfinite(o.numpy()))


@pytest.mark.parametrize(("name", "index"), CASES)
def test_empty_gradient_list(name: str, index: int) -> None:
    assert call(make_defense(name, **sample_params(name, index)), [], seed=seed(0)) == []


@pytest.mark.parametrize("seed_dtype", [tf.int32, tf.int64])
@pytest.mark.parametrize(("name", "index"), CASES)
def test_same_seed_same_output(name: str, index: int, seed_dtype: tf.DType) -> None:
    defense = make_defense(name, **sample_params(name, index))
    grads = sample_input(defense)
    assert_same(
        call(defense, grads, seed=seed(7, 3, seed_dtype)),
        call(defense, grads, seed=seed(7, 3, seed_dtype)),
    )


@pytest.mark.parametrize(("name", "index"), CASES)
def test_seed_dependence(name: str, index: int) -> None:
    defense = make_defense(name, **sample_params(name, index))
    random = sample_of(name, index).seeded
    grads = sample_input(defense)
    outs = [call(defense, grads, seed=seed(s)) for s in (1, 2)]
    outs.append(call(defense, grads, seed=seed(1, 1)))
    if random:
        assert differs(outs[0], outs[1])
        assert differs(outs[0], outs[2])  # the second seed word matters too
    else:
        assert_same(outs[0], outs[1])
        assert_same(outs[0], outs[2])


@pytest.mark.parametrize(("name", "index"), CASES)
def test_traced_once_for_different_seeds(name: str, index: int) -> None:
    defense = make_defense(name, **sample_params(name, index))
    traces = []

    @tf.function
    def step(grads: list[tf.Tensor], s: tf.Tensor) -> list[tf.Tensor]:
        traces.append(1)  # Python side effect: runs only while tracing
        return call(defense, grads, seed=s)

    grads = sample_input(defense)
    outs = [step(grads, seed(s)) for s in range(5)]
    assert len(traces) == 1
    assert step.experimental_get_tracing_count() == 1
    if sample_of(name, index).seeded:
        assert differs(outs[0], outs[1])


@pytest.mark.parametrize(("name", "index"), CASES)
def test_graph_mode_matches_eager(name: str, index: int) -> None:
    defense = make_defense(name, **sample_params(name, index))
    grads = sample_input(defense)
    graph = tf.function(lambda g, s: call(defense, g, seed=s), jit_compile=False)
    assert_same(graph(grads, seed(11, 5)), call(defense, grads, seed=seed(11, 5)))


@pytest.mark.parametrize(("name", "index"), CASES)
def test_unknown_shapes_in_graph(name: str, index: int) -> None:
    # Gradients whose static shape is unknown still work (e.g. a generic tf.function signature).
    # For an example-level defense this is 2 examples of a 5-entry variable.
    defense = make_defense(name, **sample_params(name, index))
    grads = [tf.constant(np.arange(-5.0, 5.0).reshape(2, 5), tf.float32)]
    graph = tf.function(
        lambda g, s: call(defense, g, seed=s),
        input_signature=[
            [tf.TensorSpec(None, tf.float32)],
            tf.TensorSpec([2], tf.int64),
        ],
    )
    assert_same(graph(grads, seed(4)), call(defense, grads, seed=seed(4)))


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


def test_relative_noise_is_scaled_to_the_updates_percentile() -> None:
    grads = sample_grads()
    flat = np.concatenate([np.abs(g.numpy()).ravel() for g in grads])
    for p in (0.0, 50.0, 95.0, 100.0):
        got = float(percentile_of_magnitudes(grads, p))
        assert got == pytest.approx(float(np.percentile(flat, p)), rel=1e-6)
    out = make_defense("relative_noise", sigma=0.5, percentile=95.0)(grads, seed=seed(9, 2))
    unit = float(np.percentile(flat, 95.0))
    for i, (g, o) in enumerate(zip(grads, out, strict=True)):
        noise = tf.random.stateless_normal(g.shape, seed=tensor_seed(seed(9, 2), i))
        np.testing.assert_allclose(o.numpy(), (g + 0.5 * unit * noise).numpy(), atol=1e-5)
    # Scaling the update scales the noise with it: the same seed gives a scaled output.
    big = make_defense("relative_noise", sigma=0.5)([g * 1000.0 for g in grads], seed=seed(9, 2))
    for o, b in zip(out, big, strict=True):
        np.testing.assert_allclose(b.numpy(), 1000.0 * o.numpy(), rtol=1e-4, atol=1e-3)


def test_noise_on_half_precision_is_not_degenerate() -> None:
    (out,) = make_defense("laplace", b=1.0)([tf.zeros([50_000], tf.float16)], seed=seed(1))
    noise = out.numpy().astype(np.float64)
    assert noise.std() == pytest.approx(math.sqrt(2.0), rel=0.03)


# --- fp16 ---------------------------------------------------------------------------------------


def fp16(values: Any, dtype: tf.DType = tf.float32) -> np.ndarray:
    (out,) = make_defense("fp16")([tf.constant(values, dtype)], seed=seed(0))
    assert out.dtype == dtype
    return out.numpy()


def test_fp16_hand_computed() -> None:
    out = fp16([1e-8, 70000.0, -70000.0, 65504.0, 1.0, 1.0 / 3.0, 1.0 + 2.0**-12])
    # 1e-8 is below half of float16's smallest subnormal (2**-24 ~ 6e-8): flushed to zero.
    # 70000 is beyond float16's largest value 65504: infinite, as documented.
    np.testing.assert_array_equal(out[:5], np.float32([0.0, np.inf, -np.inf, 65504.0, 1.0]))
    # 1/3 keeps 11 significant bits: 0.333251953125 = 1365 / 4096.
    assert out[5] == np.float32(1365.0 / 4096.0)
    # 1 + 2**-12 is a tie between 1 and 1 + 2**-10: to even, i.e. 1.
    assert out[6] == 1.0


def test_fp16_matches_numpy_for_every_dtype() -> None:
    values = np.random.default_rng(2).normal(scale=10.0, size=1000)
    for dtype in (tf.float32, tf.float64):
        expected = values.astype(dtype.as_numpy_dtype).astype(np.float16)
        np.testing.assert_array_equal(fp16(values, dtype), expected.astype(dtype.as_numpy_dtype))
    half = values.astype(np.float16)
    np.testing.assert_array_equal(fp16(half, tf.float16), half)


# --- int8 ---------------------------------------------------------------------------------------


def int8(values: Any) -> np.ndarray:
    (out,) = make_defense("int8")([tf.constant(values, tf.float32)], seed=seed(0))
    return out.numpy()


def test_int8_hand_computed() -> None:
    # max |g| = 1, scale = 1/127: q = round([63.5, -127, 31.75]) = [64, -127, 32] (63.5 to even).
    np.testing.assert_allclose(
        int8([0.5, -1.0, 0.25]), np.float32([64.0, -127.0, 32.0]) / 127.0, rtol=1e-6, atol=0
    )
    # Scale 2/127: 0.01 is q = round(0.635) = 1, i.e. 2/127; 2 and -2 are exact.
    np.testing.assert_allclose(
        int8([0.01, 2.0, -2.0, 0.0]), np.float32([2.0, 254.0, -254.0, 0.0]) / 127.0, rtol=1e-6
    )


def test_int8_zero_tensor_stays_zero() -> None:
    out = int8(np.zeros((3, 2)))
    assert np.all(np.isfinite(out))
    np.testing.assert_array_equal(out, np.zeros((3, 2), np.float32))


def test_int8_grid_and_error_bound_per_tensor() -> None:
    rng = np.random.default_rng(5)
    small = rng.normal(scale=1e-3, size=(40, 25)).astype(np.float32)
    large = rng.normal(scale=1e3, size=(1000,)).astype(np.float32)
    outs = make_defense("int8")([tf.constant(small), tf.constant(large)], seed=seed(0))
    for g, out in zip((small, large), outs, strict=True):
        scale = np.abs(g).max() / 127.0  # one scale per tensor
        q = out.numpy() / scale
        np.testing.assert_allclose(q, np.round(q), atol=1e-3)  # integers ...
        assert np.abs(q).max() == pytest.approx(127.0)  # ... in [-127, 127]
        assert len(np.unique(np.round(q))) <= 255
        assert np.abs(out.numpy() - g).max() <= scale * (0.5 + 1e-4)


# --- topk ---------------------------------------------------------------------------------------


def topk(tensors: list[Any], fraction: float) -> list[np.ndarray]:
    grads = [tf.constant(t, tf.float32) for t in tensors]
    return [o.numpy() for o in make_defense("topk", fraction=fraction)(grads, seed=seed(0))]


def test_topk_exact_mask_across_two_tensors() -> None:
    # 7 entries, fraction 0.5: k = ceil(3.5) = 4 over both tensors together: 0.9, 0.7, 0.4, 0.3.
    a, b = topk([[0.1, -0.9, 0.3], [[0.05, 0.7], [-0.4, 0.2]]], 0.5)
    np.testing.assert_array_equal(a, np.float32([0.0, -0.9, 0.3]))
    np.testing.assert_array_equal(b, np.float32([[0.0, 0.7], [-0.4, 0.0]]))
    # k = ceil(0.3 * 7) = 3: the global selection can empty a whole tensor.
    a, b = topk([[0.01, -0.02], [5.0, -3.0, 4.0, 1.0, 2.0]], 0.3)
    np.testing.assert_array_equal(a, np.float32([0.0, 0.0]))
    np.testing.assert_array_equal(b, np.float32([5.0, -3.0, 4.0, 0.0, 0.0]))


def test_topk_ties_broken_by_position_across_tensors() -> None:
    # k = ceil(0.5 * 7) = 4: the 0.5 and then the first three of the four 0.2s in list order.
    a, b = topk([[0.2, -0.2, 0.2], [[0.5, 0.2], [0.1, 0.0]]], 0.5)
    np.testing.assert_array_equal(a, np.float32([0.2, -0.2, 0.2]))
    np.testing.assert_array_equal(b, np.float32([[0.5, 0.0], [0.0, 0.0]]))
    a, b = topk([[1.0, 1.0], [-1.0, 1.0]], 0.75)
    np.testing.assert_array_equal(a, np.float32([1.0, 1.0]))
    np.testing.assert_array_equal(b, np.float32([-1.0, 0.0]))


def test_topk_count_rounding() -> None:
    values = np.arange(1, 101, dtype=np.float32)
    # 0.07 * 100 is 7.000000000000001 in floating point; the intended count is 7, not 8.
    (out,) = topk([values], 0.07)
    assert int(np.count_nonzero(out)) == 7
    np.testing.assert_array_equal(out[93:], values[93:])
    # 0.29 * 100 = 28.999999999999996 -> 29; 0.291 * 100 -> ceil(29.1) = 30.
    assert int(np.count_nonzero(topk([values], 0.29)[0])) == 29
    assert int(np.count_nonzero(topk([values], 0.291)[0])) == 30
    # A tiny fraction still keeps one entry (the largest).
    (out,) = topk([values], 1e-9)
    np.testing.assert_array_equal(np.flatnonzero(out), [99])


def test_topk_one_is_identity() -> None:
    grads = sample_grads()
    assert_same(make_defense("topk", fraction=1.0)(grads, seed=seed(0)), grads)


@pytest.mark.parametrize("fraction", [0.01, 0.25, 0.9])
def test_topk_exact_mask_on_random_tensors(fraction: float) -> None:
    rng = np.random.default_rng(4)
    tensors = [rng.normal(size=(7, 11)), rng.normal(scale=3.0, size=(13,))]
    tensors = [t.astype(np.float32) for t in tensors]
    outs = topk(tensors, fraction)
    flat = np.concatenate([t.ravel() for t in tensors])
    k = math.ceil(fraction * flat.size - 1e-6)
    order = np.argsort(-np.abs(flat), kind="stable")
    expected = np.zeros_like(flat)
    expected[order[:k]] = flat[order[:k]]
    np.testing.assert_array_equal(np.concatenate([o.ravel() for o in outs]), expected)


# --- dpsgd --------------------------------------------------------------------------------------


def test_dpsgd_clips_per_example_not_per_batch() -> None:
    # Two examples, gradients over two tensors: example 0 is an outlier with norm 100 over both
    # tensors ([60] and [80, 0]); example 1 has norm 0.5 ([0.3] and [0, -0.4]). Clip norm 1.
    a = tf.constant([[60.0], [0.3]])
    b = tf.constant([[80.0, 0.0], [0.0, -0.4]])
    out_a, out_b = DPSGD(norm=1.0, noise_multiplier=0.0)([a, b], seed=seed(0))
    # (outlier / 100 + small) / 2: the outlier is scaled to norm 1, the small one is untouched.
    np.testing.assert_allclose(out_a.numpy(), [(0.6 + 0.3) / 2], rtol=1e-6, atol=0)
    np.testing.assert_allclose(out_b.numpy(), [(0.8 + 0.0) / 2, (0.0 - 0.4) / 2], rtol=1e-6)
    # Clipping the batch mean instead would let the outlier drown the small example: its
    # -0.2 entry would shrink to about -0.004.
    batch_a, batch_b = ClipGlobalNorm(norm=1.0)(
        [tf.reduce_mean(a, 0), tf.reduce_mean(b, 0)], seed=seed(0)
    )
    assert abs(float(batch_b[1])) < 0.01
    assert abs(float(batch_a[0]) - 0.45) > 0.1


def test_dpsgd_without_clipping_or_noise_is_the_mean() -> None:
    grads = sample_per_example_grads()
    out = DPSGD(norm=1e6, noise_multiplier=0.0)(grads, seed=seed(0))
    for g, o in zip(grads, out, strict=True):
        np.testing.assert_allclose(o.numpy(), np.mean(g.numpy(), axis=0), rtol=1e-5, atol=1e-7)


def test_dpsgd_refuses_batch_gradients() -> None:
    # Variable-shaped gradients (no common batch axis) are a caller error, caught statically.
    with pytest.raises(ValueError, match="example-level.*defended_gradients"):
        DPSGD(norm=1.0, noise_multiplier=1.0)(sample_grads(), seed=seed(0))


def test_dpsgd_zero_gradient_example_is_finite() -> None:
    grads = [tf.constant([[0.0, 0.0], [3.0, 4.0]])]
    (out,) = DPSGD(norm=1.0, noise_multiplier=0.0)(grads, seed=seed(0))
    np.testing.assert_allclose(out.numpy(), [0.3, 0.4], rtol=1e-6)


def test_dpsgd_noise_matches_stateless_normal() -> None:
    grads = sample_per_example_grads()
    s = seed(9, 2)
    out = DPSGD(norm=0.5, noise_multiplier=2.0)(grads, seed=s)
    clipped_mean = DPSGD(norm=0.5, noise_multiplier=0.0)(grads, seed=s)
    for j, (c, o) in enumerate(zip(clipped_mean, out, strict=True)):
        noise = tf.random.stateless_normal(c.shape, seed=tensor_seed(s, j), stddev=1.0)
        expected = c.numpy() + noise.numpy() / EXAMPLES
        np.testing.assert_allclose(o.numpy(), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("multiplier,norm,batch", [(1.1, 2.0, 4), (0.5, 1.0, 1)])
def test_dpsgd_noise_std_on_the_mean(multiplier: float, norm: float, batch: int) -> None:
    # Per-example gradients of norm 0.01 (never clipped), so the mean is known: 0.01 / sqrt(n).
    n = 50_000
    g = tf.fill([batch, n], 0.01 / math.sqrt(n))
    (out,) = DPSGD(norm=norm, noise_multiplier=multiplier)([g], seed=seed(42))
    noise = out.numpy().astype(np.float64) - 0.01 / math.sqrt(n)
    std = multiplier * norm / batch  # absolute std z * C on the sum, divided by B
    assert noise.std() == pytest.approx(std, rel=0.02)
    assert abs(noise.mean()) < 5 * std / math.sqrt(n)


def reference_epsilon(multiplier: float, rate: float, steps: int, delta: float) -> float:
    """Independent use of dp-accounting's RDP accountant, as its documentation shows."""
    import dp_accounting

    accountant = dp_accounting.rdp.RdpAccountant()
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(multiplier)),
        steps,
    )
    accountant.compose(event)
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize(
    "multiplier,rate,steps,delta",
    [(1.1, 256 / 60_000, 10_000, 1e-5), (0.8, 0.01, 500, 1e-6), (4.0, 0.1, 50, 1e-5)],
)
def test_dpsgd_epsilon_matches_dp_accounting(
    multiplier: float, rate: float, steps: int, delta: float
) -> None:
    epsilon = DPSGD(norm=1.0, noise_multiplier=multiplier).epsilon(rate, steps, delta)
    assert epsilon == pytest.approx(reference_epsilon(multiplier, rate, steps, delta), rel=1e-9)
    assert 0.0 < epsilon < math.inf


def test_dpsgd_epsilon_in_the_published_range() -> None:
    # MNIST-style DP-SGD (60000 examples, batch 256, z = 1.12, 60 epochs, delta 1e-5): Opacus's
    # compute_dp_sgd_privacy documents epsilon 2.95 with the RDP orders 10, 20, 100 only and
    # the classic RDP-to-DP conversion; dp-accounting's denser orders and tighter conversion
    # can only give less (2.52 here), not much less.
    epsilon = DPSGD(norm=1.0, noise_multiplier=1.12).epsilon(256 / 60_000, 60 * 60_000 // 256, 1e-5)
    assert 2.2 < epsilon <= 2.95


def test_dpsgd_epsilon_monotone_and_edge_cases() -> None:
    rate, steps, delta = 256 / 60_000, 10_000, 1e-5
    eps = [DPSGD(norm=1.0, noise_multiplier=z).epsilon(rate, steps, delta) for z in (0.7, 1.1, 2.0)]
    assert eps[0] > eps[1] > eps[2]
    # The clip norm does not enter the guarantee (noise is relative to it).
    assert DPSGD(norm=5.0, noise_multiplier=1.1).epsilon(rate, steps, delta) == eps[1]
    dp = DPSGD(norm=1.0, noise_multiplier=1.1)
    assert dp.epsilon(rate, 2 * steps, delta) > eps[1]
    assert dp.epsilon(rate, 0, delta) == 0.0
    assert DPSGD(norm=1.0, noise_multiplier=0.0).epsilon(rate, steps, delta) == math.inf


@pytest.mark.parametrize(
    "args,param",
    [
        ((0.0, 10, 1e-5), "sampling_rate"),
        ((1.5, 10, 1e-5), "sampling_rate"),
        ((0.1, -1, 1e-5), "steps"),
        ((0.1, 2.5, 1e-5), "steps"),
        ((0.1, 10, 0.0), "delta"),
        ((0.1, 10, 1.0), "delta"),
    ],
)
def test_dpsgd_epsilon_validates(args: tuple[Any, ...], param: str) -> None:
    with pytest.raises(ConfigError, match=f"defense dpsgd: {param}"):
        DPSGD(norm=1.0, noise_multiplier=1.0).epsilon(*args)


def test_dpsgd_reconstruction_bound_is_the_gaussian_trade_off() -> None:
    # One Gaussian release at noise multiplier 1 is 1-GDP; an attacker with prior success
    # 1e-3 succeeds with chance at most Phi(Phi^-1(1e-3) + 1) = Phi(-2.0902) = 0.01830.
    dp = DPSGD(norm=1.0, noise_multiplier=1.0)
    assert dp.reconstruction_bound(1e-3) == pytest.approx(0.01830, abs=1e-5)
    # Four clients' noise adds up: the same as one client at multiplier 2,
    # Phi(-3.0902 + 0.5) = 0.004796.
    assert dp.reconstruction_bound(1e-3, clients=4) == pytest.approx(0.004796, abs=1e-5)
    four = DPSGD(norm=3.0, noise_multiplier=2.0).reconstruction_bound(1e-3)
    assert dp.reconstruction_bound(1e-3, clients=4) == pytest.approx(four, rel=1e-9)


def test_dpsgd_reconstruction_bound_at_mu_2_and_over_several_releases() -> None:
    # Noise multiplier 0.5 is 2-GDP: Phi(Phi^-1(1e-3) + 2) = Phi(-1.0902) = 0.1378 (the
    # 13.8% that issue 67 cites for a prior of 1/1000).
    assert DPSGD(norm=1.0, noise_multiplier=0.5).reconstruction_bound(1e-3) == pytest.approx(
        0.13781, abs=1e-4
    )
    # Four noisy local steps at multiplier 1 compose to 2-GDP: the same bound.
    four_steps = DPSGD(norm=1.0, noise_multiplier=1.0).reconstruction_bound(1e-3, releases=4)
    assert four_steps == pytest.approx(0.13781, abs=1e-4)


def test_dpsgd_reconstruction_bound_monotone_and_edge_cases() -> None:
    bounds = [DPSGD(norm=1.0, noise_multiplier=z).reconstruction_bound(1e-3)
              for z in (0.1, 0.2, 0.3, 0.5, 1.0, 4.0)]  # fmt: skip
    assert bounds == sorted(bounds, reverse=True) and bounds[0] > bounds[-1]
    assert all(1e-3 <= b <= 1.0 for b in bounds)
    assert bounds[0] == pytest.approx(1.0, abs=1e-9)  # z = 0.1: the accounting allows anything
    assert DPSGD(norm=1.0, noise_multiplier=0.0).reconstruction_bound(1e-3) == 1.0
    # A likelier prior guess leaves a larger bound.
    dp = DPSGD(norm=1.0, noise_multiplier=0.5)
    assert dp.reconstruction_bound(1e-2) > dp.reconstruction_bound(1e-4)


@pytest.mark.parametrize(
    "args,param", [((0.0,), "kappa"), ((1.0,), "kappa"), ((0.1, 0), "clients")]
)
def test_dpsgd_reconstruction_bound_validates(args: tuple[Any, ...], param: str) -> None:
    with pytest.raises(ConfigError, match=f"defense dpsgd: {param}"):
        DPSGD(norm=1.0, noise_multiplier=1.0).reconstruction_bound(*args)


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
        # Example-level contract: per-example gradients in, the batch gradient out.
        return [tf.reduce_mean(g, axis=0) for g in grads]


def test_chain_level_is_its_first_steps_level() -> None:
    assert make_defense("chain", steps=CLIP_THEN_NOISE).level == "batch"
    assert Chain(steps=(_PerExample(), ClipGlobalNorm(norm=1.0))).level == "example"
    assert Chain(steps=(_PerExample(),)).level == "example"
    assert Chain.level == "batch"


def test_chain_example_level_step_only_first() -> None:
    with pytest.raises(ConfigError, match=r"chain: steps\[1\] \(per_example_test\).*first"):
        Chain(steps=(ClipGlobalNorm(norm=1.0), _PerExample()))
    with pytest.raises(ConfigError, match=r"steps\[2\]"):
        Chain(steps=(_PerExample(), ClipGlobalNorm(norm=1.0), _PerExample()))
    dpsgd_second = [
        {"name": "gaussian", "sigma": 0.1},
        {"name": "dpsgd", "norm": 1.0, "noise_multiplier": 1.0},
    ]
    with pytest.raises(ConfigError, match=r"defense chain: steps\[1\] \(dpsgd\).*first"):
        make_defense("chain", steps=dpsgd_second)


def test_chain_dpsgd_then_batch_steps() -> None:
    # The example-level first step reduces to the batch gradient; later steps act on that.
    steps = [
        {"name": "dpsgd", "norm": 1.0, "noise_multiplier": 0.5},
        {"name": "gaussian", "sigma": 0.01},
        {"name": "topk", "fraction": 0.5},
    ]
    chain = make_defense("chain", steps=steps)
    assert chain.level == "example"
    grads = sample_per_example_grads()
    s = seed(6, 1)
    expected = DPSGD(norm=1.0, noise_multiplier=0.5)(grads, seed=tensor_seed(s, 0))
    expected = GaussianNoise(sigma=0.01)(expected, seed=tensor_seed(s, 1))
    expected = TopK(fraction=0.5)(expected, seed=tensor_seed(s, 2))
    out = chain(grads, seed=s)
    assert [o.shape for o in out] == [tf.TensorShape(shape) for shape in VARIABLE_SHAPES]
    assert_same(out, expected)


def test_chain_epsilon_is_its_dp_steps() -> None:
    dp = DPSGD(norm=1.0, noise_multiplier=1.1)
    chain = Chain(steps=(dp, GaussianNoise(sigma=0.01)))
    args = (0.01, 100, 1e-5)
    assert chain.epsilon(*args) == dp.epsilon(*args)
    assert make_defense("chain", steps=CLIP_THEN_NOISE).epsilon(*args) is None


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
        (
            {"steps": [{"name": "clip", "norm": 1.0}, {"name": "dpsgd", "norm": 1.0}]},
            ["steps[1]", "dpsgd", "noise_multiplier", "required"],
        ),
        (
            {
                "steps": [
                    {"name": "clip", "norm": 1.0},
                    {"name": "dpsgd", "norm": 1.0, "noise_multiplier": 1.0},
                ]
            },
            ["steps[1]", "dpsgd", "example-level", "first"],
        ),
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
        ("dpsgd", {"norm": 0.0, "noise_multiplier": 1.0}, "norm"),
        ("dpsgd", {"norm": -1.0, "noise_multiplier": 1.0}, "norm"),
        ("dpsgd", {"norm": 1.0, "noise_multiplier": -0.1}, "noise_multiplier"),
        ("dpsgd", {"norm": 1.0, "noise_multiplier": float("inf")}, "noise_multiplier"),
        ("dpsgd", {"norm": 1.0}, "noise_multiplier"),
        ("dpsgd", {"noise_multiplier": 1.0}, "norm"),
        ("dpsgd", {"norm": 1.0, "noise_multiplier": 1.0, "sigma": 1.0}, "sigma"),
        ("topk", {"fraction": 0.0}, "fraction"),
        ("topk", {"fraction": 1.5}, "fraction"),
        ("topk", {"fraction": "0.1"}, "fraction"),
        ("topk", {}, "fraction"),
        ("fp16", {"bits": 16}, "bits"),
        ("int8", {"scale": 0.1}, "scale"),
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
        (DPSGD, {"norm": 0, "noise_multiplier": 1.0}, "norm"),
        (DPSGD, {"norm": 1.0, "noise_multiplier": -1}, "noise_multiplier"),
        (TopK, {"fraction": 0}, "fraction"),
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
    assert make_defense("topk", fraction=1).params() == {"fraction": 1.0}
    assert make_defense("dpsgd", norm=1, noise_multiplier=0).params() == {
        "norm": 1.0,
        "noise_multiplier": 0.0,
    }


def test_dpsgd_epsilon_drops_the_accountants_unconverged_order_warnings(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The default run's DP recipe: batch 128 of 1,212 digits, noise 1, 15 epochs. dp-accounting
    # warns for each fractional order whose series does not converge; the bound stays valid.
    defense = make_defense("dpsgd", norm=1.0, noise_multiplier=1.0)
    with caplog.at_level(logging.WARNING):
        eps = defense.epsilon(128 / 1212, 15 * (1212 // 128), 1e-5)
    assert 0.0 < eps < 20.0
    assert not [r for r in caplog.records if "failed to converge" in r.getMessage()]
    assert not logging.getLogger("absl").filters  # the filter is removed again
