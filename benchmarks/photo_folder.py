"""A `folder:` dataset of real photos at ImageNet size, made here without the network.

The committed runs' datasets are 28x28 or 32x32, and `../shared/data` keeps LFW at 32x32 only.
This script cuts square crops out of the ten colour photographs that the installed packages
ship (scikit-image's astronaut, chelsea, coffee, hubble_deep_field, immunohistochemistry,
retina and rocket; scikit-learn's china and flower; Matplotlib's grace_hopper), each at a
random scale (35% to 100% of the photo's shorter side), position and mirror, resized to SIZE x
SIZE with Pillow's antialiased bilinear filter, and writes them as PNGs in the `folder:`
layout: ``OUT/train/<photo>/<n>.png`` and ``OUT/test/<photo>/<n>.png``, the photo being the
class. The crops of one photo overlap, so they are more alike than ten classes of ImageNet;
they are real photographs at full resolution, which is what the memory and the imprint
read-out at 224x224 need (`benchmarks/memory.py`, `results/perf/memory.md`).

    PYTHONSAFEPATH=1 python benchmarks/photo_folder.py OUT [--size 224] [--train 80] [--test 20]

The same arguments write the same bytes (seeded, PNG without time stamps).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

PHOTOS = (
    "astronaut",
    "chelsea",
    "coffee",
    "hubble_deep_field",
    "immunohistochemistry",
    "retina",
    "rocket",
    "china",
    "flower",
    "grace_hopper",
)
SEED = 0x50F0


def photo(name: str) -> np.ndarray:
    """One of `PHOTOS` as uint8 H x W x 3, from the package that ships it."""
    if name in ("china", "flower"):
        from sklearn.datasets import load_sample_image

        return np.asarray(load_sample_image(f"{name}.jpg"))
    if name == "grace_hopper":
        from matplotlib import cbook

        with cbook.get_sample_data("grace_hopper.jpg") as file:
            return np.asarray(Image.open(file).convert("RGB"))
    import skimage.data

    return np.asarray(getattr(skimage.data, name)())[..., :3]


def crops(image: np.ndarray, count: int, size: int, rng: np.random.Generator) -> list[Image.Image]:
    """``count`` square crops of ``image``, each at a random scale, position and mirror, resized
    to ``size`` x ``size``."""
    height, width = image.shape[:2]
    source = Image.fromarray(image)
    out = []
    for _ in range(count):
        side = int(round(min(height, width) * rng.uniform(0.35, 1.0)))
        top = int(rng.integers(0, height - side + 1))
        left = int(rng.integers(0, width - side + 1))
        crop = source.crop((left, top, left + side, top + side))
        crop = crop.resize((size, size), Image.Resampling.BILINEAR)
        if rng.random() < 0.5:
            crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        out.append(crop)
    return out


def write_folder(out: Path, size: int = 224, train: int = 80, test: int = 20) -> Path:
    """Writes the dataset to ``out`` (train and test crops of every photo) and returns it."""
    for index, name in enumerate(PHOTOS):
        rng = np.random.default_rng([SEED, index, size])
        pictures = crops(photo(name), train + test, size, rng)
        for part, chosen in (("train", pictures[:train]), ("test", pictures[train:])):
            folder = out / part / name
            folder.mkdir(parents=True, exist_ok=True)
            for n, picture in enumerate(chosen):
                picture.save(folder / f"{n:04d}.png", optimize=False)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", type=int, default=224, help="side in pixels (default 224)")
    parser.add_argument("--train", type=int, default=80, help="train crops per photo")
    parser.add_argument("--test", type=int, default=20, help="test crops per photo")
    args = parser.parse_args()
    write_folder(args.out, args.size, args.train, args.test)
    print(f"{len(PHOTOS) * (args.train + args.test)} crops of {len(PHOTOS)} photos in {args.out}")


if __name__ == "__main__":
    main()
