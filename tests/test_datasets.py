"""Tests of the dataset sources: the contract, file round trips, errors, offline behaviour."""

from __future__ import annotations

import gzip
import importlib.util
import urllib.error
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from leakbench.core.errors import ConfigError, DataError, UnknownNameError
from leakbench.datasets import DATASETS, FILE_SOURCES, Dataset, Split, load_dataset
from leakbench.datasets.keras_standard import STANDARD_DATASETS

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
EMBEDDED = [name for name in DATASETS.names("image") if name not in STANDARD_DATASETS]


def check_contract(ds: Dataset) -> None:
    """Asserts the dataset contract of `leakbench.datasets.base`."""
    assert isinstance(ds.class_names, tuple) and all(isinstance(c, str) for c in ds.class_names)
    assert ds.num_classes == len(set(ds.class_names)) >= 2
    for split in (ds.train, ds.test):
        assert split.x.dtype == np.float32 and split.x.ndim == 4
        assert split.x.shape[1:] == ds.input_shape and ds.input_shape[-1] in (1, 3)
        assert split.y.dtype == np.int64 and split.y.shape == (len(split),)
        assert len(split) > 0
        assert 0.0 <= split.x.min() and split.x.max() <= 1.0
        assert 0 <= split.y.min() and split.y.max() < ds.num_classes


def image_keys(split: Split) -> set[bytes]:
    return {image.tobytes() for image in split.x}


# ----------------------------------------------------------------------------- registry, guard


def test_import_datasets_does_not_resolve_into_repo() -> None:
    spec = importlib.util.find_spec("datasets")
    origin = None if spec is None else spec.origin
    assert origin is None or not Path(origin).resolve().is_relative_to(REPO)


def test_registries_hold_every_source() -> None:
    assert {"digits", "lfw", "mnist", "fashion_mnist", "cifar10", "cifar100"} <= set(DATASETS)
    assert {"npz", "idx", "folder"} <= set(FILE_SOURCES)


@pytest.mark.parametrize("spec", ["no_such_set", "zip:/tmp/x"])
def test_unknown_name_or_prefix_lists_allowed(spec: str) -> None:
    with pytest.raises(UnknownNameError, match="allowed: .*(digits|folder)"):
        load_dataset(spec)


# ----------------------------------------------------------------------------- embedded


@pytest.mark.parametrize("name", EMBEDDED)
def test_embedded_contract_split_and_determinism(name: str) -> None:
    ds = load_dataset(name)
    check_contract(ds)
    assert ds.name == name
    # Stratified: every class is in both splits, in (nearly) the same proportion.
    train_counts = np.bincount(ds.train.y, minlength=ds.num_classes)
    test_counts = np.bincount(ds.test.y, minlength=ds.num_classes)
    assert np.all(train_counts > 0) and np.all(test_counts > 0)
    fraction = test_counts / (train_counts + test_counts)
    assert np.all(np.abs(fraction - 0.25) < 0.02)
    assert not image_keys(ds.train) & image_keys(ds.test)
    # A fresh load (bypassing the caches) gives the same split.
    loader = DATASETS.get(name)
    fresh = getattr(loader, "__wrapped__", loader)()
    np.testing.assert_array_equal(fresh.train.x, ds.train.x)
    np.testing.assert_array_equal(fresh.test.y, ds.test.y)
    # Cached arrays are shared, so they must be read-only.
    assert load_dataset(name) is ds
    assert not ds.train.x.flags.writeable


def test_digits_values() -> None:
    from sklearn.datasets import load_digits

    ds = load_dataset("digits")
    assert (len(ds.train), len(ds.test), ds.input_shape) == (1347, 450, (8, 8, 1))
    assert ds.class_names == tuple("0123456789")
    bunch = load_digits()
    first = ds.test.x[0, :, :, 0]
    matches = [i for i, image in enumerate(bunch.images) if np.array_equal(image / 16.0, first)]
    assert len(matches) == 1 and bunch.target[matches[0]] == ds.test.y[0]


def test_lfw_labels_faces_as_one() -> None:
    from skimage.data import lfw_subset

    ds = load_dataset("lfw")
    assert (len(ds.train), len(ds.test), ds.input_shape) == (150, 50, (25, 25, 1))
    assert ds.class_names == ("non_face", "face")
    assert np.bincount(ds.test.y).tolist() == [25, 25]
    raw = lfw_subset().astype(np.float32)
    label_of = {
        image.tobytes(): int(y) for image, y in zip(ds.train.x[..., 0], ds.train.y, strict=True)
    }
    label_of.update(
        {image.tobytes(): int(y) for image, y in zip(ds.test.x[..., 0], ds.test.y, strict=True)}
    )
    assert [label_of[image.tobytes()] for image in raw] == [1] * 100 + [0] * 100


# ----------------------------------------------------------------------------- resize


def test_resize_keeps_range_and_labels() -> None:
    small = load_dataset("digits")
    big = load_dataset("digits", image_size=(16, 16))
    check_contract(big)
    assert big.input_shape == (16, 16, 1)
    np.testing.assert_array_equal(big.train.y, small.train.y)
    # Bilinear resizing preserves the mean brightness closely.
    assert abs(float(big.train.x.mean()) - float(small.train.x.mean())) < 0.01
    assert load_dataset("digits", image_size=(16, 16)) is big
    assert load_dataset("digits", image_size=(8, 8)).input_shape == (8, 8, 1)


@pytest.mark.parametrize("size", [(0, 8), (8,), (8.0, 8), "8x8", (True, 8)])
def test_bad_image_size_is_config_error(size: object) -> None:
    with pytest.raises(ConfigError, match="image_size"):
        load_dataset("digits", image_size=size)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- npz


def test_npz_round_trip_with_test_split(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x, x_test = (
        rng.integers(0, 256, (12, 5, 6), np.uint8),
        rng.integers(0, 256, (4, 5, 6), np.uint8),
    )
    y, y_test = np.arange(12) % 3, np.array([0, 1, 2, 2], dtype=np.uint8)
    path = tmp_path / "set.npz"
    np.savez(path, x=x, y=y, x_test=x_test, y_test=y_test, classes=np.array(["a", "b", "c"]))
    ds = load_dataset(f"npz:{path}")
    check_contract(ds)
    assert ds.input_shape == (5, 6, 1) and ds.class_names == ("a", "b", "c")
    np.testing.assert_allclose(ds.train.x[..., 0], x / 255.0, atol=1e-7)
    np.testing.assert_array_equal(ds.test.y, y_test)


def test_npz_float_rgb_without_test_split(tmp_path: Path) -> None:
    x = np.random.default_rng(1).random((48, 4, 4, 3))
    y = np.repeat(np.arange(4), 12)
    path = tmp_path / "set.npz"
    np.savez_compressed(path, x=x, y=y.reshape(-1, 1))
    ds = load_dataset(f"npz:{path}")
    check_contract(ds)
    assert (len(ds.train), len(ds.test)) == (36, 12)
    assert ds.class_names == ("0", "1", "2", "3") and ds.input_shape == (4, 4, 3)
    assert np.bincount(ds.test.y).tolist() == [3, 3, 3, 3]
    label_of = {
        image.astype(np.float32).tobytes(): label for image, label in zip(x, y, strict=True)
    }
    for split in (ds.train, ds.test):
        assert [label_of[image.tobytes()] for image in split.x] == split.y.tolist()
    again = load_dataset(f"npz:{path}")
    np.testing.assert_array_equal(again.test.x, ds.test.x)


# ----------------------------------------------------------------------------- idx


def write_idx(path: Path, array: np.ndarray) -> None:
    """Writes ``array`` (uint8) as an IDX file, gzip-compressed if ``path`` ends in .gz."""
    header = bytes([0, 0, 0x08, array.ndim]) + np.array(array.shape, dtype=">u4").tobytes()
    data = header + array.astype(np.uint8).tobytes()
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)


def write_mnist_like(directory: Path, n_train: int = 20, n_test: int = 8) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(2)
    arrays = {
        "train-images-idx3-ubyte.gz": rng.integers(0, 256, (n_train, 7, 5), np.uint8),
        "train-labels-idx1-ubyte": np.arange(n_train) % 4,
        "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, 7, 5), np.uint8),
        "t10k-labels-idx1-ubyte.gz": np.arange(n_test) % 4,
    }
    for name, array in arrays.items():
        write_idx(directory / name, array)
    return arrays


def test_idx_round_trip_gzip_and_plain(tmp_path: Path) -> None:
    arrays = write_mnist_like(tmp_path)
    ds = load_dataset(f"idx:{tmp_path}")
    check_contract(ds)
    assert ds.input_shape == (7, 5, 1) and ds.class_names == ("0", "1", "2", "3")
    np.testing.assert_allclose(
        ds.train.x[..., 0], arrays["train-images-idx3-ubyte.gz"] / 255.0, atol=1e-7
    )
    np.testing.assert_array_equal(ds.test.y, arrays["t10k-labels-idx1-ubyte.gz"])


def test_idx_only_t10k_is_split(tmp_path: Path) -> None:
    write_mnist_like(tmp_path, n_test=48)
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte"):
        (tmp_path / name).unlink()
    ds = load_dataset(f"idx:{tmp_path}")
    check_contract(ds)
    assert (len(ds.train), len(ds.test)) == (36, 12)
    assert np.bincount(ds.test.y).tolist() == [3, 3, 3, 3]


# ----------------------------------------------------------------------------- folder


def save_png(path: Path, pixels: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path)


def test_folder_grey_round_trip(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    label_of = {}
    for label, cls in enumerate(("ant", "cat")):  # labels follow the sorted folder names
        for i in range(4):
            pixels = rng.integers(0, 256, (6, 9), np.uint8)
            save_png(tmp_path / cls / f"{i}.png", pixels)
            label_of[pixels.tobytes()] = label
    (tmp_path / "ant" / "notes.txt").write_text("not an image")
    ds = load_dataset(f"folder:{tmp_path}")
    check_contract(ds)
    assert ds.class_names == ("ant", "cat") and ds.input_shape == (6, 9, 1)
    assert (len(ds.train), len(ds.test)) == (6, 2)
    for split in (ds.train, ds.test):
        back = (split.x[..., 0] * 255).round().astype(np.uint8)
        assert [label_of[image.tobytes()] for image in back] == split.y.tolist()


def test_folder_rgb_train_test_layout(tmp_path: Path) -> None:
    grey = np.full((5, 5), 100, np.uint8)
    red = np.zeros((5, 5, 3), np.uint8)
    red[..., 0] = 255
    for part in ("train", "test"):
        save_png(tmp_path / part / "a" / "grey.png", grey)
        save_png(tmp_path / part / "b" / "red.png", red)
    ds = load_dataset(f"folder:{tmp_path}")
    check_contract(ds)
    # One colour image makes the whole dataset RGB.
    assert ds.input_shape == (5, 5, 3) and (len(ds.train), len(ds.test)) == (2, 2)
    np.testing.assert_allclose(ds.test.x[0], 100 / 255.0, atol=1e-7)
    np.testing.assert_array_equal(ds.test.x[1, 0, 0], [1.0, 0.0, 0.0])
    np.testing.assert_array_equal(ds.train.y, [0, 1])


def test_folder_mixed_sizes_need_image_size(tmp_path: Path) -> None:
    for part in ("train", "test"):
        save_png(tmp_path / part / "a" / "small.png", np.zeros((4, 4), np.uint8))
        save_png(tmp_path / part / "b" / "big.png", np.full((8, 6), 255, np.uint8))
    with pytest.raises(DataError, match=r"big\.png: size 6x8 differs.*image_size"):
        load_dataset(f"folder:{tmp_path}")
    ds = load_dataset(f"folder:{tmp_path}", image_size=(3, 3))
    check_contract(ds)
    assert ds.input_shape == (3, 3, 1)
    np.testing.assert_allclose(ds.test.x[1], 1.0)


# ----------------------------------------------------------------------------- errors


def npz_case(**arrays: np.ndarray) -> Callable[[Path], str]:
    def make(tmp: Path) -> str:
        np.savez(tmp / "bad.npz", **arrays)
        return f"npz:{tmp / 'bad.npz'}"

    return make


def bytes_case(name: str, data: bytes) -> Callable[[Path], str]:
    def make(tmp: Path) -> str:
        (tmp / name).write_bytes(data)
        return f"npz:{tmp / name}"

    return make


def truncated_npz(tmp: Path) -> str:
    np.savez(tmp / "full.npz", x=np.zeros((50, 8, 8), np.uint8), y=np.zeros(50, np.int64))
    data = (tmp / "full.npz").read_bytes()
    (tmp / "cut.npz").write_bytes(data[: len(data) // 2])
    return f"npz:{tmp / 'cut.npz'}"


def corrupt_member_npz(tmp: Path) -> str:
    np.savez(tmp / "crc.npz", x=np.full((50, 8, 8), 7, np.uint8), y=np.zeros(50, np.int64))
    data = bytearray((tmp / "crc.npz").read_bytes())
    data[200:260] = bytes(b ^ 0xFF for b in data[200:260])  # inside the data of x.npy
    (tmp / "crc.npz").write_bytes(bytes(data))
    return f"npz:{tmp / 'crc.npz'}"


def npy_file(tmp: Path) -> str:
    np.save(tmp / "arr.npy", np.zeros((3, 4, 4)))
    return f"npz:{tmp / 'arr.npy'}"


def idx_case(edit: Callable[[Path], None]) -> Callable[[Path], str]:
    def make(tmp: Path) -> str:
        write_mnist_like(tmp)
        edit(tmp)
        return f"idx:{tmp}"

    return make


def cut(name: str, keep: int) -> Callable[[Path], None]:
    return lambda tmp: (tmp / name).write_bytes((tmp / name).read_bytes()[:keep])


def append(name: str) -> Callable[[Path], None]:
    return lambda tmp: (tmp / name).write_bytes((tmp / name).read_bytes() + b"\0\0")


def folder_case(build: Callable[[Path], None]) -> Callable[[Path], str]:
    def make(tmp: Path) -> str:
        build(tmp)
        return f"folder:{tmp}"

    return make


def two_classes(tmp: Path) -> None:
    save_png(tmp / "a" / "0.png", np.zeros((4, 4), np.uint8))
    save_png(tmp / "b" / "0.png", np.zeros((4, 4), np.uint8))


def empty_class(tmp: Path) -> None:
    two_classes(tmp)
    (tmp / "c").mkdir()


def corrupt_image(tmp: Path) -> None:
    two_classes(tmp)
    (tmp / "b" / "1.png").write_bytes(b"junk")


def truncated_image(tmp: Path) -> None:
    two_classes(tmp)
    save_png(tmp / "b" / "2.png", np.arange(4096, dtype=np.uint8).reshape(64, 64))
    cut("b/2.png", 80)(tmp)


def class_mismatch(tmp: Path) -> None:
    two_classes(tmp / "train")
    two_classes(tmp / "test")
    save_png(tmp / "test" / "z" / "0.png", np.zeros((4, 4), np.uint8))


ERROR_CASES = {
    "npz missing file": (lambda tmp: f"npz:{tmp / 'none.npz'}", r"none\.npz: no such file"),
    "npz is a directory": (lambda tmp: f"npz:{tmp}", "is a directory"),
    "npz garbage": (bytes_case("junk.npz", b"hello world"), r"junk\.npz: not an \.npz archive"),
    "npz empty": (bytes_case("empty.npz", b""), r"empty\.npz: not an \.npz archive"),
    "npz truncated": (truncated_npz, r"cut\.npz: not a readable"),
    "npz corrupt member": (corrupt_member_npz, r"crc\.npz: not a readable .*CRC"),
    "npz single npy": (npy_file, r"arr\.npy: is a single \.npy"),
    "npz missing y": (npz_case(x=np.zeros((4, 3, 3), np.uint8)), "missing array 'y'"),
    "npz length mismatch": (
        npz_case(x=np.zeros((4, 3, 3), np.uint8), y=np.zeros(5, np.int64)),
        "'x' has 4 images but 'y' 5 labels",
    ),
    "npz float labels": (
        npz_case(x=np.zeros((4, 3, 3), np.uint8), y=np.array([0.0, 1.5, 0.0, 1.0])),
        r"array 'y'.*labels must be integers",
    ),
    "npz negative labels": (
        npz_case(x=np.zeros((4, 3, 3), np.uint8), y=np.array([0, -1, 0, 1])),
        r"array 'y'.*>= 0",
    ),
    "npz values out of range": (
        npz_case(x=np.full((4, 3, 3), 1.5), y=np.arange(4) % 2),
        r"array 'x'.*\[0, 1\]",
    ),
    "npz int16 images": (
        npz_case(x=np.zeros((4, 3, 3), np.int16), y=np.arange(4) % 2),
        r"array 'x'.*uint8",
    ),
    "npz channels first": (
        npz_case(x=np.zeros((4, 3, 8, 8), np.uint8), y=np.arange(4) % 2),
        r"array 'x'.*channels last",
    ),
    "npz object array": (
        npz_case(x=np.zeros((4, 3, 3), np.uint8), y=np.array([0, 1, "a", None], dtype=object)),
        r"bad\.npz: not a readable .*object arrays",
    ),
    "npz too few classes": (
        npz_case(
            x=np.zeros((12, 3, 3), np.uint8),
            y=np.repeat([0, 1, 2], 4),
            classes=np.array(["a", "b"]),
        ),
        r"bad\.npz.*labels must lie in 0\.\.1",
    ),
    "npz x_test alone": (
        npz_case(x=np.zeros((4, 3, 3), np.uint8), y=np.arange(4), x_test=np.zeros((1, 3, 3))),
        "'x_test' and 'y_test'",
    ),
    "idx missing dir": (lambda tmp: f"idx:{tmp / 'nope'}", "no such directory"),
    "idx empty dir": (lambda tmp: f"idx:{tmp}", "no IDX files"),
    "idx bad magic": (
        idx_case(lambda tmp: (tmp / "t10k-images-idx3-ubyte").write_bytes(b"\x01\x02\x03\x04")),
        r"t10k-images-idx3-ubyte: not an IDX file",
    ),
    "idx truncated": (idx_case(cut("t10k-images-idx3-ubyte", 100)), r"t10k-images.*truncated"),
    "idx truncated header": (idx_case(cut("t10k-images-idx3-ubyte", 9)), r"truncated IDX header"),
    "idx trailing bytes": (idx_case(append("t10k-images-idx3-ubyte")), "trailing bytes"),
    "idx corrupt gzip": (
        idx_case(cut("train-images-idx3-ubyte.gz", 30)),
        r"train-images-idx3-ubyte\.gz: cannot read",
    ),
    "idx label count": (
        idx_case(lambda tmp: write_idx(tmp / "train-labels-idx1-ubyte", np.zeros(3, np.uint8))),
        r"train-labels-idx1-ubyte: 3 labels but .* 20 images",
    ),
    "idx missing labels": (
        idx_case(lambda tmp: (tmp / "t10k-labels-idx1-ubyte.gz").unlink()),
        r"t10k-labels-idx1-ubyte\[\.gz\]: missing",
    ),
    "folder missing dir": (lambda tmp: f"folder:{tmp / 'nope'}", "no such directory"),
    "folder no classes": (lambda tmp: f"folder:{tmp}", "no class folders"),
    "folder empty class": (folder_case(empty_class), r"[/\\]c: class folder holds no image"),
    "folder corrupt image": (folder_case(corrupt_image), r"1\.png: not a readable image"),
    "folder truncated image": (folder_case(truncated_image), r"2\.png: not a readable image"),
    "folder class mismatch": (folder_case(class_mismatch), "same class folders"),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_bad_input_raises_data_error(case: str, tmp_path: Path) -> None:
    make, message = ERROR_CASES[case]
    spec = make(tmp_path)
    with pytest.raises(DataError, match=message) as info:
        load_dataset(spec)
    assert "\n" not in str(info.value)


# ----------------------------------------------------------------------------- keras.datasets


def fake_keras_data(shape: tuple[int, ...], label_shape: tuple[int, ...]):
    def load_data():
        x = np.zeros((6, *shape), np.uint8)
        y = (np.arange(6) % 3).reshape(6, *label_shape).astype(np.uint8)
        return (x, y), (x[:2], y[:2])

    return load_data


@pytest.mark.parametrize("name", list(STANDARD_DATASETS))
def test_keras_standard_shapes_and_names(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import keras

    rgb = name.startswith("cifar")
    fake = fake_keras_data((32, 32, 3) if rgb else (28, 28), (1,) if rgb else ())
    monkeypatch.setattr(getattr(keras.datasets, name), "load_data", fake)
    ds = DATASETS.get(name)()
    check_contract(ds)
    assert ds.input_shape == ((32, 32, 3) if rgb else (28, 28, 1))
    assert ds.test.y.tolist() == [0, 1]
    expected = {
        "mnist": ("0", "9", 10),
        "fashion_mnist": ("T-shirt/top", "Ankle boot", 10),
        "cifar10": ("airplane", "truck", 10),
        "cifar100": ("apple", "worm", 100),
    }[name]
    assert (ds.class_names[0], ds.class_names[-1], ds.num_classes) == expected


def test_cifar100_class_names_are_sorted_fine_labels() -> None:
    names = STANDARD_DATASETS["cifar100"][1]
    assert len(set(names)) == 100 and list(names) == sorted(names)
    assert {"aquarium_fish", "maple_tree", "sweet_pepper", "willow_tree"} <= set(names)


def offline_fetch():
    # What keras.utils.get_file raises without network: a plain Exception whose context is
    # the URLError (see keras/src/utils/file_utils.py).
    try:
        raise urllib.error.URLError("[Errno -3] Temporary failure in name resolution")
    except urllib.error.URLError as err:
        raise Exception(f"URL fetch failure on https://x/mnist.npz: None -- {err.reason}")  # noqa: B904


def offline_socket():
    raise TimeoutError("timed out")


@pytest.mark.parametrize("failure", [offline_fetch, offline_socket])
@pytest.mark.parametrize("name", ["mnist", "cifar100"])
def test_keras_offline_names_file_sources(
    name: str, failure: Callable[[], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    import keras

    monkeypatch.setattr(getattr(keras.datasets, name), "load_data", failure)
    with pytest.raises(DataError, match=rf"^dataset '{name}'.*npz:PATH, idx:DIR or folder:DIR$"):
        load_dataset(name)


def test_keras_other_errors_propagate(monkeypatch: pytest.MonkeyPatch) -> None:
    import keras

    def broken():
        raise Exception("something else")

    monkeypatch.setattr(keras.datasets.mnist, "load_data", broken)
    with pytest.raises(Exception, match="something else") as info:
        DATASETS.get("mnist")()
    assert not isinstance(info.value, DataError)


# ----------------------------------------------------------------------------- real data


MNIST_DIR = SHARED_DATA / "mnist"
CIFAR10_NPZ = SHARED_DATA / "cifar10" / "cifar10-test.npz"


@pytest.mark.skipif(
    not (MNIST_DIR / "t10k-images-idx3-ubyte.gz").is_file(), reason=f"{MNIST_DIR} is absent"
)
def test_real_mnist_t10k() -> None:
    ds = load_dataset(f"idx:{MNIST_DIR}")
    check_contract(ds)
    assert ds.input_shape == (28, 28, 1) and ds.num_classes == 10
    assert len(ds.train) + len(ds.test) == 10_000 and len(ds.test) == 2_500
    counts = np.bincount(np.concatenate([ds.train.y, ds.test.y]))
    assert counts.tolist() == [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


@pytest.mark.skipif(not CIFAR10_NPZ.is_file(), reason=f"{CIFAR10_NPZ} is absent")
def test_real_cifar10_npz() -> None:
    ds = load_dataset(f"npz:{CIFAR10_NPZ}")
    check_contract(ds)
    assert ds.input_shape == (32, 32, 3) and ds.class_names[0] == "airplane"
    assert len(ds.train) + len(ds.test) == 10_000
    assert np.bincount(ds.test.y).tolist() == [250] * 10
    assert np.bincount(ds.train.y).tolist() == [750] * 10
