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
  image is identified by chance alone, with probability ``1 / (pool + 1)`` (`chance`); one
  that knows its label is identified more often (the measured null, below), and the
  leaderboard reports the level tested beside the share. Both sides are compared as the
  8-bit images a run directory keeps (`leakbench.outputs.arrays`), so a committed run's
  ``arrays/`` reproduce the flag.
  Where LPIPS is off (``lpips = "none"``) the distance is the pixels' squared error instead.
- **recognisable**: PSNR at least `RECOGNISABLE_PSNR` or LPIPS at most `RECOGNISABLE_LPIPS`,
  chosen once from a person's reading of 104 committed reconstructions of four datasets
  (``results/calibration/``, README there). Under protocol 2 a measure counts only where the
  reconstruction is also nearer its original than the label alone brings all but 1% of the
  public split's images (`null_bounds`: quantiles of the label-only null's PSNR and LPIPS
  over the distractor pool, each pool image against the mean of the other public images of
  its class) and than its own label-only null (`label_floor`): the data can only make the
  reader's thresholds stricter (docs/metrics.md, "Recognisable", says why not the bounds
  alone).

An image has ``leaked`` when any of the three holds, where identifications count only when a
cell has more of them than chance explains (`beyond_chance`: a single hit among 32
reconstructions of noise is what 1 / 1,000 gives now and then). `exact_interval` is the
Clopper-Pearson interval that every share is reported with.

**The measured null.** ``1 / (pool + 1)`` is the chance of a reconstruction that knows nothing
of its image, but every reconstruction carries its batch's recovered label, and a picture of
the label alone (the class mean) is identified far more often (about 12 times on digits). The
chance level a cell's identifications are tested against is therefore measured: each image
row gets `NULL_DRAWS` standing null reconstructions (`null_reconstructions`): the mean image
of the public split (the split the pool comes from) for the row's recovered label, plus
Gaussian noise of std `NULL_STD`, clipped to [0, 1] and rounded to 8 bits like the stored
arrays, seeded by the row's seed, batch and position (`NULL_STREAM`), so a rescore draws the
same images. The share of them identified against the same pool and the same originals, with
the same distance, is the cell's ``identified_null``; the test uses that share, floored at
``1 / (pool + 1)`` (`identification_chance`).

**Counting by matching.** For a batch of B > 1 images the reconstructions are assigned to the
originals by the total MSE (`leakbench.components.metrics.match`), which may pair an exact
reconstruction with the wrong original to win on blends. The leak count therefore takes, per
batch, a maximum-cardinality matching of the leak graph (which reconstruction leaks which
original, by the same three tests: `leak_graph`, `matched_leaks`); the per-image fidelity
scores keep the MSE assignment.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.optimize import linear_sum_assignment
from scipy.stats import binomtest

from leakbench.components import lpips as lpips_metric
from leakbench.components.embedding import (
    EmbeddedPool,
    embed,
    nearest_pool,
    squared_distances,
    uses_lpips,
)
from leakbench.core.seeds import distractor_indices
from leakbench.datasets import Dataset
from leakbench.datasets.base import Split

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
# The standing null reconstructions (module docstring). NULL_STD (about 26 of 255 levels)
# makes a row's draws differ; of the stds tried on digits' 450 test images (LPIPS, 4 draws
# each) it gave the highest rate: 0.4% for the bare class mean, 0.9% at 0.05, 1.2% at 0.1,
# 0.5% at 0.2, 0.4% at 0.3, so the null is not weaker than the bare mean. NULL_DRAWS per
# row: a cell of 32 images measures its null on 256 draws (those of one row mostly agree:
# they share its class mean and its original).
NULL_STD = 0.1
NULL_DRAWS = 8
# The first word of the null's generator seed (then the row's seed, batch index and position).
NULL_STREAM = 0x0A11_5EED
# Rows of a cell embedded at once (whole batches, at least one): bounds memory for any cell size.
CHUNK_ROWS = 512


def chance(pool_size: int) -> float:
    """The probability that a reconstruction unrelated to its image is identified."""
    return 1.0 / (pool_size + 1)


def identification_chance(pool_size: int, null_rate: float | None = None) -> float:
    """The chance level a cell's identifications are tested against: its measured null rate
    (``identified_null``) where known, never below `chance` (a null never identified in a few
    hundred draws does not make one hit a leak). The point estimate, not an upper bound: it is
    what the leaderboard reports as ``identified_chance``, and the draws of one row share their
    class mean and original, so a binomial bound over the draws would claim a precision they
    do not have."""
    floor = chance(pool_size)
    if null_rate is None or null_rate != null_rate:
        return floor
    return max(float(null_rate), floor)


def public_split(dataset: Dataset, private_split: str) -> Split:
    """The split the private examples (from ``private_split``) are not drawn from: where the
    distractor pool and the null's class means come from."""
    if private_split not in ("train", "test"):
        raise ValueError(f"private_split must be 'train' or 'test', got {private_split!r}")
    return dataset.train if private_split == "test" else dataset.test


def splits_share_images(dataset: Dataset) -> bool:
    """Whether the dataset's two splits are the same images (an archive whose public split
    repeats its private one, as `leakbench.audit` writes without ``public``): a pool drawn
    from either would hold private images, so no identification can be judged."""
    a, b = np.asarray(dataset.train.x), np.asarray(dataset.test.x)
    return a.shape == b.shape and bool(np.array_equal(a, b))


def distractor_pool(dataset: Dataset, private_split: str) -> np.ndarray:
    """The identification pool of ``dataset`` as 8-bit NHWC images: `DISTRACTORS` images (all,
    if fewer) of the split that the private examples (from ``private_split``) are not drawn
    from, chosen by `leakbench.core.seeds.distractor_indices`."""
    other = public_split(dataset, private_split)
    chosen = distractor_indices(len(other), DISTRACTORS)
    x = np.asarray(other.x)
    # A block at a time: the float copies of a pool of 224 x 224 images would be 600 MB each.
    parts = [_to_uint8(x[chosen[k : k + 128]]) for k in range(0, len(chosen), 128)]
    return np.concatenate(parts) if parts else _to_uint8(x[chosen])


def _to_uint8(images: np.ndarray) -> np.ndarray:
    """Images in [0, 1] as the 8-bit images a run directory keeps (`leakbench.outputs.arrays`)."""
    return np.round(np.clip(images, 0.0, 1.0) * 255.0).astype(np.uint8)


def class_means(dataset: Dataset, private_split: str) -> np.ndarray:
    """The null's class means: float64 ``[classes + 1, H, W, C]``, the mean image of each class
    of the public split (`public_split`; a class it lacks gets the split's mean) and, last,
    the mean of the whole split, for a row whose recovered label is unknown (negative or out
    of range)."""
    split = public_split(dataset, private_split)
    # Summed in float64 from the images as they are (no float64 copy of the split).
    x, y = np.asarray(split.x), np.asarray(split.y)
    overall = x.mean(axis=0, dtype=np.float64)
    means = [
        x[y == c].mean(axis=0, dtype=np.float64) if (y == c).any() else overall
        for c in range(dataset.num_classes)
    ]
    return np.stack([*means, overall])


@dataclasses.dataclass(frozen=True)
class NullBounds:
    """What the label-only null reaches on a dataset's public images (`null_bounds`): the PSNR
    it exceeds, and the LPIPS it falls below, on at most `CHANCE_ALPHA` of them (NaN when the
    distance is not LPIPS). A reconstruction is recognisable under protocol 2 only beyond one
    of them (strictly)."""

    psnr: float
    lpips: float


def null_bounds(dataset: Dataset, private_split: str, variant: str | None) -> NullBounds:
    """What the label-only null reaches on the public split of ``dataset``: each image of the
    distractor pool (`distractor_pool`) against the mean of the other public images of its
    class (the whole split's mean for an image alone in its class), both as 8-bit images,
    scored by PSNR and (when ``variant`` is an LPIPS network, else NaN) LPIPS. The bounds are
    the scores the null beats on at most `CHANCE_ALPHA` of the pool: the upper quantile of
    its PSNRs and the lower quantile of its LPIPS distances. A threshold the label alone
    meets more often than the identification test's level allows is no test of an image; a
    quantile, unlike the pool's extreme, does not tighten as the pool grows."""
    split = public_split(dataset, private_split)
    x, y = np.asarray(split.x), np.asarray(split.y)
    chosen = distractor_indices(len(x), DISTRACTORS)
    sums: dict[int, np.ndarray] = {}
    counts: dict[int, int] = {}
    for label in np.unique(y[chosen]):
        members = x[y == label]
        sums[int(label)], counts[int(label)] = members.sum(0, dtype=np.float64), len(members)
    overall = x.mean(axis=0, dtype=np.float64)
    psnrs, distances = [], []
    lpips_known = uses_lpips(variant)
    for k in range(0, len(chosen), 128):
        block = chosen[k : k + 128]
        images = x[block].astype(np.float64)
        nulls = np.stack([
            (sums[int(y[i])] - image) / (counts[int(y[i])] - 1)
            if counts[int(y[i])] > 1 else overall
            for i, image in zip(block, images, strict=True)
        ])  # fmt: skip
        originals, floor = _to_uint8(images), _to_uint8(nulls)
        a = originals.reshape(len(block), -1) / 255.0
        b = floor.reshape(len(block), -1) / 255.0
        mse = ((a - b) ** 2).mean(1)
        psnrs.append(10.0 * np.log10(1.0 / np.maximum(mse, 1e-10)))
        if lpips_known:
            distances.append(((embed(originals, variant) - embed(floor, variant)) ** 2).sum(1))
    # Quantiles that are scores of the pool, so that strictly beyond them lie at most that
    # share of the null's own scores.
    psnr = float(np.quantile(np.concatenate(psnrs), 1.0 - CHANCE_ALPHA, method="higher"))
    if not lpips_known:
        return NullBounds(psnr, float("nan"))
    return NullBounds(psnr, float(np.quantile(np.concatenate(distances), CHANCE_ALPHA,
                                              method="lower")))  # fmt: skip


def null_reconstructions(
    means: np.ndarray, label: int, seed: int, batch_index: int, position: int
) -> np.ndarray:
    """The `NULL_DRAWS` standing null reconstructions of one image row, uint8 NHWC: the class
    mean of its recovered ``label`` (`class_means`; the overall mean for an unknown label) plus
    Gaussian noise of std `NULL_STD`, clipped and rounded to 8 bits, drawn from a generator
    seeded by (`NULL_STREAM`, seed, batch index, position), so that every export of a row
    draws the same images."""
    classes = len(means) - 1
    mean = means[int(label)] if 0 <= int(label) < classes else means[-1]
    rng = np.random.default_rng([NULL_STREAM, int(seed), int(batch_index), int(position)])
    noise = rng.standard_normal((NULL_DRAWS, *mean.shape)) * NULL_STD
    return _to_uint8(mean[None] + noise)


def identified(
    originals: np.ndarray,
    reconstructions: np.ndarray,
    pool: np.ndarray,
    variant: str | None = lpips_metric.DEFAULT_VARIANT,
    pool_embedding: np.ndarray | EmbeddedPool | None = None,
) -> np.ndarray:
    """Per image, whether the reconstruction is nearer its own original than every image of
    ``pool`` (a tie is not an identification).

    Args:
        originals: NHWC images (uint8, or floats in [0, 1]).
        reconstructions: Images like ``originals``, one per original, in the same order.
        pool: The distractor images, NHWC like the originals.
        variant: The LPIPS backbone, or None / ``"none"`` for the pixel distance.
        pool_embedding: ``embed(pool, variant)`` or its `EmbeddedPool`, when the caller keeps
            it for many calls.
    """
    if len(originals) != len(reconstructions):
        raise ValueError("identified needs one reconstruction per original")
    if len(originals) == 0:
        return np.zeros(0, bool)
    if len(pool) == 0 and pool_embedding is None:
        raise ValueError("identified needs a distractor pool of at least one image")
    rec = embed(reconstructions, variant)
    own = ((rec - embed(originals, variant)) ** 2).sum(1)
    others = pool_embedding if pool_embedding is not None else EmbeddedPool(pool, variant)
    return own < nearest_pool(rec, others)


def recognisable(
    lpips: np.ndarray,
    psnr: np.ndarray,
    null_lpips: np.ndarray | None = None,
    null_psnr: np.ndarray | None = None,
    bounds: NullBounds | None = None,
) -> np.ndarray:
    """Per image: PSNR at least `RECOGNISABLE_PSNR` or LPIPS at most `RECOGNISABLE_LPIPS` (a
    NaN LPIPS, not scored, meets no threshold); with the dataset's ``bounds`` (`null_bounds`,
    protocol 2) a measure counts only beyond its bound as well (a NaN bound is met by nothing),
    so the bounds make the rule stricter where the label alone reaches a threshold, never
    looser.

    With the label-only null's scores (``null_lpips``, ``null_psnr``: the public class mean of
    the recovered label against the same original, `label_floor`; protocol 2), a threshold
    counts only where the reconstruction is strictly better than the null on that same
    measure: a picture of the label alone is never a recognisable image. A NaN null (no
    arrays to score it from) leaves that measure's threshold alone."""
    lpips = np.asarray(lpips, np.float64)
    psnr = np.asarray(psnr, np.float64)
    by_psnr, by_lpips = psnr >= RECOGNISABLE_PSNR, lpips <= RECOGNISABLE_LPIPS
    if bounds is not None:
        by_psnr &= psnr > bounds.psnr
        by_lpips &= lpips < bounds.lpips
    if null_psnr is not None:
        floor = np.asarray(null_psnr, np.float64)
        by_psnr &= np.isnan(floor) | (psnr > floor)
    if null_lpips is not None:
        floor = np.asarray(null_lpips, np.float64)
        by_lpips &= np.isnan(floor) | (lpips < floor)
    return by_psnr | by_lpips


def label_floor(means: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """The label-only null of each row as 8-bit NHWC images: the public class mean of its
    recovered label (`class_means`; the split's mean for an unknown label), what an attacker
    who learnt the label and nothing else of the image would show."""
    classes = len(means) - 1
    picks = [int(v) if 0 <= int(v) < classes else classes for v in np.asarray(labels)]
    return _to_uint8(means[picks])


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


def leak_graph(
    originals: np.ndarray,
    reconstructions: np.ndarray,
    distances: np.ndarray,
    nearest: np.ndarray | None,
    success_mse: float,
    lpips_known: bool,
    floors: tuple[np.ndarray, np.ndarray] | None = None,
    bounds: NullBounds | None = None,
) -> np.ndarray:
    """The leak graph of one batch: ``edges[r, o]`` is true when reconstruction ``r`` leaks
    original ``o`` by the per-image tests, applied to the pair: recovered (MSE at most
    ``success_mse``), recognisable (PSNR at least `RECOGNISABLE_PSNR`, or, with
    ``lpips_known``, LPIPS at most `RECOGNISABLE_LPIPS`) or identified (``r`` nearer ``o``
    than its ``nearest`` pool image; None: identifications do not count).

    Args:
        originals: The batch's 8-bit originals, ``[B, H, W, C]``.
        reconstructions: Its 8-bit reconstructions, ``[B, H, W, C]``.
        distances: ``[B, B]`` identification distances (squared `embed` distances, the LPIPS
            distance when LPIPS is on), reconstruction by original.
        nearest: ``[B]`` each reconstruction's squared distance to its nearest pool image.
        success_mse: The run's exact-recovery threshold.
        lpips_known: Whether ``distances`` are LPIPS distances (else pixel errors, not
            compared with `RECOGNISABLE_LPIPS`).
        floors: Protocol 2's label-only null of each original, ``([B] PSNR, [B] distance)``
            (`label_floor` scored like a reconstruction): a recognisable edge must beat the
            null of its original on the measure that makes it one (`recognisable`).
        bounds: Protocol 2's bounds of the dataset (`null_bounds`), met as well as
            `RECOGNISABLE_PSNR` or `RECOGNISABLE_LPIPS`.
    """
    n = len(originals)
    a = np.asarray(originals, np.float64).reshape(n, -1) / 255.0
    b = np.asarray(reconstructions, np.float64).reshape(n, -1) / 255.0
    errors = squared_distances(b, a) / a.shape[1]
    with np.errstate(divide="ignore"):
        psnr = 10.0 * np.log10(1.0 / np.maximum(errors, 1e-10))
    null_psnr, null_distance = (None, None) if floors is None else floors
    by_psnr = psnr >= RECOGNISABLE_PSNR
    if bounds is not None:
        by_psnr &= psnr > bounds.psnr
    if null_psnr is not None:
        by_psnr &= psnr > np.asarray(null_psnr)[None, :]
    edges = (errors <= success_mse) | by_psnr
    if lpips_known:
        by_lpips = distances <= RECOGNISABLE_LPIPS
        if bounds is not None:
            by_lpips &= distances < bounds.lpips
        if null_distance is not None:
            by_lpips &= distances < np.asarray(null_distance)[None, :]
        edges |= by_lpips
    if nearest is not None:
        edges |= distances < np.asarray(nearest)[:, None]
    return edges


def matched_leaks(edges: np.ndarray, assigned: np.ndarray) -> np.ndarray:
    """Per original, whether a maximum-cardinality matching of the leak graph covers it.

    ``edges[r, o]``: reconstruction ``r`` leaks original ``o`` (`leak_graph`);
    ``assigned[i]``: the MSE-assigned pair (reconstruction ``i``, original ``i``) leaks, by the
    row's own flags, which replace the graph's diagonal. Among the maximum matchings the one
    keeping most assigned leaked pairs is taken: each edge weighs ``B + 1`` and an assigned
    leaked pair one more, so no bonus (at most ``B`` in all) outweighs an edge, and the
    assignment's own leaks form a matching, so the count is never below theirs. For ``B = 1``
    it is the row's own flag.
    """
    graph = np.array(edges, bool, copy=True)
    n = len(graph)
    if graph.shape != (n, n) or len(assigned) != n:
        raise ValueError(
            f"matched_leaks needs a square graph and one flag per pair, got {graph.shape}"
        )
    keep = np.asarray(assigned, bool)
    np.fill_diagonal(graph, keep)
    weights = graph * float(n + 1) + np.diag(keep.astype(float))
    rows, cols = linear_sum_assignment(weights, maximize=True)
    covered = np.zeros(n, bool)
    covered[cols] = graph[rows, cols]
    return covered
