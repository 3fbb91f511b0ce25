"""Other people's gfx950 code objects, run on the emulator as ground truth.

A kernel that is proven on silicon and computes correctly on the emulator validates the
emulator on code nobody here wrote.  Nothing of theirs is vendored: each peer is fetched
with pip from PyPI into the user cache (``platformdirs.user_cache_dir("zyfa")/peers``,
or ``$ZYFA_PEERS_DIR``), checked against a pinned sha256, and only the files needed are
extracted.

* :mod:`.aiter_fav3` -- AMD AITER's FAv3 attention forward kernels for gfx950
  (``amd-aiter``, MIT): fetching, the argument block parsed from AITER's own header, and
  a launcher on the emulator's driver.
"""

from __future__ import annotations

import os
from pathlib import Path


class PeerUnavailable(RuntimeError):
    """A peer's files could not be fetched or do not match their pinned hash."""


def peers_dir() -> Path:
    """Where peers are cached: ``$ZYFA_PEERS_DIR`` or ``<user cache>/zyfa/peers``."""
    env = os.environ.get("ZYFA_PEERS_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs
    return Path(platformdirs.user_cache_dir("zyfa")) / "peers"


__all__ = ["PeerUnavailable", "peers_dir"]
