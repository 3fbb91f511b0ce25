"""The zig-zag split of one causal sequence over N ranks, and what each ring step computes.

The sequence of L = 2 N C tokens is cut into 2N chunks of C tokens.  Rank r holds chunks r and
2N-1-r, in that order, as its local rows 0..2C-1 (an early chunk and a late one: under the causal
mask chunk c has c+1 chunks of keys, so every rank's two chunks add up to 2N+1, the same work).

Ring step s = 0..N-1: rank r holds the K/V of rank j = (r - s) mod N (chunks j and 2N-1-j, local
rows 0..C-1 and C..2C-1 of the held block).  What its queries see of them:

* s = 0 (j = r): its own keys; in local order the causal mask is exactly the global one (the early
  chunk sees itself causally, the late chunk all of the early one and itself causally): ONE
  causal call, Sq = Sk = 2C.
* j < r: chunk j precedes both query chunks, chunk 2N-1-j follows both (2N-1-j > 2N-1-r >= N > r):
  ONE full call, all 2C queries against the held rows 0..C-1.
* j > r: the early query chunk r precedes both key chunks (j > r, 2N-1-j >= N > r): nothing; the
  late chunk 2N-1-r follows both (j <= N-1 < 2N-1-r, 2N-1-j < 2N-1-r): ONE full call, query rows
  C..2C-1 against all 2C held rows.

So each step is one attention call of 2C x 2C causal or 2C x C / C x 2C full -- 2C^2 score pairs
each, balanced over steps as over ranks -- and no call ever needs a mask beyond plain causal.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class StepCall:
    """One attention call of a ring step, in local rows: queries ``q_rows`` of the rank's own 2C
    rows against keys ``kv_rows`` of the held 2C-row block, ``causal`` as flash_attn_func's
    (bottom-right aligned; only with Sq == Sk here)."""
    q_rows: slice
    kv_rows: slice
    causal: bool

    @property
    def all_queries(self) -> bool:
        """Whether the call takes all 2C query rows (else the late C)."""
        return self.q_rows == slice(0, None)

    @property
    def all_keys(self) -> bool:
        """Whether the call takes all 2C held rows (else the early C)."""
        return self.kv_rows == slice(0, None)


def chunks_of(rank: int, n: int) -> tuple[int, int]:
    """The two chunks rank ``rank`` of ``n`` holds: its local rows 0..C-1, then C..2C-1."""
    if not 0 <= rank < n:
        raise ValueError(f"rank {rank} is not one of 0..{n - 1}")
    return rank, 2 * n - 1 - rank


def source_rank(rank: int, step: int, n: int) -> int:
    """Whose K/V rank ``rank`` holds at ring step ``step`` (they travel r -> r+1 each step)."""
    return (rank - step) % n


def step_call(rank: int, step: int, n: int, chunk: int) -> StepCall:
    """The one call of ring step ``step`` on rank ``rank`` (module docstring)."""
    if not 0 <= step < n:
        raise ValueError(f"step {step} is not one of 0..{n - 1}")
    j = source_rank(rank, step, n)
    if j == rank:
        return StepCall(slice(0, None), slice(0, None), causal=True)
    if j < rank:
        return StepCall(slice(0, None), slice(0, chunk), causal=False)
    return StepCall(slice(chunk, None), slice(0, None), causal=False)


def positions(rank: int, n: int, chunk: int) -> np.ndarray:
    """The global token positions of rank ``rank``'s local rows 0..2C-1."""
    a, b = chunks_of(rank, n)
    return np.concatenate([np.arange(a * chunk, (a + 1) * chunk), np.arange(b * chunk, (b + 1) * chunk)])


def split(x: np.ndarray, n: int, axis: int = 1) -> list[np.ndarray]:
    """Rank r's rows of a whole sequence ``x`` (length 2 n C along ``axis``), for r = 0..n-1."""
    length = x.shape[axis]
    if length % (2 * n):
        raise ValueError(f"a sequence of {length} tokens does not cut into {2 * n} equal chunks")
    chunk = length // (2 * n)
    return [np.take(x, positions(r, n, chunk), axis=axis) for r in range(n)]


def gather(parts: list[np.ndarray], axis: int = 1) -> np.ndarray:
    """The whole sequence from every rank's rows (``split``'s inverse)."""
    n = len(parts)
    chunk = parts[0].shape[axis] // 2
    shape = list(parts[0].shape)
    shape[axis] = 2 * n * chunk
    out = np.empty(shape, parts[0].dtype)
    for r, part in enumerate(parts):
        index = [slice(None)] * out.ndim
        index[axis] = positions(r, n, chunk)
        out[tuple(index)] = part
    return out


def visible(sq: int, sk: int, causal: bool) -> np.ndarray:
    """(sq, sk) bool: which keys each query of one call sees under flash_attn_func's rule (query
    i sees key j <= i + sk - sq when causal, every key otherwise)."""
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    return j <= i + sk - sq if causal else np.ones((sq, sk), bool)


def pair_counts(n: int, chunk: int) -> np.ndarray:
    """(L, L) int: how many times the whole ring computes each (query, key) score of the sequence
    -- every step of every rank, through its call's rows and mask mapped to global positions."""
    length = 2 * n * chunk
    counts = np.zeros((length, length), np.int64)
    for rank in range(n):
        q_pos = positions(rank, n, chunk)
        for step in range(n):
            call = step_call(rank, step, n, chunk)
            qp = q_pos[call.q_rows]
            kp = positions(source_rank(rank, step, n), n, chunk)[call.kv_rows]
            mask = visible(len(qp), len(kp), call.causal)
            np.add.at(counts, (np.broadcast_to(qp[:, None], mask.shape)[mask],
                               np.broadcast_to(kp[None, :], mask.shape)[mask]), 1)
    return counts
