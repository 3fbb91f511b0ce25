"""Real kernels on a real GPU, against the fp64 reference.

Skipped (and reported as skipped, with the reason) where no GPU backend is present.
Small shapes with every feature at once live in ``zyfa_runtime.selfcheck``; this file
adds the interop paths (PyTorch via DLPack, CuPy via __cuda_array_interface__) and the
driver's own view of the argument layout.
"""

import numpy as np
import pytest

from zyfa_runtime import reference
from zyfa_runtime.catalogue import (Variant, all_variants, clamps_cu_seqlens, f16_variant, per_head_descales,
                                    short_variant)
from zyfa_runtime.plan import forced_variant
from zyfa_runtime.selfcheck import bounds


def _gpu():
    try:
        from zyfa_runtime.driver import get_driver
        d = get_driver()
    except Exception:  # no library, no device: pytest's header says why (conftest.py)
        return None, "no GPU backend is usable here"
    if d.host_memory_is_device:
        return None, f"backend {d.name} is not a GPU"
    if d.device_count() < 1:
        return None, "no GPU device"
    return d, ""


DRIVER, WHY = _gpu()


def bf16_to_f64(bits: np.ndarray) -> np.ndarray:
    """bf16 values held as uint16 bits, as float64."""
    return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(DRIVER is None, reason=WHY)]
ARCH = DRIVER.arch(0) if DRIVER is not None else None


@pytest.fixture(autouse=True)
def _the_kernel_named(request):
    """A test of variant ``v`` runs v's own kernel, plain, short-prompt or f16-math
    (catalogue.Variant.short, .f16), whatever length its shapes have (plan.forced_variant)."""
    spec = getattr(request.node, "callspec", None)
    v = spec.params.get("v") if spec is not None else None
    if isinstance(v, Variant) and (short_variant(v) is not None or f16_variant(v) is not None):
        with forced_variant(v):
            yield
    else:
        yield


@pytest.mark.parametrize("v", [v for v in all_variants() if not v.serving], ids=lambda v: v.name)
def test_variant_matches_reference(v):
    from zyfa_runtime.selfcheck import check_variant
    if v.arch != ARCH:
        pytest.skip(f"{v.arch} kernel; this device is {ARCH}")
    results = check_variant(DRIVER, 0, v)
    bad = [(r.case, r.o_error, r.lse_error) for r in results if not r.ok]
    assert not bad, bad


@pytest.mark.parametrize("v", [v for v in all_variants() if v.arch == ARCH and not v.serving],
                         ids=lambda v: v.name)
@pytest.mark.parametrize("varlen", [False, True], ids=["dense", "varlen"])
def test_output_written_exactly_where_it_lies(v, varlen):
    """O is a view into a larger poisoned buffer (a guard row before and after, a head and 8
    columns of padding): every element of the view is written, not one byte around it, for
    sequences of lengths that are no multiple of any tile (and an empty one)."""
    from zyfa_runtime import flash_attn_func, flash_attn_varlen_func
    from zyfa_runtime.memory import to_device, view
    from zyfa_runtime.selfcheck import _descales, _quantise
    rng = np.random.default_rng()
    hq, hkv = 3, 1
    seq = [17, 0, 77, 130] if varlen else [77, 77]
    rows = sum(seq)
    lead = (rows,) if varlen else (len(seq), seq[0])
    host = [_quantise(rng.standard_normal(lead + (h, d)).astype(np.float32), v.dtype)
            for h, d in ((hq, v.d_qk), (hkv, v.d_qk), (hkv, v.d_v))]
    q, k, vv = (to_device(DRIVER, 0, h[0], v.dtype) for h in host)
    scales = _descales(DRIVER, 0, tuple(h[2] for h in host))
    big = np.full(lead[:-1] + (lead[-1] + 2, hq + 1, v.d_v + 8), 0xFFFF, np.uint16)
    inside = np.zeros(big.shape, bool)
    inside[..., 1:1 + lead[-1], 1:, :v.d_v] = True
    out_dev = to_device(DRIVER, 0, big, "bf16")
    out = view(out_dev, big[..., 1:1 + lead[-1], 1:, :v.d_v], big)
    if varlen:
        cu = to_device(DRIVER, 0, np.concatenate([[0], np.cumsum(seq)]).astype(np.int32), "int32")
        flash_attn_varlen_func(q, k, vv, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(seq),
                               max_seqlen_k=max(seq), causal=v.causal, out=out, **scales)
    else:
        flash_attn_func(q, k, vv, causal=v.causal, out=out, **scales)
    got = out_dev.numpy().view(np.uint16)
    assert (got[~inside] == 0xFFFF).all(), f"{int((got[~inside] != 0xFFFF).sum())} elements written outside O"
    o = got[inside].astype(np.uint32) << 16
    assert not np.isnan(o.view(np.float32)).any(), "elements of O left unwritten (or NaN)"


@pytest.mark.parametrize("v", [v for v in all_variants() if v.arch == ARCH and not v.serving],
                         ids=lambda v: v.name)
def test_a_packed_sequence_is_blind_to_the_next_ones_queries_keys_and_values(v):
    """In a packed batch the rows past a sequence's end, to the end of its last query or key
    block, are the next sequence's (the sm_90a kernels copy whole tiles by TMA).  The first
    sequence's output is bit for bit its output alone, with the next sequence's Q all 448
    (e4m3) or 512 (bf16), its K all NaN and its V all NaN (e4m3) or +inf (bf16): P is exactly 0
    past the keys, and 0 times those values must not count; the query rows past the end are
    zeroed (such a row's scores move the BF16 softmax reference of the warp it shares with the
    sequence's last rows, and alone those rows are zeros)."""
    from zyfa_runtime import flash_attn_func, flash_attn_varlen_func
    from zyfa_runtime.memory import to_device
    from zyfa_runtime.selfcheck import _quantise
    rng = np.random.default_rng()
    seq, hq, hkv = [77, 130], 2, 1
    q, k, vv = (_quantise(rng.standard_normal((sum(seq), h, d)).astype(np.float32), v.dtype)[0]
                for h, d in ((hq, v.d_qk), (hkv, v.d_qk), (hkv, v.d_v)))
    bits = np.uint8 if v.dtype == "fp8_e4m3" else np.uint16
    nan, vbad, qbig = (0x7F, 0x7F, 0x7E) if v.dtype == "fp8_e4m3" else (0x7FC0, 0x7F80, 0x4400)
    q.view(bits)[seq[0]:] = qbig
    k.view(bits)[seq[0]:] = nan
    vv.view(bits)[seq[0]:] = vbad
    dev = [to_device(DRIVER, 0, x, v.dtype) for x in (q, k, vv)]
    cu = to_device(DRIVER, 0, np.array([0, seq[0], sum(seq)], np.int32), "int32")
    packed = flash_attn_varlen_func(*dev, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(seq),
                                    max_seqlen_k=max(seq), causal=v.causal)
    alone = flash_attn_func(*(to_device(DRIVER, 0, np.ascontiguousarray(x[None, :seq[0]]), v.dtype)
                              for x in (q, k, vv)), causal=v.causal)
    first = packed.numpy().view(np.uint16)[:seq[0]]
    assert not np.isnan((first.astype(np.uint32) << 16).view(np.float32)).any()
    assert (first == alone.numpy().view(np.uint16)[0]).all()


@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3"])
@pytest.mark.parametrize("order,batch,kv_mib", [("heads first", 2, 8), ("sequences first", 2, 20),
                                                ("each head in turn", 40, 20)])
def test_causal_launch_orders_cover_every_block_once(dtype, order, batch, kv_mib):
    """Causal sm_90a kernels take their tiles heads first, sequences first or each head in turn,
    by the manifest's grid rule (the keys and values of a sequence's heads, or of one head's
    sequences, within 16 MiB; a persistent kernel's tiles rule); the kernel reads the order from
    the grid's shape (a persistent kernel's tiles_x, tiles_y, tiles_z).  Each order
    here, 40 heads: every element of O written, and sampled (sequence, head) pairs, the first
    and last among them, equal to the fp64 reference of their own inputs."""
    torch = pytest.importorskip("torch")
    from zyfa_runtime import as_tensor, flash_attn_func
    from zyfa_runtime.api import kernel_table
    from zyfa_runtime.catalogue import SM90_HEADS_FIRST_BYTES, eval_grid, kv_bytes_per_key
    if ARCH != "sm_90a":
        pytest.skip(f"the launch orders are the sm_90a kernels'; device is {ARCH}")
    v = Variant("sm_90a", dtype, 128, 128, True)
    heads = 40
    s = (kv_mib << 20) // (heads * kv_bytes_per_key(v))       # 40 heads' K and V: kv_mib MiB
    entry = kernel_table(DRIVER).entry(v)
    grid = eval_grid(entry["persistent"]["tiles"] if "persistent" in entry else entry["grid"],   # tiles in order
                     {"seqlen_q": s, "seqlen_k": s, "hq": heads, "hkv": heads, "batch": batch})
    blocks = -(-s // v.tile.block_m)
    assert grid == {"heads first": (heads, blocks, batch), "sequences first": (batch, blocks, heads),
                    "each head in turn": (blocks, heads, batch)}[order]
    assert (heads * s * kv_bytes_per_key(v) <= SM90_HEADS_FIRST_BYTES) == (order == "heads first")
    g = torch.Generator(device="cuda").manual_seed(int(np.random.default_rng().integers(1 << 30)))
    x = [torch.randn(batch, s, heads, 128, device="cuda", generator=g) for _ in range(3)]
    kw = {}
    if dtype == "fp8_e4m3":
        scales = [t.abs().max() / 448 for t in x]
        x = [(t / sc).to(torch.float8_e4m3fn) for t, sc in zip(x, scales)]
        deq = lambda i, b, h: (x[i][b, :, h].double() * scales[i].double()).cpu().numpy()  # noqa: E731
        args = [as_tensor(t.view(torch.uint8), dtype="fp8_e4m3") for t in x]
        kw = {f"descale_{n}": sc.reshape(1) for n, sc in zip("qkv", scales)}
        bound = 0.05           # the recipe's own error against fp64 (selfcheck.RECIPE_FP64_BOUND)
    else:
        x = [t.bfloat16() for t in x]
        deq = lambda i, b, h: x[i][b, :, h].double().cpu().numpy()  # noqa: E731
        args = x
        bound = 8e-3           # bf16 P and output rounding over 128-dim rows
    out = torch.full((batch, s, heads, 128), float("nan"), device="cuda", dtype=torch.bfloat16)
    flash_attn_func(*args, causal=True, out=out, **kw)
    torch.cuda.synchronize()
    assert not out.isnan().any(), "elements of O left unwritten (or NaN)"
    for b, h in {(0, 0), (batch - 1, heads - 1), (batch // 2, 17), (batch - 1, 0), (0, heads - 1)}:
        ref = reference.attention(*(deq(i, b, h)[None, :, None] for i in range(3)), causal=True)
        err = reference.relative_error(out[b, :, h].double().cpu().numpy()[None, :, None], ref)
        assert err < bound, (b, h, err)


def test_driver_sees_the_manifest_layout():
    from zyfa_runtime.api import kernel_table
    table = kernel_table(DRIVER)
    for v in table.available(ARCH):
        kernel = table.get(0, v)
        info = DRIVER.param_info(kernel.function)
        if info is None:
            pytest.skip("the driver cannot report parameter layouts")
        assert info == [(a.offset, a.size) for a in kernel.kernargs], v.name


def test_torch_tensors_via_dlpack_on_a_stream():
    torch = pytest.importorskip("torch")
    from zyfa_runtime import flash_attn_func
    g = torch.Generator(device="cuda").manual_seed(int(np.random.default_rng().integers(1 << 30)))
    q = torch.randn(2, 200, 8, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(2, 333, 2, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(2, 333, 2, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    out = torch.full_like(q, float("nan"))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        _, lse = flash_attn_func(q, k, v, causal=True, out=out, return_lse=True, stream=s)
    s.synchronize()
    ref_o, ref_lse = reference.attention(*(t.double().cpu().numpy() for t in (q, k, v)), causal=True,
                                         return_lse=True)
    assert reference.relative_error(out.double().cpu().numpy(), ref_o) < 8e-3
    assert np.abs(lse.numpy() - ref_lse).max() < bounds(Variant(ARCH, "bf16", 128, 128, True))[1]


@pytest.mark.parametrize("d,causal", [(64, True), (128, False), (256, True)])
def test_bf16_rows_whose_scores_are_all_negative(d, causal):
    """The block max of a row with no score >= 0 (every other 32 rows here: K >= 0, those rows
    of Q <= 0) comes from the kernels' float path, the others' from the integer one; both
    within the BF16 bounds of the fp64 reference, LSE included."""
    torch = pytest.importorskip("torch")
    from zyfa_runtime import flash_attn_func
    g = torch.Generator(device="cuda").manual_seed(int(np.random.default_rng().integers(1 << 30)))
    sq, sk = 224, 300
    sign = 1 - 2 * ((torch.arange(sq, device="cuda") // 32) % 2 == 0).float()
    q = (torch.randn(1, sq, 4, d, device="cuda", generator=g).abs() * sign[None, :, None, None]).bfloat16()
    k = torch.randn(1, sk, 2, d, device="cuda", generator=g).abs().bfloat16()
    v = torch.randn(1, sk, 2, d, device="cuda", generator=g).bfloat16()
    out = torch.full_like(q, float("nan"))
    _, lse = flash_attn_func(q, k, v, causal=causal, out=out, return_lse=True)
    torch.cuda.synchronize()
    qd, kd, vd = (t.double().cpu().numpy() for t in (q, k, v))
    ref_o, ref_lse = reference.attention(qd, kd, vd, causal=causal, return_lse=True)
    neg = (np.arange(sq) // 32) % 2 == 0
    assert (qd[0, neg] <= 0).all() and (qd[0, ~neg] >= 0).all() and (kd >= 0).all()
    assert reference.relative_error(out.double().cpu().numpy(), ref_o) < 8e-3
    assert np.abs(lse.numpy() - ref_lse).max() < bounds(Variant(ARCH, "bf16", d, d, causal))[1]


def test_torch_fp8_as_uint8_with_descales():
    torch = pytest.importorskip("torch")
    from zyfa_runtime import as_tensor, flash_attn_func
    x = [torch.randn(1, 150, 4, 64, device="cuda") for _ in range(3)]
    scales = [t.abs().max() / 448 for t in x]
    q8, k8, v8 = ((t / s).to(torch.float8_e4m3fn) for t, s in zip(x, scales))
    out = torch.empty(1, 150, 4, 64, device="cuda", dtype=torch.bfloat16)
    flash_attn_func(*(as_tensor(t.view(torch.uint8), dtype="fp8_e4m3") for t in (q8, k8, v8)),
                    descale_q=scales[0].reshape(1), descale_k=scales[1].reshape(1),
                    descale_v=scales[2].reshape(1), out=out)
    torch.cuda.synchronize()
    got = out.double().cpu().numpy()
    deq = [(t.double() * s.double()).cpu().numpy() for t, s in zip((q8, k8, v8), scales)]
    ref_o = reference.attention(*deq)
    # FP8 kernels compute P by their recipe: checked against its model (selfcheck's bounds),
    # and against fp64 within the recipe's own error.
    from zyfa_runtime import fp8_models
    from zyfa_runtime.selfcheck import MODEL_BOUNDS, RECIPE_FP64_BOUND, RECIPE_OF
    recipe = RECIPE_OF[(ARCH, "fp8_e4m3")]
    codes = [t.view(torch.uint8).cpu().numpy()[0] for t in (q8, k8, v8)]
    model_o, _ = fp8_models.sequence_forward(*codes, recipe, descale_q=float(scales[0]),
                                             descale_k=float(scales[1]), descale_v=float(scales[2]),
                                             softmax_scale=float(np.float32(1 / np.sqrt(64))))
    assert reference.relative_error(got[0], model_o) < MODEL_BOUNDS[recipe][0]
    assert reference.relative_error(got, ref_o) < RECIPE_FP64_BOUND


@pytest.mark.parametrize("d,sq,sk,causal,negative", [
    (64, 128, 48, False, False), (128, 80, 304, False, False), (128, 272, 400, True, False),
    (192, 96, 272, False, False), (256, 208, 256, True, False), (64, 304, 304, True, False),
    (128, 208, 272, True, False), (192, 144, 208, True, False),
    (128, 160, 400, False, True), (64, 208, 272, True, True), (256, 96, 208, False, True)])
def test_sm90a_fp8_is_its_model_given_the_tensor_core_scores(d, sq, sk, causal, negative):
    """The sm_90a FP8 kernel computes P, the block maxima, the rounded sums and the merge
    exactly as fp8_models' "sm_90a" recipe does, once the model is given the scores the
    FP8 tensor core computes (torch._scaled_mm with fast accumulation: the WGMMA's own
    accumulation).  What remains is the fp32 order of the PV sums and the bf16 output:
    O within 4e-3 of the model, LSE within 5e-4.  With ``negative``, K >= 0 and the rows of
    every other 32 negative, so that those rows have no score >= 0 (the block max then comes
    from the kernel's float path, the others' from its integer one)."""
    torch = pytest.importorskip("torch")
    if ARCH != "sm_90a":
        pytest.skip(f"the tensor-core scores of torch._scaled_mm are sm_90a's; device is {ARCH}")
    from zyfa_runtime import as_tensor, flash_attn_func, fp8_models
    g = torch.Generator(device="cuda").manual_seed(int(np.random.default_rng().integers(1 << 30)))
    dv = 128 if d == 192 else d
    xs = [torch.randn(1, s, 1, dd, device="cuda", generator=g) for s, dd in ((sq, d), (sk, d), (sk, dv))]
    if negative:
        sign = 1 - 2 * ((torch.arange(sq, device="cuda") // 32) % 2 == 0).float()
        xs[0] = xs[0].abs() * sign[None, :, None, None]
        xs[1] = xs[1].abs()
    scales = [t.abs().max() / 448 for t in xs]
    q8, k8, v8 = ((t / s).to(torch.float8_e4m3fn) for t, s in zip(xs, scales))
    out = torch.full((1, sq, 1, dv), float("nan"), device="cuda", dtype=torch.bfloat16)
    _, lse = flash_attn_func(*(as_tensor(t.view(torch.uint8), dtype="fp8_e4m3") for t in (q8, k8, v8)),
                             descale_q=scales[0].reshape(1), descale_k=scales[1].reshape(1),
                             descale_v=scales[2].reshape(1), out=out, causal=causal, return_lse=True)
    one = torch.tensor(1.0, device="cuda")
    s_tc = torch._scaled_mm(q8[0, :, 0].contiguous(), k8[0, :, 0].contiguous().T, scale_a=one,
                            scale_b=one, out_dtype=torch.float32, use_fast_accum=True)
    torch.cuda.synchronize()
    codes = [t.view(torch.uint8).cpu().numpy()[0, :, 0] for t in (q8, k8, v8)]
    model = fp8_models.head_forward(*codes, "sm_90a", descale_q=float(scales[0]),
                                    descale_k=float(scales[1]), descale_v=float(scales[2]),
                                    softmax_scale=float(np.float32(1 / np.sqrt(d))), causal=causal,
                                    scores=s_tc.cpu().numpy())
    got, got_lse = out.double().cpu().numpy()[0, :, 0], lse.numpy()[0, 0]
    assert not np.isnan(got).any()
    if negative:
        neg = (np.arange(sq) // 32) % 2 == 0
        assert (model.row_max[neg] < 0).all() and (model.row_max[~neg] > 0).all()
    assert reference.relative_error(got, model.out) < 4e-3
    seen = np.isfinite(model.lse)
    assert np.array_equal(np.isfinite(got_lse), seen)
    dl = np.abs(got_lse[seen] - model.lse[seen])
    if causal and fp8_models.RECIPES["sm_90a"].diagonal_at(dv):
        # A diagonal block's second term is multiplied onto the first in the tensor core, whose
        # FP8 accumulation keeps fewer bits than fp32 (about 14, as reported for Hopper's FP8
        # GEMMs): twice the additions onto a block sum, measured up to 1.5e-3 in a row's LSE
        # (median 5-10e-5).  The one-byte model is 1e-3 away at the median, so the median still
        # tells the two apart.
        assert dl.max() < 3e-3 and np.median(dl) < 2.5e-4
    else:
        assert dl.max() < 5e-4


@pytest.mark.parametrize("d", [64, 128, 192])
def test_sm90a_fp8_diagonal_blocks_carry_p_in_two_terms(d):
    """Causal, the rows near the start of a sequence see only keys of the blocks their diagonal
    cuts, where the "sm_90a" recipe takes P in two e4m3 terms: the kernel's error against fp64
    there is a fraction of one byte's (the "sm_90a/one" model), not merely within the bound."""
    torch = pytest.importorskip("torch")
    if ARCH != "sm_90a":
        pytest.skip(f"the two-term diagonal is sm_90a's recipe; device is {ARCH}")
    from zyfa_runtime import as_tensor, flash_attn_func, fp8_models
    g = torch.Generator(device="cuda").manual_seed(int(np.random.default_rng().integers(1 << 30)))
    s, heads = 256, 4
    dv = 128 if d == 192 else d
    xs = [torch.randn(1, s, heads, dd, device="cuda", generator=g) for dd in (d, d, dv)]
    xs[2] += 1.0                            # V with a mean: the case rounded sums are for
    scales = [t.abs().max() / 448 for t in xs]
    q8, k8, v8 = ((t / c).to(torch.float8_e4m3fn) for t, c in zip(xs, scales))
    out = torch.full((1, s, heads, dv), float("nan"), device="cuda", dtype=torch.bfloat16)
    with forced_variant(Variant(ARCH, "fp8_e4m3", d, dv, True)):   # the recipe's kernel (not f16-math)
        flash_attn_func(*(as_tensor(t.view(torch.uint8), dtype="fp8_e4m3") for t in (q8, k8, v8)),
                        descale_q=scales[0].reshape(1), descale_k=scales[1].reshape(1),
                        descale_v=scales[2].reshape(1), out=out, causal=True)
    torch.cuda.synchronize()
    codes = [t.view(torch.uint8).cpu().numpy()[0] for t in (q8, k8, v8)]
    deq = [(t.double() * c.double()).cpu().numpy()[0] for t, c in zip((q8, k8, v8), scales)]
    ref = reference.attention(*(x[None] for x in deq), causal=True)[0]
    kw = dict(descale_q=float(scales[0]), descale_k=float(scales[1]), descale_v=float(scales[2]),
              causal=True, softmax_scale=float(np.float32(1 / np.sqrt(d))))
    one, _ = fp8_models.sequence_forward(*codes, "sm_90a/one", **kw)
    two, _ = fp8_models.sequence_forward(*codes, "sm_90a", **kw)
    got = out.double().cpu().numpy()[0]
    assert not np.isnan(got).any()
    rows = slice(0, 128)                    # every key these rows see is in a diagonal block
    err = {n: reference.relative_error(x[rows], ref[rows]) for n, x in (("got", got), ("one", one),
                                                                        ("two", two))}
    assert err["two"] < 0.25 * err["one"], err
    # The kernel adds its bf16 output rounding (about 1.7e-3 here, against one byte's 4.5e-3 and
    # two terms' 1e-4): under half one byte's error, and nearer the two-term model than the other.
    assert err["got"] < 0.5 * err["one"], err
    assert reference.relative_error(got[rows], two[rows]) < 0.5 * reference.relative_error(got[rows], one[rows])


def test_cupy_arrays_via_cuda_array_interface():
    cp = pytest.importorskip("cupy")
    import ml_dtypes
    from zyfa_runtime import as_tensor, flash_attn_varlen_func
    rng = np.random.default_rng()
    seqs = [33, 0, 190]
    cu = np.concatenate([[0], np.cumsum(seqs)]).astype(np.int32)
    host = [rng.standard_normal((cu[-1], h, 64)).astype(ml_dtypes.bfloat16) for h in (6, 3, 3)]
    q, k, v = (as_tensor(cp.asarray(x.view(np.uint16)), dtype="bf16") for x in host)
    out = cp.empty((cu[-1], 6, 64), dtype=cp.uint16)
    cu_d = cp.asarray(cu)
    flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_d, cu_seqlens_k=cu_d, max_seqlen_q=190,
                           max_seqlen_k=190, out=as_tensor(out, dtype="bf16"))
    got = out.get().view(ml_dtypes.bfloat16).astype(np.float64)
    ref_o = reference.attention(*(x.astype(np.float64) for x in host), cu_seqlens_q=cu, cu_seqlens_k=cu)
    assert reference.relative_error(got, ref_o) < 8e-3


@pytest.mark.parametrize("dtype, d, causal", [("bf16", 128, False), ("fp8_e4m3", 128, True)])
def test_host_cu_seqlens_are_staged_and_give_the_bits_of_device_ones(dtype, d, causal):
    """cu_seqlens in host memory (staging.py: copied on the stream, never read back) give the
    device cu_seqlens' output bit for bit, and within the fp64 bound.  A burst of calls, each
    with other sequence lengths written into the same host array right after the call before,
    queued with no synchronisation between them: each reads the values it was given."""
    from zyfa_runtime import flash_attn_varlen_func
    from zyfa_runtime.memory import to_device
    from zyfa_runtime.selfcheck import RECIPE_FP64_BOUND, _descales, _quantise
    rng = np.random.default_rng()
    total, hq, hkv = 600, 4, 2
    made = [_quantise(rng.standard_normal((total, h, d)).astype(np.float32), dtype) for h in (hq, hkv, hkv)]
    q, k, v = (to_device(DRIVER, 0, x, dtype) for x, _, _ in made)
    extra = _descales(DRIVER, 0, [s for _, _, s in made])
    splits = [[600], [17, 0, 583], [300, 300], [1, 2, 597], [128, 129, 343], [599, 1], [64] * 9 + [24]]
    host_cu = np.zeros(len(max(splits, key=len)) + 1, np.int32)
    outs = []
    for seqs in splits:
        cu = host_cu[:len(seqs) + 1]
        cu[:] = np.concatenate([[0], np.cumsum(seqs)])
        outs.append(flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=max(seqs),
                                           max_seqlen_k=max(seqs), causal=causal, **extra))
        host_cu[:] = -7                                        # rewritten: the call has read it
    for seqs, out in zip(splits, outs):
        cu = np.concatenate([[0], np.cumsum(seqs)]).astype(np.int32)
        dcu = to_device(DRIVER, 0, cu, "int32")
        want = flash_attn_varlen_func(q, k, v, cu_seqlens_q=dcu, cu_seqlens_k=dcu, max_seqlen_q=max(seqs),
                                      max_seqlen_k=max(seqs), causal=causal, **extra).numpy()
        got = out.numpy()
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16)), seqs
        ref = reference.attention(*(x64 for _, x64, _ in made), causal=causal, cu_seqlens_q=cu, cu_seqlens_k=cu)
        bound = 8e-3 if dtype == "bf16" else RECIPE_FP64_BOUND
        assert reference.relative_error(got.astype(np.float64), ref) < bound, seqs
    listed = flash_attn_varlen_func(q, k, v, cu_seqlens_q=[0, 300, 600], cu_seqlens_k=[0, 300, 600],
                                    max_seqlen_q=300, max_seqlen_k=300, causal=causal, **extra)
    assert np.array_equal(listed.numpy().view(np.uint16), outs[2].numpy().view(np.uint16))


@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3"])
def test_a_dense_call_captured_into_a_graph_replays_on_new_values(dtype):
    """Warmed up, then captured on a side stream: each replay reads the inputs' current values
    (the same addresses), bit for bit the output of a direct call on them."""
    torch = pytest.importorskip("torch")
    from zyfa_runtime import as_tensor, flash_attn_func
    shape = (2, 300, 4, 128)
    def fill(x):
        y = torch.randn(shape, device="cuda")
        x.copy_(y.to(torch.float8_e4m3fn).view(torch.uint8) if dtype == "fp8_e4m3" else y.to(torch.bfloat16))
    store = torch.uint8 if dtype == "fp8_e4m3" else torch.bfloat16
    q, k, v = (torch.empty(shape, device="cuda", dtype=store) for _ in range(3))
    refs = [as_tensor(x, dtype=dtype) if dtype == "fp8_e4m3" else as_tensor(x) for x in (q, k, v)]
    out, direct = (torch.empty(shape, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    o, d = as_tensor(out), as_tensor(direct)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    for x in (q, k, v):
        fill(x)
    torch.cuda.synchronize()
    flash_attn_func(*refs, causal=True, out=o, stream=side.cuda_stream)    # warm-up: modules, workspace
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        flash_attn_func(*refs, causal=True, out=o, stream=side.cuda_stream)
    for _ in range(3):
        for x in (q, k, v):
            fill(x)
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        graph.replay()
        flash_attn_func(*refs, causal=True, out=d)
        torch.cuda.synchronize()
        assert not torch.isnan(out).any() and torch.equal(out.view(torch.int16), direct.view(torch.int16))


def test_a_packed_call_inside_a_graph_capture_is_refused_and_the_capture_survives():
    torch = pytest.importorskip("torch")
    from zyfa_runtime import as_tensor, flash_attn_varlen_func
    cu = np.array([0, 40, 100], np.int32)
    q = torch.randn(100, 2, 64, device="cuda", dtype=torch.bfloat16)
    qr = as_tensor(q)
    side = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        with pytest.raises(ValueError, match="takes device cu_seqlens with check_cu_seqlens=False"):
            flash_attn_varlen_func(qr, qr, qr, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=60,
                                   max_seqlen_k=60, stream=side.cuda_stream)
        y = q * 2
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(y, q * 2)


def test_output_allocated_when_not_given():
    from zyfa_runtime import flash_attn_func
    from zyfa_runtime.memory import host_dtype, to_device
    rng = np.random.default_rng()
    host = [rng.standard_normal((1, 70, 2, 64)).astype(host_dtype("bf16")) for _ in range(3)]
    q, k, v = (to_device(DRIVER, 0, x, "bf16") for x in host)
    out = flash_attn_func(q, k, v)
    assert out.shape == (1, 70, 2, 64) and out.dtype == "bf16"
    ref_o = reference.attention(*(x.astype(np.float64) for x in host))
    assert reference.relative_error(out.numpy().astype(np.float64), ref_o) < 8e-3


def test_kernel_of_another_arch_is_a_clear_error():
    from zyfa_runtime.api import kernel_table
    from zyfa_runtime.errors import ZyfaError
    other = "gfx950" if ARCH == "sm_90a" else "sm_90a"
    with pytest.raises(ZyfaError, match=f"is for {other}; device 0 is {ARCH}"):
        kernel_table(DRIVER).get(0, Variant(other, "fp8_e4m3", 128, 128, False))


def test_several_gpus_driven_from_one_process():
    """A thread per device, each with its own inputs on its device: every result right, and
    the module loaded once per device."""
    import threading

    from zyfa_runtime.api import kernel_table
    from zyfa_runtime.selfcheck import O_BOUND, dense_case
    n = DRIVER.device_count()
    if n < 2:
        pytest.skip(f"needs two GPUs; this machine has {n}")
    v = Variant(ARCH, "bf16", 128, 128, True)
    results, failures = {}, []

    def work(dev):
        try:
            rng = np.random.default_rng()
            results[dev] = [dense_case(DRIVER, dev, v, rng, b=2, sq=77, sk=131, hq=6, hkv=2)[0]
                            for _ in range(3)]
        except Exception as e:  # reported below
            failures.append((dev, e))
    threads = [threading.Thread(target=work, args=(d,)) for d in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures, failures
    for dev in range(n):
        assert all(o <= O_BOUND and lse <= bounds(v)[1] for o, lse in results[dev]), (dev, results[dev])
    loaded = {d for d, var in kernel_table(DRIVER)._loaded if var == v}
    assert loaded == set(range(n))


@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3", "fp8_e4m3/f16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_persistent_ctas_take_every_tile_once_over_launches_and_streams(dtype, causal):
    """The persistent kernels (sm_90a d128: BF16's, FP8's short-prompt and f16-math ones; one
    CTA an SM, tiles from a counter):
    a packed batch of some 640 tiles (10 sequences x 8 heads x the longest's row blocks), of odd
    and even block counts, tails, sequences with no rows, and one with rows but no keys (O 0,
    LSE -inf).  O poisoned before each of three launches, two on one stream (its counter left
    zero by the first) and one on another; each equal, bit for bit, to the first, and every
    sequence and head within its bound: BF16 and f16-math FP8 of the fp64 reference (the LSE
    within the variant's bound: its l the sum of the rounded P), FP8 of its recipe's model."""
    torch = pytest.importorskip("torch")
    from zyfa_runtime import flash_attn_varlen_func, fp8_models
    from zyfa_runtime.api import kernel_table
    from zyfa_runtime.memory import to_device
    from zyfa_runtime.selfcheck import RECIPE_OF, _descales, _poisoned_out, _quantise
    f16 = dtype.endswith("/f16")
    dtype = dtype.removesuffix("/f16")
    v = Variant(ARCH, dtype, 128, 128, causal)
    v = (f16_variant(v) if f16 else short_variant(v)) or v
    if "persistent" not in (kernel_table(DRIVER).entry(v) or {}):
        pytest.skip(f"{v.name} is not persistent")
    sq = [0, 1, 127, 128, 129, 300, 0, 1000, 64, 50]
    sk = [0, 1, 127, 200, 129, 300, 5, 1000, 64, 0]
    hq, hkv = 8, 2
    rng = np.random.default_rng()
    host = [_quantise(rng.standard_normal((sum(n), h, 128)).astype(np.float32), dtype)
            for n, h in ((sq, hq), (sk, hkv), (sk, hkv))]
    q, k, vv = (to_device(DRIVER, 0, h[0], dtype) for h in host)
    scales = tuple(h[2] for h in host)
    cu = [np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (sq, sk)]
    cu_q, cu_k = (to_device(DRIVER, 0, x, "int32") for x in cu)
    runs = []
    other = torch.cuda.Stream()
    for stream in (None, None, other.cuda_stream):
        out = _poisoned_out(DRIVER, 0, (sum(sq), hq, 128))
        with forced_variant(v):
            _, lse = flash_attn_varlen_func(q, k, vv, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(sq),
                                            max_seqlen_k=max(sk), causal=causal, out=out, return_lse=True,
                                            stream=stream, **_descales(DRIVER, 0, scales))
        torch.cuda.synchronize()
        runs.append((out.numpy().view(np.uint16), lse.numpy()))
    for o, l in runs[1:]:
        assert np.array_equal(o, runs[0][0]) and np.array_equal(l.view(np.uint32), runs[0][1].view(np.uint32))
    o, got_lse = bf16_to_f64(runs[0][0]), runs[0][1]
    assert not np.isnan(o).any() and not np.isnan(got_lse).any()
    o_bound, lse_bound = (8e-3, bounds(v)[1]) if dtype == "bf16" or f16 else bounds(v)
    scale = float(np.float32(1.0 / np.sqrt(128)))
    for i in range(len(sq)):
        (a, b), (ka, kb) = (cu[0][i], cu[0][i + 1]), (cu[1][i], cu[1][i + 1])
        if b == a:
            continue
        if kb == ka:
            assert (o[a:b] == 0).all() and np.isneginf(got_lse[:, a:b]).all(), i
            continue
        if dtype == "bf16" or f16:   # (f16-math: the fp64 reference of the dequantised inputs)
            ref, ref_lse = reference.attention(host[0][1][a:b], host[1][1][ka:kb], host[2][1][ka:kb],
                                               causal=causal, return_lse=True,
                                               cu_seqlens_q=np.array([0, b - a]), cu_seqlens_k=np.array([0, kb - ka]))
        else:
            ref, ref_lse = fp8_models.sequence_forward(
                host[0][0][a:b], host[1][0][ka:kb], host[2][0][ka:kb], RECIPE_OF[(ARCH, dtype)],
                descale_q=scales[0], descale_k=scales[1], descale_v=scales[2], causal=causal, softmax_scale=scale)
        for h in range(hq):
            err = reference.relative_error(o[a:b, h], ref[:, h])
            assert err < o_bound, (i, h, err)
        live = np.isfinite(ref_lse)
        assert np.abs(got_lse[:, a:b][live] - ref_lse[live]).max() < lse_bound, i


@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3"])
def test_same_inputs_give_bit_identical_outputs_over_1000_launches(dtype):
    """Determinism: no order-dependent reductions (a persistent kernel's counter picks which
    CTA computes a tile, not how); every launch writes the same bits (causal, GQA, ragged
    lengths, LSE too)."""
    from zyfa_runtime import flash_attn_func
    from zyfa_runtime.memory import DeviceArray
    from zyfa_runtime.selfcheck import _descales, _quantise
    from zyfa_runtime.memory import to_device
    rng = np.random.default_rng()
    v = Variant(ARCH, dtype, 128, 128, True)
    host = [_quantise(rng.standard_normal(shape).astype(np.float32), dtype)
            for shape in ((1, 333, 8, 128), (1, 517, 2, 128), (1, 517, 2, 128))]
    q, k, vv = (to_device(DRIVER, 0, h[0], dtype) for h in host)
    scales = _descales(DRIVER, 0, tuple(h[2] for h in host))
    out = DeviceArray(DRIVER, 0, (1, 333, 8, 128), "bf16")
    _, lse = flash_attn_func(q, k, vv, causal=v.causal, out=out, return_lse=True, **scales)
    first_o, first_l = out.numpy().view(np.uint16).copy(), lse.numpy().view(np.uint32).copy()
    assert not np.isnan(out.numpy().astype(np.float32)).any()
    for i in range(1000):
        DRIVER.memset_d8(out.ptr, 0xFF, out.nbytes)     # poison: every launch writes it all
        _, lse = flash_attn_func(q, k, vv, causal=v.causal, out=out, return_lse=True, **scales)
        assert np.array_equal(out.numpy().view(np.uint16), first_o), f"launch {i}: O differs"
        assert np.array_equal(lse.numpy().view(np.uint32), first_l), f"launch {i}: LSE differs"


@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_repeated_and_new_tensors_take_the_cached_paths_and_are_right(dtype, causal, monkeypatch):
    """The runtime's two caches on a real GPU.  A plan (the same tensors, ``out`` given, no
    LSE): buffers refilled with new values, new descales included, are read anew by its
    launches.  A layout (new tensors of a layout already validated): its launches take the new
    addresses.  Each time O, poisoned first, is bit for bit what a call through validation
    writes, and within the bound of the fp64 reference.  A larger call in between grows (moves)
    the V^T workspace: the FP8 plan is then not reused, and the call is still right."""
    from zyfa_runtime import flash_attn_func, validate, workspace
    from zyfa_runtime import plan as plan_mod
    from zyfa_runtime.memory import DeviceArray, to_device
    from zyfa_runtime.selfcheck import RECIPE_FP64_BOUND, O_BOUND, _quantise
    rng = np.random.default_rng()
    shapes = {"q": (2, 300, 4, 128), "k": (2, 389, 2, 128), "v": (2, 389, 2, 128)}
    checked, reused = [], []
    real_check = validate.check_dense
    monkeypatch.setattr(validate, "check_dense", lambda *a, **kw: checked.append(1) or real_check(*a, **kw))
    real_again = plan_mod.Plan.queue_again
    monkeypatch.setattr(plan_mod.Plan, "queue_again", lambda self, d, s: reused.append(real_again(self, d, s)) or reused[-1])

    def buffers():
        dev = {n: DeviceArray(DRIVER, 0, sh, dtype) for n, sh in shapes.items()}
        scales = {n: DeviceArray(DRIVER, 0, (1,), "float32") for n in ("descale_q", "descale_k", "descale_v")} \
            if dtype == "fp8_e4m3" else {}
        return dev, scales, DeviceArray(DRIVER, 0, shapes["q"][:3] + (128,), "bf16")

    def refill(dev, scales):
        exact = {}
        for n, arr in dev.items():
            x = rng.standard_normal(shapes[n]).astype(np.float32) * rng.uniform(0.5, 4)
            xq, exact[n], sc = _quantise(x, dtype)
            DRIVER.copy_htod(arr.ptr, memoryview(np.ascontiguousarray(xq).reshape(-1).view(np.uint8)))
            if scales:
                DRIVER.copy_htod(scales["descale_" + n].ptr, memoryview(np.array([sc], np.float32).view(np.uint8)))
        return reference.attention(exact["q"], exact["k"], exact["v"], causal=causal)

    def call(dev, scales, out):
        DRIVER.memset_d8(out.ptr, 0xFF, out.nbytes)
        flash_attn_func(dev["q"], dev["k"], dev["v"], causal=causal, out=out, **scales)
        return out.numpy().view(np.uint16).copy()

    def validated(dev, scales, out):
        with plan_mod._lock:
            plan_mod._plans.clear()
            plan_mod._layouts.clear()
        return call(dev, scales, out)

    bound = O_BOUND if dtype == "bf16" else RECIPE_FP64_BOUND
    workspace.release()              # so that the larger call below grows it
    plan_mod._plans.clear()
    plan_mod._layouts.clear()
    dev, scales, out = buffers()
    for step in ("first", "from its plan", "from its plan", "after a larger call", "new tensors"):
        if step == "after a larger call":
            big = [to_device(DRIVER, 0, _quantise(rng.standard_normal((1, 4096, 2, 128)).astype(np.float32),
                                                  dtype)[0], dtype) for _ in range(3)]
            flash_attn_func(*big, causal=causal)
        if step == "new tensors":
            dev, scales, out = buffers()
        ref = refill(dev, scales)
        before, checks = len(reused), len(checked)
        got = call(dev, scales, out)
        assert (len(checked) > checks) == (step == "first"), step   # then its layout is known
        expect = {"first": [], "new tensors": [], "from its plan": [True],
                  "after a larger call": [dtype == "bf16"]}[step]    # BF16 has no V^T workspace
        assert reused[before:] == expect, step
        o = bf16_to_f64(got)
        assert not np.isnan(o).any(), step
        assert reference.relative_error(o, ref) <= bound, step
        assert np.array_equal(got, validated(dev, scales, out)), step


@pytest.mark.parametrize("b,hq,hkv,sq,sk", [(1, 3, 1, 1000, 1100), (2, 5, 5, 513, 4096), (1, 8, 2, 2048, 2048),
                                            (1, 9, 3, 2048, 640), (1, 18, 6, 1408, 3072)],
                         ids=["pieces-of-1-2-blocks", "12-block-pieces", "pieces-near-a-tile", "whole-then-tail",
                              "shares-equal-in-time"])
def test_a_balanced_tail_merges_its_pieces_into_whole_tiles(b, hq, hkv, sq, sk, monkeypatch):
    """FP8 d256 non-causal with the tiles past its last whole wave cut by keys
    (ZYFA_SPLIT_TAIL=always): pieces of one block to nearly a tile, ending one tile and starting
    the next, after whole tiles or alone, GQA, a last tile of one row, and (on 132 SMs: 198 tiles
    of 24 blocks) shares planned equal in time, with a gap and, launched as the kernel's
    dependent, a ramp.  O (poisoned first) and the LSE are within the recipe's bound of fp64 and
    within bf16 rounding of the uncut launch; three launches on one stream and one on another
    write the same bits (each leaves its counters zero; the pieces merge in their order
    whichever ends last), and so do two launched plainly (ZYFA_DEPENDENT_LAUNCH=off: no ramp,
    so other pieces where the plan had one)."""
    from zyfa_runtime import api, flash_attn_func
    from zyfa_runtime import plan as plan_mod
    from zyfa_runtime.memory import DeviceArray, to_device
    from zyfa_runtime.selfcheck import RECIPE_FP64_BOUND, _descales, _quantise
    v = Variant(ARCH, "fp8_e4m3", 256, 256, False)
    if "split_tail" not in (api.kernel_table(DRIVER).entry(v) or {}):
        pytest.skip(f"{v.name} has no balanced tail")
    rng = np.random.default_rng()
    host = [_quantise(rng.standard_normal((b, s, h, 256)).astype(np.float32), "fp8_e4m3")
            for s, h in ((sq, hq), (sk, hkv), (sk, hkv))]
    q, k, vv = (to_device(DRIVER, 0, h[0], "fp8_e4m3") for h in host)
    scales = _descales(DRIVER, 0, tuple(h[2] for h in host))
    out = DeviceArray(DRIVER, 0, (b, sq, hq, 256), "bf16")
    try:
        import torch
        other = torch.cuda.Stream().cuda_stream
    except ImportError:
        other = None

    def run(mode, stream=None):
        monkeypatch.setenv("ZYFA_SPLIT_TAIL", mode)
        with plan_mod._lock:
            plan_mod._plans.clear()
            plan_mod._layouts.clear()
        DRIVER.memset_d8(out.ptr, 0xFF, out.nbytes)
        _, lse = flash_attn_func(q, k, vv, out=out, return_lse=True, stream=stream, **scales)
        DRIVER.synchronize(0)
        return out.numpy().view(np.uint16).copy(), lse.numpy().view(np.uint32).copy()

    tiles = -(-sq // v.tile.block_m) * hq * b
    dependent = [run("always") for _ in range(3)] + ([run("always", other)] if other is not None else [])
    monkeypatch.setenv("ZYFA_DEPENDENT_LAUNCH", "off")   # each launch after the one before has ended
    plain = [run("always") for _ in range(2)]
    monkeypatch.delenv("ZYFA_DEPENDENT_LAUNCH")
    whole = run("off")
    ref, ref_lse = reference.attention(*(h[1] for h in host), causal=False, return_lse=True)
    for cut in (dependent, plain):
        for o, l in cut[1:]:
            assert np.array_equal(o, cut[0][0]) and np.array_equal(l, cut[0][1])
        o_cut, o_whole = bf16_to_f64(cut[0][0]), bf16_to_f64(whole[0])
        assert not np.isnan(o_cut).any() and not np.isnan(cut[0][1].view(np.float32)).any()
        assert reference.relative_error(o_cut, ref) <= RECIPE_FP64_BOUND
        assert reference.relative_error(o_cut, o_whole) <= 4e-3
        assert np.abs(cut[0][1].view(np.float32) - ref_lse).max() < bounds(v)[1]
    sms = DRIVER.attribute(0, "multiprocessor_count")
    assert tiles % sms != 0   # there is a tail to cut
    if (tiles, sms) == (198, 132):
        from zyfa_runtime.plan import tail_plan
        plan = tail_plan(api.kernel_table(DRIVER).entry(v), {"tile_count": tiles, "seqlen_k": sk}, sms, False, "always")
        assert plan["tail_gap"] > 0 and plan["tail_ramp"] > 0


FP8_HERE = [v for v in all_variants() if v.arch == ARCH and not v.serving and v.dtype == "fp8_e4m3"]


@pytest.mark.parametrize("v", FP8_HERE, ids=lambda v: v.name)
@pytest.mark.parametrize("split_tail", ["auto", "always"])
def test_back_to_back_calls_each_read_their_own_values(v, split_tail, monkeypatch):
    """Calls queued back to back on one stream share the V^T workspace: each call's pre-pass
    overwrites what the call before it reads.  Two calls with different V, no synchronisation
    between, both within the recipe's bound of their own fp64 reference: a kernel started as
    its pre-pass's dependent reads V^T only once the pre-pass has ended, and a tail kernel ends
    after its kernel, so the next call's pre-pass waits for both.  Few query rows against many
    keys: the kernel's CTAs are ready long before the pre-pass is done; with a balanced tail
    (``always``) whole tiles and a tail beside them."""
    from zyfa_runtime import api, flash_attn_func
    from zyfa_runtime import plan as plan_mod
    from zyfa_runtime.memory import DeviceArray, to_device
    from zyfa_runtime.selfcheck import RECIPE_FP64_BOUND, _descales, _quantise
    entry = api.kernel_table(DRIVER).entry(v) or {}
    if split_tail == "always" and "split_tail" not in entry:
        pytest.skip(f"{v.name} has no balanced tail")
    monkeypatch.setenv("ZYFA_SPLIT_TAIL", split_tail)
    monkeypatch.delenv("ZYFA_DEPENDENT_LAUNCH", raising=False)
    with plan_mod._lock:
        plan_mod._plans.clear()
        plan_mod._layouts.clear()
    rng = np.random.default_rng()
    b, hq, hkv = 1, 9, 3
    sq, sk = (2048, 640) if split_tail == "always" else (192, 32768)
    quant = lambda *shape: _quantise(rng.standard_normal(shape).astype(np.float32), "fp8_e4m3")  # noqa: E731
    hq_, hk, hv1, hv2 = (quant(b, sq, hq, v.d_qk), quant(b, sk, hkv, v.d_qk),
                         quant(b, sk, hkv, v.d_v), quant(b, sk, hkv, v.d_v))
    q, k = to_device(DRIVER, 0, hq_[0], "fp8_e4m3"), to_device(DRIVER, 0, hk[0], "fp8_e4m3")
    outs = []
    for hv in (hv1, hv2):
        vv = to_device(DRIVER, 0, hv[0], "fp8_e4m3")
        out = DeviceArray(DRIVER, 0, (b, sq, hq, v.d_v), "bf16")
        DRIVER.memset_d8(out.ptr, 0xFF, out.nbytes)
        flash_attn_func(q, k, vv, out=out, causal=v.causal, **_descales(DRIVER, 0, (hq_[2], hk[2], hv[2])))
        outs.append((out, vv))
    DRIVER.synchronize(0)
    for (out, _), hv in zip(outs, (hv1, hv2)):
        o = bf16_to_f64(out.numpy().view(np.uint16))
        assert not np.isnan(o).any()
        ref = reference.attention(hq_[1], hk[1], hv[1], causal=v.causal)
        assert reference.relative_error(o, ref) <= RECIPE_FP64_BOUND, v.name


# --------------------------------------------------------------------------------------
# Serving stacks: graph capture, unchecked cu_seqlens, descales per sequence and head.

def _fill(arr, host):
    DRIVER.copy_htod(arr.ptr, memoryview(np.ascontiguousarray(host).reshape(-1).view(np.uint8)))


def _forget_layouts():
    from zyfa_runtime import plan as plan_mod
    with plan_mod._lock:
        plan_mod._plans.clear()
        plan_mod._layouts.clear()


CAPTURED = [("bf16", 128, False, "auto"), ("fp8_e4m3", 128, True, "auto"), ("fp8_e4m3", 256, False, "always")]


@pytest.mark.parametrize("dtype,d,causal,split_tail", CAPTURED,
                         ids=["bf16-persistent", "fp8-vt", "fp8-balanced-tail"])
def test_captured_after_a_warm_up_on_another_stream_graphs_replay_right_side_by_side(dtype, d, causal, split_tail,
                                                                                    monkeypatch):
    """torch's pattern: the call run on a side stream, then captured on torch's own capture
    stream (another), twice, on two sets of tensors.  The two graphs replayed at once on two
    more streams (their scratch -- counters, V^T, a balanced tail's partials -- each the
    graph's own), inputs refilled between rounds: each output bit for bit what a direct call
    on the same values writes."""
    torch = pytest.importorskip("torch")
    from zyfa_runtime import flash_attn_func
    from zyfa_runtime.memory import DeviceArray
    from zyfa_runtime.selfcheck import _quantise
    monkeypatch.setenv("ZYFA_SPLIT_TAIL", split_tail)
    _forget_layouts()
    rng = np.random.default_rng()
    b, hq, hkv, sq, sk = 1, 16, 4, 1500, 2000
    shapes = ((b, sq, hq, d), (b, sk, hkv, d), (b, sk, hkv, d))
    sets = []
    for _ in range(2):
        qkv = [DeviceArray(DRIVER, 0, sh, dtype) for sh in shapes]
        per_head = per_head_descales(Variant(ARCH, dtype, d, d, causal))
        scales = ({n: DeviceArray(DRIVER, 0, (b, hkv) if per_head else (1,), "float32")
                   for n in ("descale_q", "descale_k", "descale_v")} if dtype == "fp8_e4m3" else {})
        sets.append((qkv, scales, DeviceArray(DRIVER, 0, (b, sq, hq, d), "bf16"),
                     DeviceArray(DRIVER, 0, (b, sq, hq, d), "bf16")))

    def refill(qkv, scales):
        for arr, sh in zip(qkv, shapes):
            _fill(arr, _quantise(rng.standard_normal(sh).astype(np.float32), dtype)[0])
        for arr in scales.values():
            _fill(arr, rng.uniform(0.5, 2.0, arr.shape).astype(np.float32))

    side = torch.cuda.Stream()
    for qkv, scales, out, _ in sets:
        refill(qkv, scales)
        flash_attn_func(*qkv, causal=causal, out=out, stream=side.cuda_stream, **scales)     # warm-up
    torch.cuda.synchronize()
    graphs = []
    for qkv, scales, out, _ in sets:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):        # torch's capture stream, not the side stream
            flash_attn_func(*qkv, causal=causal, out=out, stream=torch.cuda.current_stream().cuda_stream, **scales)
        graphs.append(g)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for _ in range(3):
        for qkv, scales, out, direct in sets:
            refill(qkv, scales)
            DRIVER.memset_d8(out.ptr, 0xFF, out.nbytes)
        torch.cuda.synchronize()
        for g, st in zip(graphs, streams):
            with torch.cuda.stream(st):
                g.replay()
        torch.cuda.synchronize()
        for qkv, scales, out, direct in sets:
            flash_attn_func(*qkv, causal=causal, out=direct, **scales)
        torch.cuda.synchronize()
        for _, _, out, direct in sets:
            got = out.numpy().view(np.uint16)
            assert not np.isnan(bf16_to_f64(got)).any()
            assert np.array_equal(got, direct.numpy().view(np.uint16))


FIRST_CALL_CAPTURED = """
import numpy as np, torch
from zyfa_runtime import as_tensor, flash_attn_func
torch.manual_seed(0)
side = torch.cuda.Stream()
q = torch.randn(1, 700, 8, 128, device="cuda")
bf = [q.bfloat16(), q[:, :, :2].bfloat16().contiguous(), q[:, :, 2:4].bfloat16().contiguous()]
f8 = [as_tensor(x.to(torch.float8_e4m3fn).view(torch.uint8), dtype="fp8_e4m3") for x in bf]
outs = [torch.empty(1, 700, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g, stream=side):      # no call before: modules load inside the capture
    s = torch.cuda.current_stream().cuda_stream
    flash_attn_func(*bf, out=outs[0], stream=s)                 # persistent: a counter
    flash_attn_func(*f8, causal=True, out=outs[1], stream=s)    # V^T, and no descale given: 1.0
g.replay()
torch.cuda.synchronize()
flash_attn_func(*bf, out=outs[2])
flash_attn_func(*f8, causal=True, out=outs[3])
torch.cuda.synchronize()
assert not outs[0].isnan().any() and not outs[1].isnan().any()
assert torch.equal(outs[0].view(torch.int16), outs[2].view(torch.int16))
assert torch.equal(outs[1].view(torch.int16), outs[3].view(torch.int16))
print("first call captured: ok")
"""


def test_the_first_call_of_a_process_may_be_captured():
    """A process's first call, inside a capture in the global mode (torch.cuda.graph's default):
    its modules load (in the relaxed mode), its scratch is the graph's, and the replay writes
    what a direct call does."""
    pytest.importorskip("torch")
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-c", FIRST_CALL_CAPTURED], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "ok" in run.stdout, run.stdout + run.stderr


def test_what_a_captured_call_would_allocate_is_refused_and_the_capture_survives():
    torch = pytest.importorskip("torch")
    from zyfa_runtime import as_tensor, flash_attn_func
    q = torch.randn(1, 100, 2, 64, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    lse = torch.empty(1, 2, 100, device="cuda")
    qr, o, l = as_tensor(q), as_tensor(out), as_tensor(lse)
    side = torch.cuda.Stream()
    flash_attn_func(qr, qr, qr, out=o, stream=side.cuda_stream)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        s = torch.cuda.current_stream().cuda_stream
        with pytest.raises(ValueError, match="needs out="):
            flash_attn_func(qr, qr, qr, stream=s)
        with pytest.raises(ValueError, match="needs lse="):
            flash_attn_func(qr, qr, qr, out=o, return_lse=True, stream=s)
        flash_attn_func(qr, qr, qr, out=o, lse=l, return_lse=True, stream=s)
    out.fill_(float("nan"))
    lse.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    ref, ref_lse = reference.attention(*(q.double().cpu().numpy(),) * 3, return_lse=True)
    o_bound, lse_bound = bounds(Variant(ARCH, "bf16", 64, 64, False))
    assert reference.relative_error(out.double().cpu().numpy(), ref) < o_bound
    assert np.abs(lse.cpu().numpy() - ref_lse).max() < lse_bound


@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3"])
def test_a_packed_call_captured_with_unchecked_cu_seqlens_follows_each_replays_values(dtype):
    """Device cu_seqlens, check_cu_seqlens=False, captured once: each replay reads what the
    cu_seqlens buffers hold then (a new split of the same rows), bit for bit what a checked
    direct call on them writes."""
    torch = pytest.importorskip("torch")
    from zyfa_runtime import flash_attn_varlen_func
    from zyfa_runtime.memory import DeviceArray, to_device
    from zyfa_runtime.selfcheck import _quantise
    rng = np.random.default_rng()
    tq, tk, hq, hkv, d = 1200, 1500, 8, 2, 128
    q, k, v = (to_device(DRIVER, 0, _quantise(rng.standard_normal(s).astype(np.float32), dtype)[0], dtype)
               for s in ((tq, hq, d), (tk, hkv, d), (tk, hkv, d)))
    cu_q, cu_k = DeviceArray(DRIVER, 0, (5,), "int32"), DeviceArray(DRIVER, 0, (5,), "int32")
    out, direct = DeviceArray(DRIVER, 0, (tq, hq, d), "bf16"), DeviceArray(DRIVER, 0, (tq, hq, d), "bf16")
    splits = [([300, 300, 300, 300], [375, 375, 375, 375]), ([1000, 0, 150, 50], [100, 900, 0, 500]),
              ([1, 1, 1, 1197], [1497, 1, 1, 1])]
    max_q, max_k = 1200, 1500
    side = torch.cuda.Stream()
    _fill(cu_q, np.array([0, 300, 600, 900, 1200], np.int32))
    _fill(cu_k, np.array([0, 375, 750, 1125, 1500], np.int32))
    flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k,
                           causal=True, out=out, stream=side.cuda_stream, check_cu_seqlens=False)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                               max_seqlen_k=max_k, causal=True, out=out,
                               stream=torch.cuda.current_stream().cuda_stream, check_cu_seqlens=False)
    for lq, lk in splits:
        cq, ck = (np.concatenate([[0], np.cumsum(n)]).astype(np.int32) for n in (lq, lk))
        _fill(cu_q, cq)
        _fill(cu_k, ck)
        DRIVER.memset_d8(out.ptr, 0xFF, out.nbytes)
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        flash_attn_varlen_func(q, k, v, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=max_q, max_seqlen_k=max_k,
                               causal=True, out=direct)
        DRIVER.synchronize(0)
        got = out.numpy().view(np.uint16)
        assert not np.isnan(bf16_to_f64(got)).any() and np.array_equal(got, direct.numpy().view(np.uint16))


INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
#: cu_seqlens that are no batch (tests/emulator/test_emu_capture.py's, scaled to 700 / 900 rows)
ADVERSARIAL = [
    ([0, 500, 100, 700], [0, 900, 200, 50]),
    ([0, 500, 100, 2000], [0, 900, 200, 5000]),
    ([0, 200, 400, 750], [0, 300, 600, 950]),
    ([-300, 200, 400, 700], [0, 300, 600, 900]),
    ([-400, 7, 1 << 30, INT32_MAX], [INT32_MIN, -1, 0, INT32_MAX]),
    ([INT32_MAX, INT32_MIN, INT32_MAX, INT32_MIN], [3, INT32_MAX, 2, INT32_MIN]),
]
CLAMPING = [v for v in all_variants() if v.arch == ARCH and not v.serving and clamps_cu_seqlens(v)]


@pytest.mark.parametrize("v", CLAMPING, ids=lambda v: v.name)
def test_adversarial_cu_seqlens_never_reach_outside_the_tensors(v):
    """check_cu_seqlens=False with values that are no batch: each tensor its own allocation
    (run under compute-sanitizer, an access outside one is an error: ``compute-sanitizer
    --tool memcheck python -m pytest tests/test_gpu.py -k adversarial``), out and the LSE views
    between poisoned guard rows, which stay as they were; the call ends and the device is
    usable after it (a call on valid values right after is right)."""
    from zyfa_runtime import flash_attn_varlen_func
    from zyfa_runtime.memory import DeviceArray, to_device, view
    from zyfa_runtime.selfcheck import _descales, _quantise
    rng = np.random.default_rng()
    tq, tk, hq, hkv = 700, 900, 4, 2
    host = [_quantise(rng.standard_normal(s).astype(np.float32), v.dtype)
            for s in ((tq, hq, v.d_qk), (tk, hkv, v.d_qk), (tk, hkv, v.d_v))]
    q, k, vv = (to_device(DRIVER, 0, h[0], v.dtype) for h in host)
    scales = _descales(DRIVER, 0, tuple(h[2] for h in host))
    big_o = np.full((tq + 2, hq, v.d_v), 0xFFFF, np.uint16)
    big_l = np.full((hq, tq + 64), 0xFFFFFFFF, np.uint32)
    o_dev, l_dev = to_device(DRIVER, 0, big_o, "bf16"), to_device(DRIVER, 0, big_l.view(np.float32), "float32")
    out = view(o_dev, big_o[1:1 + tq], big_o)
    lse = view(l_dev, big_l.view(np.float32)[:, 32:32 + tq], big_l.view(np.float32))
    for cu_q, cu_k in ADVERSARIAL:
        cq, ck = (to_device(DRIVER, 0, np.array(c, np.int32), "int32") for c in (cu_q, cu_k))
        flash_attn_varlen_func(q, k, vv, cu_seqlens_q=cq, cu_seqlens_k=ck, max_seqlen_q=600, max_seqlen_k=800,
                               causal=v.causal, out=out, lse=lse, return_lse=True, check_cu_seqlens=False, **scales)
        DRIVER.synchronize(0)
        o, l = o_dev.numpy().view(np.uint16), l_dev.numpy().view(np.uint32)
        assert (o[0] == 0xFFFF).all() and (o[-1] == 0xFFFF).all(), (cu_q, cu_k)
        assert (l[:, :32] == 0xFFFFFFFF).all() and (l[:, 32 + tq:] == 0xFFFFFFFF).all(), (cu_q, cu_k)
    cu = to_device(DRIVER, 0, np.array([0, 700], np.int32), "int32")
    cuk = to_device(DRIVER, 0, np.array([0, 900], np.int32), "int32")
    flash_attn_varlen_func(q, k, vv, cu_seqlens_q=cu, cu_seqlens_k=cuk, max_seqlen_q=700, max_seqlen_k=900,
                           causal=v.causal, out=out, **scales)
    got = bf16_to_f64(o_dev.numpy().view(np.uint16)[1:1 + tq])
    ref = reference.attention(host[0][1][None], host[1][1][None], host[2][1][None], causal=v.causal)[0]
    bound = 0.05 if v.dtype == "fp8_e4m3" else bounds(v)[0]
    assert not np.isnan(got).any() and reference.relative_error(got, ref) <= bound


FP8_PER_HEAD = [v for v in all_variants() if v.arch == ARCH and not v.serving and per_head_descales(v)]


@pytest.mark.parametrize("v", FP8_PER_HEAD, ids=lambda v: v.name)
@pytest.mark.parametrize("packed", [False, True], ids=["dense", "packed"])
def test_fp8_descales_per_sequence_and_kv_head_match_the_model_fp64_and_each_group_alone(v, packed, monkeypatch):
    """Inputs whose magnitude differs by sequence and key/value head, each (sequence, group)
    quantised with its own scales, passed as (B, Hkv) descales -- q's contiguous, k's a
    transposed view, v's every other element of a wider tensor: O within the sm_90a recipe
    model's bound and the recipe's distance to fp64, and each (sequence, group) bit for bit the
    output of a call on that group alone with its descales as one value each (the kernel reads
    its CTA's).  Then the same descales as a (B, Hkv) view of one value (zero strides) give
    the bits of one value passed as such."""
    from zyfa_runtime import flash_attn_func, flash_attn_varlen_func
    from zyfa_runtime.memory import DeviceArray, to_device, view
    from zyfa_runtime.selfcheck import MODEL_BOUNDS, RECIPE_FP64_BOUND, _poisoned_out
    import ml_dtypes
    monkeypatch.setenv("ZYFA_SPLIT_TAIL", "off")     # the same tiles alone and together
    _forget_layouts()
    rng = np.random.default_rng()
    hq, hkv = 6, 2
    group = hq // hkv
    seq_q, seq_k = ([150, 77, 300], [200, 130, 260]) if packed else ([150] * 3, [260] * 3)
    bsz = len(seq_q)
    mag = {t: rng.uniform(0.05, 20.0, (bsz, hkv)) for t in "qkv"}
    cq, ck = (np.concatenate([[0], np.cumsum(n)]) for n in (seq_q, seq_k))
    codes, exact, scales = {}, {}, {}
    for t, d, h, cu in (("q", v.d_qk, hq, cq), ("k", v.d_qk, hkv, ck), ("v", v.d_v, hkv, ck)):
        rows = int(cu[-1])
        x = rng.standard_normal((rows, h, d))
        sc = np.zeros((bsz, hkv), np.float32)
        c = np.zeros((rows, h, d), ml_dtypes.float8_e4m3fn)
        e = np.zeros((rows, h, d))
        for b in range(bsz):
            for g in range(hkv):
                hs = slice(g * group, (g + 1) * group) if t == "q" else slice(g, g + 1)
                part = x[cu[b]:cu[b + 1], hs] * mag[t][b, g]
                sc[b, g] = np.float32(max(np.abs(part).max(), 1e-30) / 448.0)
                c[cu[b]:cu[b + 1], hs] = (part / sc[b, g]).astype(ml_dtypes.float8_e4m3fn)
                e[cu[b]:cu[b + 1], hs] = c[cu[b]:cu[b + 1], hs].astype(np.float64) * np.float64(sc[b, g])
        codes[t], exact[t], scales[t] = c, e, sc
    if not packed:
        codes = {t: c.reshape(bsz, -1, *c.shape[1:]) for t, c in codes.items()}
        exact = {t: e.reshape(bsz, -1, *e.shape[1:]) for t, e in exact.items()}
    q, k, vv = (to_device(DRIVER, 0, codes[t], "fp8_e4m3") for t in "qkv")
    dq = to_device(DRIVER, 0, scales["q"], "float32")
    kt = np.ascontiguousarray(scales["k"].T)
    dk_dev = to_device(DRIVER, 0, kt, "float32")
    dk = view(dk_dev, kt.T, kt)                                    # (B, Hkv), strides (1, B)
    wide = np.repeat(scales["v"], 2, axis=1)
    dv_dev = to_device(DRIVER, 0, wide, "float32")
    dv = view(dv_dev, wide[:, ::2], wide)                          # (B, Hkv), strides (2 Hkv, 2)
    out_shape = codes["q"].shape[:-1] + (v.d_v,)
    out = _poisoned_out(DRIVER, 0, out_shape)
    kw = dict(descale_q=dq, descale_k=dk, descale_v=dv, causal=v.causal, out=out)
    cu_kw = {}
    if packed:
        cu_kw = dict(cu_seqlens_q=to_device(DRIVER, 0, cq.astype(np.int32), "int32"),
                     cu_seqlens_k=to_device(DRIVER, 0, ck.astype(np.int32), "int32"),
                     max_seqlen_q=max(seq_q), max_seqlen_k=max(seq_k))
        flash_attn_varlen_func(q, k, vv, **cu_kw, **kw)
    else:
        flash_attn_func(q, k, vv, **kw)
    o = bf16_to_f64(out.numpy().view(np.uint16))
    assert not np.isnan(o).any()
    scale = float(np.float32(1.0 / np.sqrt(v.d_qk)))
    ref_cu = dict(cu_seqlens_q=cq, cu_seqlens_k=ck) if packed else {}
    model = reference.fp8_attention(codes["q"], codes["k"], codes["v"], recipe="sm_90a", descale_q=scales["q"],
                                    descale_k=scales["k"], descale_v=scales["v"], causal=v.causal,
                                    softmax_scale=scale, **ref_cu)
    fp64 = reference.attention(exact["q"], exact["k"], exact["v"], causal=v.causal, **ref_cu)
    if v.f16:   # f16-math: no recipe, the BF16 bound against fp64
        assert reference.relative_error(o, fp64) <= bounds(v)[0]
    else:
        assert reference.relative_error(o, model) <= MODEL_BOUNDS["sm_90a"][0]
        assert reference.relative_error(o, fp64) <= RECIPE_FP64_BOUND
    bits = out.numpy().view(np.uint16)
    for b in range(bsz):
        for g in range(hkv):
            hs = slice(g * group, (g + 1) * group)
            if packed:
                part = lambda a, cu, sl: np.ascontiguousarray(a[cu[b]:cu[b + 1], sl])[None]  # noqa: E731
                mine = bits[cq[b]:cq[b + 1], hs]
            else:
                part = lambda a, cu, sl: np.ascontiguousarray(a[b:b + 1, :, sl])  # noqa: E731
                mine = bits[b, :, hs]
            if mine.size == 0:
                continue
            alone = flash_attn_func(*(to_device(DRIVER, 0, part(codes[t], cu, sl), "fp8_e4m3")
                                      for t, cu, sl in (("q", cq, hs), ("k", ck, slice(g, g + 1)),
                                                        ("v", ck, slice(g, g + 1)))),
                                    causal=v.causal,
                                    **{f"descale_{t}": to_device(DRIVER, 0, np.array([scales[t][b, g]], np.float32),
                                                                 "float32") for t in "qkv"})
            assert np.array_equal(alone.numpy().view(np.uint16)[0], mine.reshape(alone.shape[1:])), (b, g)
    # (B, Hkv) views of one value: the bits of one value each
    value = np.array([0.75], np.float32)
    one = to_device(DRIVER, 0, value, "float32")
    flat = view(one, np.broadcast_to(value.reshape(1, 1), (bsz, hkv)), value)    # strides (0, 0)
    outs = []
    for d in (flat, one):
        o2 = _poisoned_out(DRIVER, 0, out_shape)
        kw = dict(descale_q=d, descale_k=d, descale_v=d, causal=v.causal, out=o2)
        if packed:
            flash_attn_varlen_func(q, k, vv, **cu_kw, **kw)
        else:
            flash_attn_func(q, k, vv, **kw)
        outs.append(o2.numpy().view(np.uint16))
    assert np.array_equal(outs[0], outs[1])


def test_torch_tensors_passed_directly_follow_their_values_shapes_and_storage():
    """PyTorch tensors passed themselves, call after call (their export remembered): values
    written in place are read; a tensor resized, or given other storage, is read as it is now."""
    torch = pytest.importorskip("torch")
    from zyfa_runtime import flash_attn_func
    q = torch.randn(1, 200, 4, 64, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(q)
    st = torch.cuda.current_stream()

    def check():
        flash_attn_func(q, q, q, out=out, stream=st)
        torch.cuda.synchronize()
        ref = reference.attention(*(q.double().cpu().numpy(),) * 3)
        assert reference.relative_error(out.double().cpu().numpy(), ref) < 8e-3
    check()
    q.copy_(torch.randn_like(q))
    check()
    q.resize_(1, 150, 4, 64)
    out.resize_(1, 150, 4, 64)
    check()
    q.set_(torch.randn(1, 150, 4, 64, device="cuda", dtype=torch.bfloat16))
    check()
