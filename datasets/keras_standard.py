"""The standard sets of ``keras.datasets``: MNIST, Fashion-MNIST, CIFAR-10 and CIFAR-100.

Keras downloads each one on first use and keeps it in its cache (``~/.keras/datasets``); without
network and cache, loading raises `DataError` pointing at the file sources.
"""

from __future__ import annotations

import importlib

from leakbench.core.errors import DataError
from leakbench.datasets._util import make_dataset, to_labels, to_unit_float
from leakbench.datasets.base import DATASETS, Dataset, Split

FASHION_MNIST_CLASSES = (
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
)
CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
# The fine labels of CIFAR-100 in label order, as in the dataset's "meta" file (alphabetical).
CIFAR100_CLASSES = (
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle", "bicycle",
    "bottle", "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can", "castle",
    "caterpillar", "cattle", "chair", "chimpanzee", "clock", "cloud", "cockroach", "couch",
    "crab", "crocodile", "cup", "dinosaur", "dolphin", "elephant", "flatfish", "forest", "fox",
    "girl", "hamster", "house", "kangaroo", "keyboard", "lamp", "lawn_mower", "leopard", "lion",
    "lizard", "lobster", "man", "maple_tree", "motorcycle", "mountain", "mouse", "mushroom",
    "oak_tree", "orange", "orchid", "otter", "palm_tree", "pear", "pickup_truck", "pine_tree",
    "plain", "plate", "poppy", "porcupine", "possum", "rabbit", "raccoon", "ray", "road",
    "rocket", "rose", "sea", "seal", "shark", "shrew", "skunk", "skyscraper", "snail", "snake",
    "spider", "squirrel", "streetcar", "sunflower", "sweet_pepper", "table", "tank", "telephone",
    "television", "tiger", "tractor", "train", "trout", "tulip", "turtle", "wardrobe", "whale",
    "willow_tree", "wolf", "woman", "worm",
)  # fmt: skip

# Registered name -> (module of keras.datasets, class names in label order).
STANDARD_DATASETS: dict[str, tuple[str, tuple[str, ...]]] = {
    "mnist": ("mnist", tuple(str(k) for k in range(10))),
    "fashion_mnist": ("fashion_mnist", FASHION_MNIST_CLASSES),
    "cifar10": ("cifar10", CIFAR10_CLASSES),
    "cifar100": ("cifar100", CIFAR100_CLASSES),
}


def _is_fetch_failure(err: Exception) -> bool:
    """Whether ``err`` is the plain ``Exception`` that ``keras.utils.get_file`` raises offline.

    Keras turns ``urllib.error.URLError``/``HTTPError`` into ``Exception("URL fetch failure on
    ...")`` raised inside the handler, so the original error is its ``__context__``.
    """
    return type(err) is Exception and (
        str(err).startswith("URL fetch failure") or isinstance(err.__context__, OSError)
    )


def load_standard(name: str) -> Dataset:
    """Loads one of `STANDARD_DATASETS` through ``keras.datasets.<module>.load_data()``.

    Uses the official train/test split; labels are flattened (CIFAR's are N x 1 columns).

    Args:
        name: A key of `STANDARD_DATASETS`.

    Raises:
        DataError: If Keras can neither download the data nor find it in its cache.
    """
    module_name, class_names = STANDARD_DATASETS[name]
    # Imported here, not at the top: importing Keras takes seconds and only these sets need it.
    module = importlib.import_module(f"keras.datasets.{module_name}")
    try:
        (x_train, y_train), (x_test, y_test) = module.load_data()
    except OSError as err:  # URLError, timeouts, DNS failures, an unwritable cache
        raise _offline_error(name, err) from err
    except Exception as err:
        if not _is_fetch_failure(err):
            raise
        raise _offline_error(name, err) from err
    where = f"keras.datasets.{module_name}"
    train = Split(to_unit_float(x_train, where), to_labels(y_train, where))
    test = Split(to_unit_float(x_test, where), to_labels(y_test, where))
    return make_dataset(name, train, test, class_names)


def _offline_error(name: str, err: BaseException) -> DataError:
    reason = " ".join(str(err).split())  # keeps the message on one line
    return DataError(
        f"dataset {name!r}: keras.datasets could not download it or find it in ~/.keras/datasets "
        f"({reason}); without network use a file source instead: npz:PATH, idx:DIR or folder:DIR"
    )


def _register(name: str) -> None:
    def loader() -> Dataset:
        return load_standard(name)

    loader.__name__ = loader.__qualname__ = f"load_{name}"
    loader.__doc__ = f"Loads {name!r} through keras.datasets (see `load_standard`)."
    DATASETS.register(name)(loader)


for _name in STANDARD_DATASETS:
    _register(_name)
