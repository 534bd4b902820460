"""File source ``folder:DIR``: image files in one sub-folder per class, read with Pillow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from leakbench.core.errors import DataError
from leakbench.datasets._util import (
    MAX_IMAGE_SIDE,
    check_image_size,
    check_loaded_bytes,
    existing_path,
    make_dataset,
    stratified_split,
    to_labels,
    to_unit_float,
)
from leakbench.datasets.base import FILE_SOURCES, Dataset, Split

IMAGE_SUFFIXES = frozenset(
    {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".pbm"}
)
# Pillow reports damaged files with any of these, depending on the format plugin.
_IMAGE_ERRORS = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


@FILE_SOURCES.register("folder")
def load_folder(path: str, image_size: tuple[int, int] | None = None) -> Dataset:
    """Loads a dataset from a directory of images, one sub-folder per class.

    Layout: ``DIR/<class>/<image>``, or ``DIR/train/<class>/<image>`` and
    ``DIR/test/<class>/<image>`` when both ``train`` and ``test`` exist (then with the same class
    folders). Class names are the sorted class folder names; label k is the k-th name. Files
    with other suffixes than `IMAGE_SUFFIXES` and hidden files are ignored. Images become grey
    (C = 1) if every image is grey (R = G = B), else RGB (C = 3); alpha is dropped. Without a
    ``train``/``test`` layout, the deterministic stratified split of `stratified_split` is made.

    Args:
        path: The directory.
        image_size: (H, W) to resize every image to with Pillow's antialiased bilinear filter;
            without it all images must have the same size, at most
            `leakbench.datasets._util.MAX_IMAGE_SIDE` pixels a side.

    Raises:
        DataError: If the directory is missing, a class folder is empty, an image is unreadable,
            sizes differ or are too large without ``image_size``, or the images would take more
            than `leakbench.datasets._util.MAX_LOADED_BYTES` once loaded. Sizes are read from
            the files' headers before any image is decoded.
    """
    spec = f"folder:{path}"
    if image_size is not None:
        image_size = check_image_size(image_size)
    root = existing_path(path, spec, directory=True)
    if (root / "train").is_dir() and (root / "test").is_dir():
        layout = {"train": _list_classes(root / "train"), "test": _list_classes(root / "test")}
        if sorted(layout["train"]) != sorted(layout["test"]):
            raise DataError(
                f"{spec}: train/ and test/ must hold the same class folders, got "
                f"{sorted(layout['train'])} and {sorted(layout['test'])}"
            )
    else:
        layout = {"all": _list_classes(root)}
    class_names = tuple(sorted(next(iter(layout.values()))))

    files = [
        (part, file, label)
        for part, classes in layout.items()
        for label, name in enumerate(class_names)
        for file in classes[name]
    ]
    _check_sizes([file for _, file, _ in files], image_size, spec)
    pixels = [_read_image(file, image_size) for _, file, _ in files]
    if image_size is None:
        first = pixels[0].shape[:2]
        for (_, file, _), image in zip(files, pixels, strict=True):
            if image.shape[:2] != first:
                raise DataError(
                    f"{file}: size {image.shape[1]}x{image.shape[0]} differs from "
                    f"{files[0][1]} ({first[1]}x{first[0]}); pass image_size to resize"
                )
    # Grey only when every image is: one colour image makes the whole dataset RGB.
    grey = all(
        np.array_equal(p[..., 0], p[..., 1]) and np.array_equal(p[..., 0], p[..., 2])
        for p in pixels
    )

    def split(part: str) -> Split:
        chosen = [i for i, (p, _, _) in enumerate(files) if p == part]
        x = np.stack([pixels[i][..., :1] if grey else pixels[i] for i in chosen])
        y = np.array([files[i][2] for i in chosen], dtype=np.int64)
        return Split(to_unit_float(x, spec), to_labels(y, spec))

    if "all" in layout:
        whole = split("all")
        train, test = stratified_split(whole.x, whole.y, spec)
    else:
        train, test = split("train"), split("test")
    return make_dataset(spec, train, test, class_names)


def _list_classes(directory: Path) -> dict[str, list[Path]]:
    """Maps each class folder name to its sorted image files."""
    classes = {
        sub.name: sorted(
            f
            for f in sub.iterdir()
            if f.is_file() and not f.name.startswith(".") and f.suffix.lower() in IMAGE_SUFFIXES
        )
        for sub in directory.iterdir()
        if sub.is_dir() and not sub.name.startswith(".")
    }
    if not classes:
        raise DataError(f"{directory}: no class folders; expected one sub-folder per class")
    for name, files in classes.items():
        if not files:
            raise DataError(f"{directory / name}: class folder holds no image files")
    return classes


def _check_sizes(files: list[Path], image_size: tuple[int, int] | None, spec: str) -> None:
    """Refuses, from the image files' headers (no pixel is decoded), an image larger than
    `MAX_IMAGE_SIDE` a side without ``image_size``, and images that would take too much memory
    once loaded (as float32 RGB, the widest they become)."""
    if image_size is not None:
        pixels = len(files) * image_size[0] * image_size[1]
    else:
        pixels = 0
        for file in files:
            width, height = _image_size(file)
            if max(width, height) > MAX_IMAGE_SIDE:
                raise DataError(
                    f"{file}: {width}x{height} pixels, larger than {MAX_IMAGE_SIDE} a side; set "
                    f"image_size (at most [{MAX_IMAGE_SIDE}, {MAX_IMAGE_SIDE}]) to resize on "
                    "loading"
                )
            pixels += width * height
    check_loaded_bytes(pixels * 3 * 4, spec)


def _image_size(file: Path) -> tuple[int, int]:
    """An image file's (width, height) from its header; the pixels are not decoded."""
    try:
        with Image.open(file) as image:
            return image.size
    except _IMAGE_ERRORS as err:
        raise DataError(f"{file}: not a readable image ({' '.join(str(err).split())})") from err


def _read_image(file: Path, image_size: tuple[int, int] | None) -> np.ndarray:
    """Reads one image as uint8 H x W x 3 RGB, resized to ``image_size`` (H, W) if given."""
    try:
        with Image.open(file) as image:
            rgb = image.convert("RGB")
            if image_size is not None and rgb.size != (image_size[1], image_size[0]):
                rgb = rgb.resize((image_size[1], image_size[0]), Image.Resampling.BILINEAR)
            return np.asarray(rgb, dtype=np.uint8)
    except _IMAGE_ERRORS as err:
        raise DataError(f"{file}: not a readable image ({' '.join(str(err).split())})") from err
