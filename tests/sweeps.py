"""Variant sweeps on the emulator.

Every variant runs in the full run (CI, ``-m "slow or not slow"``); the default run keeps two
of each sweep -- (64, 64) causal and (128, 128) non-causal -- so that both masks, two tile
shapes and both of each dtype's code paths stay covered on every change in seconds rather
than minutes.
"""

import pytest

QUICK = {(64, 64, True), (128, 128, False)}


def sweep(variants, key=lambda v: (v.d_qk, v.d_v, v.causal), name=lambda v: v.name, quick=QUICK):
    """``variants`` as parameters, all but the ``quick`` ones marked ``slow``."""
    return [pytest.param(v, id=name(v), marks=() if key(v) in quick else pytest.mark.slow)
            for v in variants]
