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
- **recognisable**: by protocol 1, PSNR at least `RECOGNISABLE_PSNR` or LPIPS at most
  `RECOGNISABLE_LPIPS`, chosen once from a person's reading of 104 committed reconstructions
  of four datasets (``results/calibration/``, README there). Protocol 2 replaces the reader
  with the data: a measure counts only where the reconstruction is nearer its original than
  the best label-only guess (the class mean, or the class's medoid by pixels or by LPIPS)
  brings all but `BOUND_SHARE` of the public split's images (`null_bounds`) and than its own
  label-only null (`label_floor`; docs/metrics.md, "Recognisable").

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
# The share of public images on which a label-only guess may pass each of the two measures of
# protocol 2's ``recognisable`` (`null_bounds`): half of `CHANCE_ALPHA`, so that it passes
# their union (PSNR or LPIPS) on at most `CHANCE_ALPHA`.
BOUND_SHARE = CHANCE_ALPHA / 2
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
    """What a label-only guess reaches on a dataset's public images (`null_bounds`): the PSNR
    the best guess exceeds, and the LPIPS it falls below, on at most `BOUND_SHARE` of them (NaN
    when the distance is not LPIPS). A reconstruction is recognisable under protocol 2 only
    beyond one of them (strictly)."""

    psnr: float
    lpips: float


def null_bounds(dataset: Dataset, private_split: str, variant: str | None) -> NullBounds:
    """What the label alone reaches on the public split of ``dataset``: each image of the
    distractor pool (`distractor_pool`) is guessed from its label and the other public images
    in up to three ways (the mean of the other public images of its class, `_class_mean_guesses`,
    and its class's medoid among the other pool images by pixel distance and, when ``variant``
    is an LPIPS network, by the LPIPS distance, `_medoid_guesses`), all as 8-bit images, and
    scored by PSNR and (LPIPS known, else NaN) LPIPS. Each bound is what the best of those
    guesses beats on at most `BOUND_SHARE` of the pool (half the identification level per
    measure): the highest upper quantile of the guesses' PSNRs and the lowest lower quantile
    of their LPIPS distances. A reconstruction no nearer its original than a picture of its
    label is evidence of the label only; a quantile, unlike the pool's extreme, does not
    tighten as the pool grows. On the class mean alone, CIFAR-10's LPIPS bound was 0.33, which
    noise passes; the medoid (a plain, typical image of the class) brings it to 0.063."""
    split = public_split(dataset, private_split)
    x, y = np.asarray(split.x), np.asarray(split.y)
    chosen = distractor_indices(len(x), DISTRACTORS)
    labels = y[chosen]
    originals = _to_uint8(x[chosen].astype(np.float64))
    means = _class_mean_guesses(x, y, chosen)
    pixels = originals.reshape(len(chosen), -1).astype(np.float64) / 255.0
    lpips_known = uses_lpips(variant)
    guesses = [means, _medoid_guesses(originals, means, pixels, labels)]
    embedded = _embedded(originals, variant) if lpips_known else None
    if embedded is not None:
        guesses.append(_medoid_guesses(originals, means, embedded, labels))
    # Quantiles that are scores of the pool, so that strictly beyond them lie at most that
    # share of each guess's own scores.
    psnr = max(
        float(np.quantile(_psnr(pixels, guess), 1.0 - BOUND_SHARE, method="higher"))
        for guess in guesses
    )
    if embedded is None:
        return NullBounds(psnr, float("nan"))
    distances = [((embedded - _embedded(g, variant)) ** 2).sum(1) for g in guesses]
    lpips = min(float(np.quantile(d, BOUND_SHARE, method="lower")) for d in distances)
    return NullBounds(psnr, lpips)


def _class_mean_guesses(x: np.ndarray, y: np.ndarray, chosen: np.ndarray) -> np.ndarray:
    """Each pool image's class-mean guess, 8-bit: the mean of the other public images of its
    class (the whole split's mean for an image alone in its class), summed in float64 in
    blocks of 128 rows."""
    sums: dict[int, np.ndarray] = {}
    counts: dict[int, int] = {}
    for label in np.unique(y[chosen]):
        members = x[y == label]
        sums[int(label)], counts[int(label)] = members.sum(0, dtype=np.float64), len(members)
    overall = x.mean(axis=0, dtype=np.float64)
    out = []
    for k in range(0, len(chosen), 128):
        block = chosen[k : k + 128]
        out.append(_to_uint8(np.stack([
            (sums[int(y[i])] - x[i].astype(np.float64)) / (counts[int(y[i])] - 1)
            if counts[int(y[i])] > 1 else overall
            for i in block
        ])))  # fmt: skip
    return np.concatenate(out)


def _medoid_guesses(
    originals: np.ndarray, means: np.ndarray, vectors: np.ndarray, labels: np.ndarray
) -> np.ndarray:
    """Each pool image's medoid guess by the distance of ``vectors`` (one row per image): the
    pool image of its class with the least summed squared distance to the class's images other
    than the one guessed (so the guess never sees it; the lowest index among equals). An image
    with no other of its class in the pool keeps its class-mean guess (``means``)."""
    out = means.copy()
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        if len(members) < 2:
            continue
        d = squared_distances(vectors[members], vectors[members])
        # score[k, i]: candidate k's summed distance to the class less the guessed image i.
        score = d.sum(1)[:, None] - d
        np.fill_diagonal(score, np.inf)
        out[members] = originals[members[np.argmin(score, axis=0)]]
    return out


def _embedded(images: np.ndarray, variant: str | None) -> np.ndarray:
    """`embed` of 8-bit ``images``, 128 at a time."""
    return np.concatenate([embed(images[k : k + 128], variant) for k in range(0, len(images), 128)])


def _psnr(pixels: np.ndarray, guesses: np.ndarray) -> np.ndarray:
    """PSNR (dB, peak 1) of each row of ``pixels`` (flat, in [0, 1]) against its 8-bit guess."""
    mse = ((pixels - guesses.reshape(len(guesses), -1) / 255.0) ** 2).mean(1)
    return 10.0 * np.log10(1.0 / np.maximum(mse, 1e-10))


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
    """Per image: PSNR at least `RECOGNISABLE_PSNR` or LPIPS at most `RECOGNISABLE_LPIPS`
    (protocol 1's reader-set thresholds; a NaN LPIPS, not scored, meets no threshold); with
    the dataset's ``bounds`` (`null_bounds`, protocol 2) the bounds replace them: a measure
    counts only strictly beyond its bound (a NaN bound is met by nothing).

    With the label-only null's scores (``null_lpips``, ``null_psnr``: the public class mean of
    the recovered label against the same original, `label_floor`; protocol 2), a measure
    counts only where the reconstruction is strictly better than the null on that same
    measure: a picture of the label alone is never a recognisable image. A NaN null (no
    arrays to score it from) leaves that measure's threshold alone."""
    lpips = np.asarray(lpips, np.float64)
    psnr = np.asarray(psnr, np.float64)
    if bounds is None:
        by_psnr, by_lpips = psnr >= RECOGNISABLE_PSNR, lpips <= RECOGNISABLE_LPIPS
    else:
        by_psnr, by_lpips = psnr > bounds.psnr, lpips < bounds.lpips
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
    ``success_mse``), recognisable (`recognisable` of the pair's PSNR and, with
    ``lpips_known``, its LPIPS distance) or identified (``r`` nearer ``o`` than its
    ``nearest`` pool image; None: identifications do not count).

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
        bounds: Protocol 2's bounds of the dataset (`null_bounds`), which replace
            `RECOGNISABLE_PSNR` and `RECOGNISABLE_LPIPS`.
    """
    n = len(originals)
    a = np.asarray(originals, np.float64).reshape(n, -1) / 255.0
    b = np.asarray(reconstructions, np.float64).reshape(n, -1) / 255.0
    errors = squared_distances(b, a) / a.shape[1]
    with np.errstate(divide="ignore"):
        psnr = 10.0 * np.log10(1.0 / np.maximum(errors, 1e-10))
    null_psnr, null_distance = (None, None) if floors is None else floors
    lpips = np.asarray(distances, np.float64) if lpips_known else np.full_like(psnr, np.nan)
    edges = (errors <= success_mse) | recognisable(
        lpips,
        psnr,
        None if null_distance is None else np.asarray(null_distance)[None, :],
        None if null_psnr is None else np.asarray(null_psnr)[None, :],
        bounds,
    )
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
