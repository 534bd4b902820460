"""Identification's vectors: images embedded so that squared distances are the identification
distance, and the distractor pool's embeddings held within a memory bound.

An embedding is LPIPS's (`leakbench.components.lpips.embed`: float32, ``D`` about 9.7 H W for
AlexNet at H x W of 32 or more) or, where LPIPS is off, the pixels over their count (float64,
``D`` = H W C). At 32 x 32 a pool of 999 images is 23 MB; at 224 x 224 it is 1.9 GB of AlexNet
features, more than the rest of a run. `EmbeddedPool` therefore keeps a pool in memory only
when its float64 copy fits in `BLOCK_BYTES`, and otherwise writes it, block by block as it is
embedded, to an unnamed temporary file that `EmbeddedPool.nearest` reads back one block at a
time: the memory it holds is one block and the queries' distances to it, whatever the pool's
size. The distances are those of the in-memory pool up to rounding, not bit for bit: a
block's products run over fewer rows, and LPIPS's network embeds a block's images as a batch
of their own, whose convolutions may sum in another order (by batch size and processor) than
the whole pool's; the pixel embedding has no sums, so its rows are the in-memory rows exactly.
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Iterator
from typing import IO

import numpy as np

from leakbench.components import lpips as lpips_metric
from leakbench.components.lpips_weights import available as lpips_available

# The most bytes of float64 embeddings `EmbeddedPool` holds at once, and the size of the query
# blocks `rows_within` gives: a pool (or a block of queries) of 32 x 32 images fits in one; at
# 224 x 224 a block holds 138 AlexNet embeddings.
BLOCK_BYTES = 512 * 2**20
# Queries whose distances to the pool are taken at once (`nearest_pool`).
QUERY_ROWS = 512


def uses_lpips(variant: str | None) -> bool:
    """Whether the identification distance is LPIPS: a variant is named and its weights are
    there (else the pixels' squared error)."""
    return variant not in (None, "none") and lpips_available(variant)


def _embed_native(images: np.ndarray, variant: str | None) -> np.ndarray:
    """`embed` before its cast to float64: LPIPS's float32 vectors, or the pixels over their count
    in float64."""
    x = np.asarray(images)
    if x.dtype == np.uint8:
        x = x.astype(np.float32) / 255.0
    if variant is not None and uses_lpips(variant):
        return lpips_metric.embed(x, variant)
    return x.reshape(len(x), -1).astype(np.float64) / x[0].size if len(x) else x.reshape(0, 0)


def embed(images: np.ndarray, variant: str | None) -> np.ndarray:
    """Vectors (float64 ``[N, D]``) whose squared distances are the identification distance:
    LPIPS (`variant`) when its weights are there, else the pixels (so the distance is the
    squared error)."""
    return _embed_native(images, variant).astype(np.float64)


@functools.lru_cache(maxsize=64)
def embedding_size(image_shape: tuple[int, ...], variant: str | None) -> int:
    """``D``, the length of `embed`'s vectors for images of ``image_shape`` (H, W, C)."""
    if not uses_lpips(variant):
        return int(np.prod(image_shape))
    return int(_embed_native(np.zeros((1, *image_shape), np.float32), variant).shape[1])


def rows_within(image_shape: tuple[int, ...], variant: str | None, copies: int = 1) -> int:
    """How many images' float64 embeddings, ``copies`` of each, fit in `BLOCK_BYTES` (at least
    one): the block size of the pool and of the queries embedded at once."""
    per_row = 8 * copies * embedding_size(tuple(image_shape), variant)
    return max(1, BLOCK_BYTES // per_row)


def squared_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise squared Euclidean distances of the rows of ``a`` and ``b``, ``[len(a), len(b)]``."""
    return np.maximum((a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2.0 * a @ b.T, 0.0)


class EmbeddedPool:
    """The embeddings of a distractor pool (`embed` of ``images``), in memory when they fit in
    ``block_bytes`` (float64), else in an unnamed temporary file read back one block of rows at
    a time; the file is gone when the pool is closed or collected."""

    def __init__(
        self, images: np.ndarray, variant: str | None, block_bytes: int = BLOCK_BYTES
    ) -> None:
        self.size = len(images)
        self.dim = embedding_size(tuple(np.shape(images)[1:]), variant) if self.size else 0
        self.rows = max(1, block_bytes // max(8 * self.dim, 1))
        self._memory: np.ndarray | None = None
        self._file: IO[bytes] | None = None
        self._dtype = np.dtype(np.float32 if uses_lpips(variant) else np.float64)
        if self.size <= self.rows:
            self._memory = embed(images, variant)
            return
        self._file = tempfile.TemporaryFile(prefix="leakbench-pool-")
        for k in range(0, self.size, self.rows):
            part = _embed_native(images[k : k + self.rows], variant).astype(self._dtype)
            self._file.write(part.tobytes())
        self._file.flush()

    @property
    def streamed(self) -> bool:
        """Whether the embeddings are on disk (larger than one block)."""
        return self._file is not None

    def blocks(self) -> Iterator[np.ndarray]:
        """The embeddings, float64, one block of at most ``rows`` rows at a time."""
        if self._memory is not None:
            yield self._memory
            return
        if self._file is None:
            raise ValueError("the pool is closed")
        row_bytes = self.dim * self._dtype.itemsize
        for k in range(0, self.size, self.rows):
            count = min(self.rows, self.size - k)
            self._file.seek(k * row_bytes)
            data = self._file.read(count * row_bytes)
            yield np.frombuffer(data, self._dtype).reshape(count, self.dim).astype(np.float64)

    def nearest(self, embedded: np.ndarray) -> np.ndarray:
        """Per row of ``embedded``, its squared distance to the nearest pool image; a pool on
        disk is read once per call, block by block."""
        if self._memory is not None:
            return nearest_pool(embedded, self._memory)
        best = np.full(len(embedded), np.inf)
        if len(embedded) == 0:
            return best
        queries = [
            (k, embedded[k : k + QUERY_ROWS], (embedded[k : k + QUERY_ROWS] ** 2).sum(1))
            for k in range(0, len(embedded), QUERY_ROWS)
        ]
        for block in self.blocks():
            block_norms = (block * block).sum(1)
            for k, query, norms in queries:
                distances = norms[:, None] + block_norms[None, :] - 2.0 * query @ block.T
                part = best[k : k + len(query)]
                np.minimum(part, np.maximum(distances, 0.0).min(1), out=part)
        return best

    def close(self) -> None:
        """Deletes the temporary file (if any)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def nearest_pool(embedded: np.ndarray, pool_embedding: np.ndarray | EmbeddedPool) -> np.ndarray:
    """Per embedded image, its squared distance to the nearest pool image, `QUERY_ROWS` images at
    a time (never a ``[N, pool]`` matrix for more than that many of them)."""
    if isinstance(pool_embedding, EmbeddedPool):
        return pool_embedding.nearest(embedded)
    if len(embedded) == 0:
        return np.zeros(0)
    return np.concatenate(
        [
            squared_distances(embedded[k : k + QUERY_ROWS], pool_embedding).min(1)
            for k in range(0, len(embedded), QUERY_ROWS)
        ]
    )
