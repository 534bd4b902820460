"""Per-image leakage: did the attacker get this private image, by any test a person would accept?

Three flags per reconstructed image, each a yes or no, so that a defense is judged by how many
of its images leaked and never by a mean over images (which averages a few leaked images away):

- **recovered**: MSE at or below the run's ``success_mse`` (1e-3 by default, about 30 dB: iDLG's
  exact-recovery threshold).
- **identified**: the re-identification test of breaching's IIP score. Among the image's own
  original and a fixed pool of `DISTRACTORS` distractor images of the same dataset, the
  reconstruction's nearest neighbour under LPIPS is its own original. The pool is drawn once
  per dataset (`leakbench.core.seeds.distractor_indices`) from the split the private images are not
  drawn from, so it never holds a private image. A reconstruction that carries nothing of its
  image is identified by chance alone, with probability ``1 / (pool + 1)`` (`chance`), which
  the leaderboard reports beside the share. Both sides are compared as the 8-bit images a run
  directory keeps (`leakbench.outputs.arrays`), so a committed run's ``arrays/`` reproduce the flag.
  Where LPIPS is off (``lpips = "none"``) the distance is the pixels' squared error instead.
- **recognisable**: PSNR at least `RECOGNISABLE_PSNR` or LPIPS at most `RECOGNISABLE_LPIPS`.
  Chosen once, from a person's reading of 104 committed reconstructions of four datasets
  (``results/calibration/``, README there): no image read as unrecognisable meets either
  threshold. PSNR alone needs a different threshold per dataset (a noisy MNIST digit is plain
  at 11 dB, a blurred CIFAR-10 image is not at 20.7 dB), and so does LPIPS alone (an 8x8 digit
  at 0.08 is noise, a CIFAR-10 image at 0.06 is plain): the pair is strict on both.

An image has ``leaked`` when any of the three holds, where identifications count only when a
cell has more of them than chance explains (`beyond_chance`: a single hit among 32
reconstructions of noise is what 1 / 1,000 gives now and then). `exact_interval` is the
Clopper-Pearson interval that every share is reported with.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import binomtest

from leakbench.components import lpips as lpips_metric
from leakbench.components.lpips_weights import available as lpips_available
from leakbench.core.seeds import distractor_indices
from leakbench.datasets import Dataset

# Distractors in the identification pool (fewer when the other split is smaller).
DISTRACTORS = 999
# Per-image thresholds of ``recognisable`` (results/README.md, "Recognisable").
RECOGNISABLE_PSNR = 21.0
RECOGNISABLE_LPIPS = 0.02
# Confidence of every interval of a share.
CONFIDENCE = 0.95
# A cell's identifications count as leaks only when chance alone would give as many with
# probability below this (a one-sided binomial test against `chance`).
CHANCE_ALPHA = 0.01


def chance(pool_size: int) -> float:
    """The probability that a reconstruction unrelated to its image is identified."""
    return 1.0 / (pool_size + 1)


def distractor_pool(dataset: Dataset, private_split: str) -> np.ndarray:
    """The identification pool of ``dataset`` as 8-bit NHWC images: `DISTRACTORS` images (all,
    if fewer) of the split that the private examples (from ``private_split``) are not drawn
    from, chosen by `leakbench.core.seeds.distractor_indices`."""
    if private_split not in ("train", "test"):
        raise ValueError(f"private_split must be 'train' or 'test', got {private_split!r}")
    other = dataset.train if private_split == "test" else dataset.test
    images = np.asarray(other.x)[distractor_indices(len(other), DISTRACTORS)]
    return np.round(np.clip(images, 0.0, 1.0) * 255.0).astype(np.uint8)


def embed(images: np.ndarray, variant: str | None) -> np.ndarray:
    """Vectors whose squared distances are the identification distance: LPIPS (`variant`) when
    its weights are there, else the pixels (so the distance is the squared error)."""
    x = np.asarray(images)
    if x.dtype == np.uint8:
        x = x.astype(np.float32) / 255.0
    if variant not in (None, "none") and lpips_available(variant):
        return lpips_metric.embed(x, variant).astype(np.float64)
    return x.reshape(len(x), -1).astype(np.float64) / x[0].size if len(x) else x.reshape(0, 0)


def _squared(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise squared Euclidean distances of the rows of ``a`` and ``b``, ``[len(a), len(b)]``."""
    return np.maximum((a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T, 0.0)


def identified(
    originals: np.ndarray,
    reconstructions: np.ndarray,
    pool: np.ndarray,
    variant: str | None = lpips_metric.DEFAULT_VARIANT,
    pool_embedding: np.ndarray | None = None,
) -> np.ndarray:
    """Per image, whether the reconstruction is nearer its own original than every image of
    ``pool`` (a tie is not an identification).

    Args:
        originals: NHWC images (uint8, or floats in [0, 1]).
        reconstructions: Images like ``originals``, one per original, in the same order.
        pool: The distractor images, NHWC like the originals.
        variant: The LPIPS backbone, or None / ``"none"`` for the pixel distance.
        pool_embedding: ``embed(pool, variant)``, when the caller keeps it for many calls.
    """
    if len(originals) != len(reconstructions):
        raise ValueError("identified needs one reconstruction per original")
    if len(originals) == 0:
        return np.zeros(0, bool)
    if len(pool) == 0 and pool_embedding is None:
        raise ValueError("identified needs a distractor pool of at least one image")
    rec = embed(reconstructions, variant)
    own = ((rec - embed(originals, variant)) ** 2).sum(1)
    others = pool_embedding if pool_embedding is not None else embed(pool, variant)
    nearest = np.concatenate(
        [_squared(rec[k : k + 512], others).min(1) for k in range(0, len(rec), 512)]
    )
    return own < nearest


def recognisable(lpips: np.ndarray, psnr: np.ndarray) -> np.ndarray:
    """Per image: PSNR at least `RECOGNISABLE_PSNR` or LPIPS at most `RECOGNISABLE_LPIPS` (a
    NaN LPIPS, not scored, meets no threshold)."""
    lpips = np.asarray(lpips, np.float64)
    psnr = np.asarray(psnr, np.float64)
    return (psnr >= RECOGNISABLE_PSNR) | (lpips <= RECOGNISABLE_LPIPS)


def beyond_chance(hits: int, n: int, chance_level: float, alpha: float = CHANCE_ALPHA) -> bool:
    """Whether ``hits`` identifications among ``n`` images are more than reconstructions
    unrelated to their images would give: the one-sided binomial p-value of at least
    ``hits`` under ``chance_level`` is below ``alpha``. With 999 distractors one hit passes
    among up to 10 images, two among up to 148."""
    if hits <= 0:
        return False
    return bool(binomtest(int(hits), int(n), chance_level, alternative="greater").pvalue < alpha)


def exact_interval(hits: int, n: int, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The Clopper-Pearson interval of a share of ``hits`` in ``n`` (NaNs for ``n = 0``)."""
    if n == 0:
        return float("nan"), float("nan")
    interval = binomtest(int(hits), int(n)).proportion_ci(confidence, method="exact")
    return float(interval.low), float(interval.high)


def leaked_flags(
    mse: np.ndarray,
    identified_flags: np.ndarray,
    recognisable_flags: np.ndarray,
    success_mse: float,
) -> np.ndarray:
    """Per image: recovered (MSE <= ``success_mse``), identified or recognisable. An unknown
    (NaN) flag counts as not set."""
    return (
        (np.asarray(mse, np.float64) <= success_mse)
        | (np.asarray(identified_flags, np.float64) == 1)
        | (np.asarray(recognisable_flags, np.float64) == 1)
    )
