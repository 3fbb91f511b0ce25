"""The limits of the gfx950 BF16 paged copies' address arithmetic (hip/bf16_lds.h
CopyCore::tile): a page's offset is a 32 x 32 -> 64-bit multiply of the page by its stride in
bytes (plan.PAGE_STRIDE_LIMIT, 4 GiB), and a 16-row group's buffer size a 24-bit multiply of
its rows by the row stride in bytes (plan.PAGE_ROW_STRIDE_LIMIT, 16 MiB).  A cache beyond
either is refused with a clear error before anything is launched (the emulator's instruction
count does not move)."""

import numpy as np
import pytest

from emukit import bf16, built_with, emulator  # noqa: F401 (emulator: a fixture)

from zyfa_runtime import TensorRef, flash_attn_with_kvcache
from zyfa_runtime.catalogue import Variant

V = Variant("gfx950", "bf16", 64, 64, True)

pytestmark = pytest.mark.skipif(not built_with([V], ("kvcache", "paged_kv")),
                                reason="gfx950 BF16 code objects with KV caches not built "
                                       "(python build.py --arch gfx950 --only bf16)")


@pytest.mark.parametrize("dim, stride, message", [
    # the full run (plan._check_paged_strides, which the FP8 refusal's default case runs too)
    pytest.param(0, 2**31, "page stride of 4294967296 bytes", marks=pytest.mark.slow),  # 2^31 bf16: 4 GiB
    pytest.param(1, 2**23, "row stride of 16777216 bytes", marks=pytest.mark.slow),  # 2^23 bf16: 16 MiB
], ids=["page stride 4 GiB", "row stride 16 MiB"])
def test_a_paged_cache_whose_strides_overflow_the_copys_multiplies_is_refused_before_launch(emulator, dim,
                                                                                          stride, message):
    rng = np.random.default_rng(47)
    q = bf16(rng.standard_normal((1, 16, 2, V.d_qk)))
    k = bf16(rng.standard_normal((4, 16, 1, V.d_qk)))
    v = bf16(rng.standard_normal((4, 16, 1, V.d_v)))
    table = rng.permutation(4).reshape(1, 4).astype(np.int32)
    strides = [s // k.itemsize for s in k.strides]
    strides[dim] = stride
    far = TensorRef(ptr=k.ctypes.data, shape=k.shape, strides=tuple(strides), dtype="bf16", device=("cpu", 0))
    launched = emulator.machine.instructions
    with pytest.raises(ValueError, match=message):
        flash_attn_with_kvcache(q, far, v, cache_seqlens=np.array([40], np.int32), page_table=table, causal=True)
    assert emulator.machine.instructions == launched
