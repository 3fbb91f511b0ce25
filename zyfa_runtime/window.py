"""Which keys a query row sees: causal masking and sliding windows, one rule for every kernel,
the references and the planner.

FlashAttention's semantics, bottom-right aligned: in a sequence of ``sq`` queries and ``sk``
keys, query row i sits at key position ``i + sk - sq`` (the queries are the newest
positions), and with ``window_size = (left, right)`` it sees key j iff

    i + sk - sq - left  <=  j  <=  i + sk - sq + right,

a bound of -1 being none.  ``causal`` is ``right = 0`` (with no left bound: plain causal).
Rows may see no key at all (a window that ends before key 0, or Sq > Sk with causal).

:func:`normalize` states the window a call means; :func:`reduce` drops bounds that cut
nothing for sequences up to given lengths (such a window runs the plain kernels);
:func:`visible` is the mask, :func:`visible_count` its number of pairs; :func:`key_range` the keys a block of rows may see (a kernel's
first and last key block per query tile).
"""

from __future__ import annotations

import numpy as np

#: The window of a call without one.
NONE = (-1, -1)


def normalize(causal: bool, window_size=NONE) -> tuple[int, int]:
    """The window ``(left, right)`` a call means: ``causal`` sets ``right = 0``.  The values
    are taken as valid (validate.check_window states the rules)."""
    left, right = (int(x) for x in window_size)
    return (left, 0) if causal else (left, right)


def reduce(window: tuple[int, int], max_seqlen_q: int, max_seqlen_k: int) -> tuple[int, int]:
    """``window`` with each bound that cuts no key of any sequence of at most ``max_seqlen_q``
    queries and ``max_seqlen_k`` keys set to -1.  Row i's left bound is ``i + sk - sq - left
    <= sk - 1 - left``: none past key 0 once ``left >= max_seqlen_k - 1``; its right bound is
    ``i + sk - sq + right >= sk - sq + right``: none before key ``sk - 1`` once ``right >=
    max_seqlen_q - 1``.  A right bound of 0 stays: it is causal masking, which the causal
    kernels take."""
    left, right = window
    if left >= max(max_seqlen_k - 1, 0):
        left = -1
    if right > 0 and right >= max_seqlen_q - 1:
        right = -1
    return left, right


def is_causal(window: tuple[int, int]) -> bool:
    """Whether a (reduced) window is plain causal masking: no left bound, right bound 0."""
    return window == (-1, 0)


def visible(sq: int, sk: int, window: tuple[int, int]) -> np.ndarray:
    """(sq, sk) bool: key j is visible to query row i (the module's rule)."""
    left, right = window
    pos = np.arange(sq)[:, None] + (sk - sq)
    j = np.arange(sk)[None, :]
    seen = np.ones((sq, sk), dtype=bool)
    if right >= 0:
        seen &= j <= pos + right
    if left >= 0:
        seen &= j >= pos - left
    return seen


def visible_count(sq: int, sk: int, window: tuple[int, int]) -> int:
    """The (query, key) pairs :func:`visible` holds, row by row without building the mask (a
    windowed launch's FLOPs count these pairs only)."""
    left, right = window
    pos = np.arange(sq, dtype=np.int64) + (sk - sq)
    first = np.maximum(pos - left, 0) if left >= 0 else np.zeros(sq, np.int64)
    end = np.minimum(pos + right + 1, sk) if right >= 0 else np.full(sq, sk, np.int64)
    return int(np.maximum(end - first, 0).sum())


def key_range(row_lo: int, row_hi: int, sq: int, sk: int, window: tuple[int, int]) -> tuple[int, int]:
    """The keys ``[first, end)`` that rows ``row_lo .. row_hi - 1`` of a sequence may see: every
    key a row of them sees lies inside, and a key block wholly outside is never needed
    (``first >= end``: none).  A kernel's query tile loads key blocks ``first // block_n``
    to ``(end - 1) // block_n``."""
    left, right = window
    off = sk - sq
    first = max(row_lo + off - left, 0) if left >= 0 else 0
    end = min(row_hi - 1 + off + right + 1, sk) if right >= 0 else sk
    return first, max(end, first)
