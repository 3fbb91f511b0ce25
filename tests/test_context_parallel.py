"""examples/context_parallel: ring attention of one causal sequence over N ranks (zig-zag split),
each step one zyfa call with its LSE, merged by merge_attention_states; K/V moved by a transport.

The bookkeeping is pure numpy: every (query, key) score with key <= query is computed exactly
once over all ranks and steps, none with key > query, every step is 2C^2 scores on every rank.

The ring runs on the emulator backend (the gfx950 code objects on the CPU), N ranks simulated on
its one device by the local transport, against the single causal call on the whole sequence and
the fp64 reference.  Outputs and every buffer the ring allocates are NaN-poisoned first.

The emulator runs every launch whole, so the streams' order is checked apart: on a device that
queues each stream's work (zyfa's calls replaced by fp64 numpy on the same views) and runs it in
orders of random priority that the events allow -- a missing wait shows there -- and in an order
that proves each transfer can overlap the compute of its step.

BF16 bounds, element-wise, in units of u M with u = 2^-8 (bf16's unit roundoff) and M the
attention of |V| (fp64; |any attention output over any key subset| <= its M, and the merges'
weights combine the partial M's into the whole one):
* one call is within E = 2 u M of exact: P rounded to bf16 before the PV product (u of each
  p |v|; the row sum is fp32's), the output rounded to bf16 (u |out| <= u M); E = 3 u M where
  the row sum is that of the rounded P (catalogue.Tile.pv_row_sums: sm_90a d64 and d128), whose
  weights are then within 2u of exact;
* the ring: each step's partial within E_i, each of its N - 1 merges rounds once more
  (u |acc| <= u M): E + (N - 1) u M of exact, so 2 E + (N - 1) u M of the single call
  ((N + 3) u M on gfx950);
* plus 2^-14 M for the fp32 arithmetic (sums of <= 2^10 terms, the merges' exp and division).
The LSE is fp32 on both sides (fp32 row sums of <= L terms, relative L 2^-24; the merges' log
2^-23 (|lse| + 3 d + 8)): 2^-12 absolute covers L <= 1024 with margin.  Where the row sums
are of the rounded P, each LSE is within -ln(1 - u) < 2^-8 + 2^-15 of exact, and a merged one
no further than the worst of its parts: 2 x 2^-8 more against the single call.

FP8 (e4m3): the ring against its numpy model -- each step's call through the gfx950 recipe
(fp8_models, which predicts the kernel's P bytes), rounded to bf16 as the kernel writes it, merged
in fp64 and rounded as the merge kernel writes: within the per-call model bound
(selfcheck.MODEL_O_BOUND) of each partial plus one bf16 rounding a merge; LSE within
MODEL_LSE_BOUND.  Against fp64 within the recipe's own error (selfcheck.RECIPE_FP64_BOUND).
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from tests.backends import using_backend

import zyfa_runtime as zr
from examples.context_parallel import devices, ring, transport, zigzag
from zyfa_runtime import reference
from zyfa_runtime.selfcheck import MODEL_LSE_BOUND, MODEL_O_BOUND, RECIPE_FP64_BOUND

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "context_parallel"
PREBUILT = Path(os.environ.get("ZYFA_PREBUILT_DIR") or ROOT / "prebuilt")
U = 2.0 ** -8                 # bf16 unit roundoff
FP32_SLACK = 2.0 ** -14       # fp32 sums and the merges' fp32 arithmetic, relative to M
LSE_BOUND = 2.0 ** -12
HQ, HKV = 4, 2


def bf16_bounds(n: int, rounded_sums: bool = False) -> tuple[float, float, float]:
    """(O vs the single call, O vs exact) in units of M, and the LSE vs the single call
    (module docstring)."""
    call = (3 if rounded_sums else 2) * U
    lse = LSE_BOUND + (2 * U if rounded_sums else 0.0)
    return 2 * call + (n - 1) * U + FP32_SLACK, call + (n - 1) * U + FP32_SLACK, lse


# ---- the zig-zag bookkeeping (numpy only) ---------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("chunk", [1, 3])
def test_every_score_with_key_at_or_before_its_query_is_computed_exactly_once_and_no_other(n, chunk):
    counts = zigzag.pair_counts(n, chunk)
    causal = np.tril(np.ones_like(counts, bool))
    assert (counts[causal] == 1).all(), np.argwhere(causal & (counts != 1))[:5]
    assert (counts[~causal] == 0).all(), np.argwhere(~causal & (counts != 0))[:5]


@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_each_step_is_one_call_of_two_c_squared_scores_on_every_rank(n):
    c = 5
    for rank in range(n):
        for step in range(n):
            call = zigzag.step_call(rank, step, n, c)
            sq = len(range(2 * c)[call.q_rows])
            sk = len(range(2 * c)[call.kv_rows])
            scores = int(zigzag.visible(sq, sk, call.causal).sum())
            assert scores == (2 * c * c + c if call.causal else 2 * c * c), (rank, step)
            assert call.causal == (step == 0)


def test_rank_r_holds_chunks_r_and_2n_minus_1_minus_r_and_gather_inverts_split():
    n, c = 3, 4
    x = np.arange(2 * 2 * n * c * 3).reshape(2, 2 * n * c, 3)
    parts = zigzag.split(x, n, axis=1)
    assert [zigzag.chunks_of(r, n) for r in range(n)] == [(0, 5), (1, 4), (2, 3)]
    assert np.array_equal(parts[1][:, :c], x[:, c:2 * c]) and np.array_equal(parts[1][:, c:], x[:, 4 * c:5 * c])
    assert np.array_equal(zigzag.gather(parts, axis=1), x)
    with pytest.raises(ValueError, match="equal chunks"):
        zigzag.split(x[:, :-1], n, axis=1)


def test_the_local_transport_moves_every_block_one_rank_on():
    n = 3
    dev = devices.HostDevice()
    t = transport.LocalTransport([dev] * n)
    sends = {r: [np.full(4, r, np.float32), np.full(2, 10 + r, np.float32)] for r in range(n)}
    recvs = {r: [dev.empty((4,), "float32"), dev.empty((2,), "float32")] for r in range(n)}
    t.shift(sends, recvs, {r: None for r in range(n)})
    for r in range(n):
        assert (recvs[r][0] == (r - 1) % n).all() and (recvs[r][1] == 10 + (r - 1) % n).all()


class _Stream:
    def __init__(self, name):
        self.name, self.ops = name, []


class _Marker:
    done = False


class DeferredDevice(devices.HostDevice):
    """A device whose streams queue their work (zyfa's calls too, through the stand-ins below)
    for ``run_streams`` to execute later, in any order the streams and events allow: CUDA's
    semantics (a wait takes the event's latest record at the time it is queued)."""

    def __init__(self):
        super().__init__()
        self.streams, self.log = [], []

    def stream(self):
        s = _Stream(len(self.streams))
        self.streams.append(s)
        return s

    def event(self):
        return {"latest": None}

    def record(self, event, stream):
        marker = event["latest"] = _Marker()
        stream.ops.append(("record", marker))

    def wait(self, stream, event):
        if event["latest"] is not None:
            stream.ops.append(("wait", event["latest"]))

    def copy(self, dst, src, stream):
        stream.ops.append(("run", lambda: np.copyto(dst, src), "copy"))

    def enqueue(self, stream, fn, label):
        stream.ops.append(("run", fn, label))


def run_streams(dev: DeferredDevice, pick) -> None:
    """Execute every queued op: ``pick(runnable streams)`` chooses whose head runs next."""
    while any(s.ops for s in dev.streams):
        ready = [s for s in dev.streams if s.ops and (s.ops[0][0] != "wait" or s.ops[0][1].done)]
        assert ready, "the streams wait for each other: deadlock"
        s = pick(ready)
        op = s.ops.pop(0)
        if op[0] == "record":
            op[1].done = True
        elif op[0] == "run":
            op[1]()
            dev.log.append((s.name, op[2]))


def stand_ins(dev: DeferredDevice):
    """zyfa's two calls as fp64 numpy work queued on their stream (TensorRef.owner: the array)."""
    def attention(q, k, v, *, causal, softmax_scale, out, lse, stream, **_):
        def run():
            o, l = reference.attention(q.owner, k.owner, v.owner, causal=causal, softmax_scale=softmax_scale,
                                       return_lse=True)
            out.owner[...], lse.owner[...] = o, l
        dev.enqueue(stream, run, "attention")

    def merge(o_a, lse_a, o_b, lse_b, *, out, out_lse, stream):
        def run():
            o, l = reference.merge_attention_states(o_a.owner, lse_a.owner, o_b.owner, lse_b.owner)
            out.owner[...], out_lse.owner[...] = o, l
        dev.enqueue(stream, run, "merge")
    return type("zyfa", (), {"flash_attn_func": staticmethod(attention),
                             "merge_attention_states": staticmethod(merge)})


def deferred_ring(monkeypatch, n, chunk, inputs, pick):
    """The ring's calls on ``inputs`` ((q, k, v) each, whole sequences) queued one after the
    other on a DeferredDevice, then executed in ``pick``'s order; each call's (O, LSE)."""
    dev = DeferredDevice()
    monkeypatch.setattr(ring, "zr", stand_ins(dev))
    q0, _, v0 = inputs[0]
    r = ring.Ring(transport.LocalTransport([dev] * n), ring.Shape(chunk, HQ, HKV, q0.shape[-1], v0.shape[-1]))
    results = []
    for q, k, v in inputs:
        qs, ks, vs = (dict(enumerate(zigzag.split(x, n))) for x in (q, k, v))
        out = {i: dev.empty((1, 2 * chunk, HQ, v.shape[-1]), "bf16") for i in range(n)}
        lse = {i: dev.empty((1, HQ, 2 * chunk), "float32") for i in range(n)}
        r(qs, ks, vs, out, lse)
        results.append((out, lse))
    run_streams(dev, pick)
    return [(f64(zigzag.gather([out[i] for i in range(n)], 1)), zigzag.gather([lse[i] for i in range(n)], 2))
            for out, lse in results], dev


@pytest.mark.parametrize("n", [2, 3, 4])
def test_every_execution_order_the_streams_and_events_allow_gives_the_attention(monkeypatch, n):
    """The double buffer's waits, checked where they matter: two calls queued back to back (the
    second reuses the first's buffers), their streams run in orders of random priority (a
    missing wait lets a block be overwritten before it is read, or read before it arrives, in
    some of them)."""
    chunk, d = 3, 8
    rng = np.random.default_rng(n)
    inputs = [[rng.standard_normal((1, 2 * n * chunk, h, d)).astype(np.float32).astype(ml_dtypes.bfloat16)
               for h in (HQ, HKV, HKV)] for _ in range(2)]
    refs = [reference.attention(q, k, v, causal=True, return_lse=True) for q, k, v in inputs]
    # fp64 work, rounded to bf16 where the ring stores it: n roundings of 2^-8 M
    bounds = [(n * U + FP32_SLACK) * reference.attention(q, k, np.abs(f64(v)), causal=True) for q, k, v in inputs]
    for seed in range(24):
        # a random priority of the streams (the hub, each rank's compute and comm): the ready
        # stream of highest priority runs, so that one side races ahead as far as it may
        priority = np.random.default_rng(seed).permutation(64)
        results, _ = deferred_ring(monkeypatch, n, chunk, inputs,
                                   lambda ready: max(ready, key=lambda s: priority[s.name]))
        for call, ((o, lse), (ref_o, ref_lse), bound) in enumerate(zip(results, refs, bounds)):
            assert_within(o, ref_o, bound, f"order {seed}, call {call}")
            assert_within(lse, ref_lse, LSE_BOUND, f"order {seed}, call {call}")


def test_each_shift_can_finish_before_any_call_of_its_step_so_transfers_overlap_compute(monkeypatch):
    """An order that holds every call of step s back until shift s is done (all its copies)
    completes: no shift waits for the compute of its own step, only for the step before."""
    n, chunk, d = 3, 2, 8
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2 * n * chunk, h, d)).astype(np.float32).astype(ml_dtypes.bfloat16)
               for h in (HQ, HKV, HKV))
    calls, copies = {}, [0]

    def held_back(ready):
        allowed = []
        for s in ready:
            label = s.ops[0][-1]
            step = calls.get(s.name, 0)
            if label == "attention" and step < n - 1 and copies[0] < 2 * n * (step + 1):
                continue          # shift `step` (2 blocks a rank) not done: hold the call back
            allowed.append(s)
        assert allowed, "a shift waits for a call of its own step: no overlap"
        s = allowed[0]
        if s.ops[0][-1] == "attention":
            calls[s.name] = calls.get(s.name, 0) + 1
        elif s.ops[0][-1] == "copy":
            copies[0] += 1
        return s
    [(o, lse)], _ = deferred_ring(monkeypatch, n, chunk, [(q, k, v)], held_back)
    assert copies[0] == 2 * n * (n - 1) and sum(calls.values()) == n * n
    ref_o = reference.attention(q, k, v, causal=True)
    assert reference.relative_error(o, ref_o) < 2 * U


def test_the_example_imports_no_pytorch():
    for path in EXAMPLE.glob("*.py"):
        text = path.read_text()
        assert "import torch" not in text and "from torch" not in text, path


def test_the_benchmark_explains_itself_without_a_gpu():
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, str(EXAMPLE / "bench_two_gpus.py"), "--help"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT, env=env)
    assert run.returncode == 0, run.stderr
    assert "--tokens" in run.stdout and "--json" in run.stdout


def test_the_benchmarks_device_conversions_round_as_ml_dtypes_does():
    """bf16 and e4m3 as the benchmark makes them on the GPU, run here with numpy for CuPy."""
    spec = importlib.util.spec_from_file_location("bench_two_gpus", EXAMPLE / "bench_two_gpus.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(4096) * 3, [0.0, -0.0, 1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 500.0, -1e-9]])
    x = x.astype(np.float32)
    assert np.array_equal(bench.bf16_bits(np, x), x.astype(ml_dtypes.bfloat16).view(np.uint16))
    assert np.array_equal(bench.as_float(np, bench.bf16_bits(np, x)), x.astype(ml_dtypes.bfloat16).astype(np.float32))
    codes = bench.e4m3_codes(np, x, 0.5)
    want = np.clip(x / np.float32(0.5), -448, 448).astype(ml_dtypes.float8_e4m3fn)
    assert np.array_equal(codes.view(ml_dtypes.float8_e4m3fn).astype(np.float32), want.astype(np.float32))


# ---- the ring on the emulator ---------------------------------------------------------------

KERNELS = [f"fwd_gfx950_bf16_d{d}x{d}_{m}" for d in (64, 128) for m in ("causal", "full")] + \
          [f"fwd_gfx950_fp8_e4m3_d64x64_{m}" for m in ("causal", "full")]
needs_emulator = pytest.mark.skipif(
    not all((PREBUILT / f"{k}.hsaco").exists() for k in KERNELS + ["merge_attention_states_gfx950"]),
    reason="gfx950 code objects not built (python build.py --arch gfx950)")


@pytest.fixture(scope="module")
def emulator():
    with using_backend("emulator", ZYFA_PREBUILT_DIR=str(PREBUILT)) as driver:
        yield driver


def run_ring(n: int, chunk: int, q, k, v, dtype: str, descales=None):
    """The ring over n simulated ranks on the emulator; (O, LSE) gathered into sequence order."""
    dev = devices.HostDevice()
    r = ring.Ring(transport.LocalTransport([dev] * n), ring.Shape(chunk, HQ, HKV, q.shape[-1], v.shape[-1]), dtype)
    qs, ks, vs = (dict(enumerate(zigzag.split(x, n))) for x in (q, k, v))
    out = {i: dev.empty((1, 2 * chunk, HQ, v.shape[-1]), "bf16") for i in range(n)}
    lse = {i: dev.empty((1, HQ, 2 * chunk), "float32") for i in range(n)}
    r(qs, ks, vs, out, lse, descales={i: descales for i in range(n)} if descales else None)
    r.synchronize()
    return zigzag.gather([out[i] for i in range(n)], 1), zigzag.gather([lse[i] for i in range(n)], 2)


def f64(x):
    return np.asarray(x, np.float64)


def assert_within(out, ref, bound, what):
    """Element-wise |out - ref| <= bound, no NaN (poison left or computed)."""
    out = f64(out)
    assert not np.isnan(out).any(), f"{what}: NaN"
    excess = np.abs(out - ref) - bound
    assert (excess <= 0).all(), f"{what}: off by {float((np.abs(out - ref) / bound).max()):.2f} x the bound"


@needs_emulator
@pytest.mark.parametrize("n,chunk,d", [(2, 32, 64), pytest.param(3, 16, 128, marks=pytest.mark.slow)])
def test_bf16_ring_matches_the_single_call_within_n_plus_3_bf16_ulps_of_the_magnitude(emulator, n, chunk, d):
    rng = np.random.default_rng(1000 * n + d)
    length = 2 * n * chunk
    q, k, v = (rng.standard_normal((1, length, h, d)).astype(np.float32).astype(ml_dtypes.bfloat16)
               for h in (HQ, HKV, HKV))
    o, lse = run_ring(n, chunk, q, k, v, "bf16")
    single = np.full((1, length, HQ, d), np.nan, ml_dtypes.bfloat16)
    single_lse = np.full((1, HQ, length), np.nan, np.float32)
    zr.flash_attn_func(q, k, v, causal=True, out=single, lse=single_lse, return_lse=True)
    ref_o, ref_lse = reference.attention(q, k, v, causal=True, return_lse=True)
    m = reference.attention(q, k, np.abs(f64(v)), causal=True)
    vs_single, vs_exact, lse_bound = bf16_bounds(n)
    assert vs_single == (n + 3) * U + FP32_SLACK
    assert_within(o, f64(single), vs_single * m, "ring vs the single call")
    assert_within(o, ref_o, vs_exact * m, "ring vs fp64")
    assert_within(lse, f64(single_lse), lse_bound, "ring LSE vs the single call")
    assert_within(lse, ref_lse, LSE_BOUND, "ring LSE vs fp64")


def ring_model(n: int, chunk: int, q, k, v, descales, scale: float):
    """The FP8 ring in numpy: each step's call through the gfx950 recipe, its O rounded to bf16,
    merged in fp64 and rounded to bf16 again; also the fp64 partial O's norms (for the bound)."""
    to_bf16 = lambda x: f64(np.asarray(x, np.float32).astype(ml_dtypes.bfloat16))   # noqa: E731
    dq, dk, dv = (float(x[0]) for x in descales)
    qs, ks, vs = (zigzag.split(x, n) for x in (q, k, v))
    outs, lses, partial_norms = [], [], []
    for r in range(n):
        acc = acc_lse = None
        for step in range(n):
            call = zigzag.step_call(r, step, n, chunk)
            j = zigzag.source_rank(r, step, n)
            o, lse = reference.fp8_attention(qs[r][:, call.q_rows], ks[j][:, call.kv_rows], vs[j][:, call.kv_rows],
                                             recipe="gfx950", descale_q=dq, descale_k=dk, descale_v=dv,
                                             causal=call.causal, softmax_scale=scale, return_lse=True)
            o, lse = to_bf16(o), f64(np.asarray(lse, np.float32))
            partial_norms.append(np.linalg.norm(o))
            if acc is None:
                acc, acc_lse = o, lse
                continue
            rows = slice(0, None) if call.all_queries else slice(chunk, None)
            mo, ml = reference.merge_attention_states(acc[:, rows], acc_lse[:, :, rows], o, lse)
            acc[:, rows], acc_lse[:, :, rows] = to_bf16(mo), ml
        outs.append(acc)
        lses.append(acc_lse)
    return zigzag.gather(outs, 1), zigzag.gather(lses, 2), sum(partial_norms)


@needs_emulator
def test_fp8_ring_is_its_numpy_model_within_the_per_call_bounds_and_fp64_within_the_recipes(emulator):
    """Bound on ||ring - model|| / ||model||: MODEL_O_BOUND of each partial's norm (the merges'
    weights are <= 1) plus one bf16 rounding (2^-8 relative) a merge; LSE: MODEL_LSE_BOUND (a
    log-sum-exp moves no more than its largest input) plus the fp32 terms."""
    n, chunk, d = 2, 32, 64
    rng = np.random.default_rng(7)
    length = 2 * n * chunk
    q, k, v = ((rng.standard_normal((1, length, h, d)) * 2).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
               for h in (HQ, HKV, HKV))
    descales = tuple(np.array([x], np.float32) for x in (0.5, 0.25, 0.5))
    o, lse = run_ring(n, chunk, q, k, v, "fp8_e4m3", descales)
    scale = float(np.float32(d ** -0.5))
    model_o, model_lse, partial_norms = ring_model(n, chunk, q, k, v, descales, scale)
    assert not np.isnan(f64(o)).any() and not np.isnan(lse).any()
    bound = MODEL_O_BOUND * partial_norms / np.linalg.norm(model_o) + (n - 1) * U
    assert reference.relative_error(f64(o), model_o) <= bound
    assert np.abs(f64(lse) - model_lse).max() <= MODEL_LSE_BOUND + LSE_BOUND
    dequant = [f64(x) * float(s[0]) for x, s in zip((q, k, v), descales)]
    ref_o, ref_lse = reference.attention(*dequant, causal=True, return_lse=True)
    assert reference.relative_error(f64(o), ref_o) <= RECIPE_FP64_BOUND


# ---- the NCCL ring on two GPUs --------------------------------------------------------------

def _two_gpus_reason() -> str:
    if importlib.util.find_spec("cupy") is None:
        return "cupy is not installed"
    try:
        import cupy
        from cupy.cuda import nccl
        if not nccl.available:
            return "cupy has no NCCL"
        if cupy.cuda.runtime.getDeviceCount() < 2:
            return "fewer than 2 GPUs"
    except Exception as e:     # no driver, no NCCL library
        return f"no usable cupy NCCL: {e}"
    return ""


def nccl_ring_matches_one_device(dtype: str, chunk: int, d: int) -> None:
    """The ring over NcclTransport.single_process([0, 1]) against the single call on device 0:
    BF16 within bf16_bounds for the device's kernel; FP8 (its rounding of P differs between the
    two) against fp64 within the recipe's error."""
    n = 2
    rng = np.random.default_rng(49)
    length = 2 * n * chunk
    if dtype == "bf16":
        q, k, v = (rng.standard_normal((1, length, h, d)).astype(np.float32).astype(ml_dtypes.bfloat16)
                   for h in (HQ, HKV, HKV))
        host_descales = None
    else:
        q, k, v = ((rng.standard_normal((1, length, h, d)) * 2).astype(np.float32).astype(ml_dtypes.float8_e4m3fn)
                   for h in (HQ, HKV, HKV))
        host_descales = tuple(np.array([x], np.float32) for x in (0.5, 0.25, 0.5))
    t = transport.NcclTransport.single_process([0, 1])
    r = ring.Ring(t, ring.Shape(chunk, HQ, HKV, d, d), dtype)
    parts = {name: zigzag.split(x, n) for name, x in (("q", q), ("k", k), ("v", v))}
    dev = {i: t.device(i) for i in range(n)}
    args = {name: {i: dev[i].from_host(parts[name][i], dtype) for i in range(n)} for name in parts}
    poison = lambda i, shape, dt: dev[i].from_host(np.full(shape, np.nan, devices.host_dtype(dt)), dt)  # noqa: E731
    out = {i: poison(i, (1, 2 * chunk, HQ, d), "bf16") for i in range(n)}
    lse = {i: poison(i, (1, HQ, 2 * chunk), "float32") for i in range(n)}
    descales = ({i: tuple(dev[i].from_host(x, "float32") for x in host_descales) for i in range(n)}
                if host_descales else None)
    r(args["q"], args["k"], args["v"], out, lse, descales=descales)
    r.synchronize()
    o = zigzag.gather([dev[i].to_host(out[i], "bf16") for i in range(n)], 1)
    o_lse = zigzag.gather([dev[i].to_host(lse[i], "float32") for i in range(n)], 2)
    if dtype == "bf16":
        from zyfa_runtime.catalogue import Variant
        from zyfa_runtime.driver import get_driver
        rounded = Variant(get_driver().arch(0), "bf16", d, d, True).tile.pv_row_sums
        vs_single, _, lse_bound = bf16_bounds(n, rounded)
        g = dev[0]
        single, single_lse = zr.flash_attn_func(*(g.view(g.from_host(x, dtype), dtype) for x in (q, k, v)),
                                                causal=True, return_lse=True)
        m = reference.attention(q, k, np.abs(f64(v)), causal=True)
        assert_within(o, f64(single.numpy()), vs_single * m, "two-device ring vs one device")
        assert_within(o_lse, f64(single_lse.numpy()), lse_bound, "two-device ring LSE vs one device")
    else:
        dequant = [f64(x) * float(s[0]) for x, s in zip((q, k, v), host_descales)]
        ref_o = reference.attention(*dequant, causal=True)
        assert not np.isnan(f64(o)).any() and not np.isnan(o_lse).any()
        assert reference.relative_error(f64(o), ref_o) <= RECIPE_FP64_BOUND


@pytest.mark.gpu
@pytest.mark.skipif(bool(_two_gpus_reason()), reason=_two_gpus_reason() or "-")
@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3"])
def test_the_nccl_ring_on_two_gpus_matches_one_gpu(dtype):
    nccl_ring_matches_one_device(dtype, chunk=256, d=128)


# ---- the CuPy code paths without a GPU: CuPy and NCCL stood in for by numpy, on the emulator --

class _Ptr:
    def __init__(self, ptr):
        self.ptr = ptr


class _Array(np.ndarray):
    """A numpy array with CuPy's ``.data.ptr`` (the emulator's kernels read host memory)."""

    @property
    def data(self):
        return _Ptr(self.ctypes.data)


def _fake(x):
    return np.asarray(x).view(_Array)


def fake_cupy():
    """A module with the part of CuPy's API the example uses, on host memory: streams and events
    synchronous (the emulator's launches run whole), NCCL's group calls matched at groupEnd."""
    import ctypes
    import types
    cp = types.ModuleType("cupy")
    for name in ("uint8", "uint16", "uint32", "float32", "abs", "signbit", "searchsorted", "isfinite", "isnan",
                 "where", "linalg"):
        setattr(cp, name, getattr(np, name))
    cp.empty = lambda shape, dtype: _fake(np.empty(shape, dtype))
    cp.asarray = _fake
    cp.asnumpy = lambda x: np.array(x)
    cp.get_default_memory_pool = lambda: types.SimpleNamespace(free_all_blocks=lambda: None)

    class Rng:
        def __init__(self, seed):
            self.rng = np.random.default_rng(seed)

        def standard_normal(self, shape, dtype):
            return _fake(self.rng.standard_normal(shape).astype(dtype))
    cp.random = types.SimpleNamespace(default_rng=Rng)

    class Device:
        def __init__(self, ordinal=0):
            self.id = ordinal

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def synchronize(self):
            pass

    class Stream:
        count = 0

        def __init__(self, non_blocking=False):
            Stream.count += 1
            self.ptr = 0x5000 + Stream.count

        def wait_event(self, event):
            pass

        def synchronize(self):
            pass

    class Event:
        def __init__(self, disable_timing=False):
            pass

        def record(self, stream=None):
            pass

    def memcpy(dst, src, size, kind, stream):
        ctypes.memmove(dst, src, size)
    cuda = types.ModuleType("cupy.cuda")
    cuda.Device, cuda.Stream, cuda.Event = Device, Stream, Event
    cuda.get_elapsed_time = lambda start, end: 1.0
    cuda.runtime = types.SimpleNamespace(memcpyAsync=memcpy, memcpyDefault=4, getDeviceCount=lambda: 2,
                                         getDeviceProperties=lambda i: {"name": b"numpy stand-in"})
    nccl = types.ModuleType("cupy.cuda.nccl")
    nccl.available, nccl.NCCL_UINT8 = True, 7
    pending = []

    class Comm:
        def __init__(self, rank):
            self.rank = rank

        @staticmethod
        def initAll(devices):
            return [Comm(r) for r in range(len(devices))]

        def send(self, ptr, count, dtype, peer, stream):
            pending.append(("send", self.rank, peer, ptr, count))

        def recv(self, ptr, count, dtype, peer, stream):
            pending.append(("recv", peer, self.rank, ptr, count))

    def group_end():
        sends = [p for p in pending if p[0] == "send"]
        for _, src_rank, dst_rank, ptr, count in [p for p in pending if p[0] == "recv"]:
            match = next(s for s in sends if s[1:3] == (src_rank, dst_rank))
            sends.remove(match)
            assert match[4] == count, "send and recv of different sizes"
            ctypes.memmove(ptr, match[3], count)
        assert not sends, "a send without its recv"
        pending.clear()
    nccl.NcclCommunicator, nccl.groupStart, nccl.groupEnd = Comm, lambda: None, group_end
    cuda.nccl = nccl
    cp.cuda = cuda
    return cp


@pytest.fixture
def stand_in_cupy(monkeypatch, emulator):
    cp = fake_cupy()
    for name, module in (("cupy", cp), ("cupy.cuda", cp.cuda), ("cupy.cuda.nccl", cp.cuda.nccl)):
        monkeypatch.setitem(sys.modules, name, module)
    return cp


@needs_emulator
@pytest.mark.parametrize("dtype", ["bf16", "fp8_e4m3"])
def test_the_nccl_path_runs_on_numpy_stand_ins_for_cupy_and_nccl(stand_in_cupy, dtype):
    """The two-GPU test's code, on the emulator: CupyDevice, NcclTransport (its group calls and
    peers) and the ring's views of CuPy-style storage arrays."""
    nccl_ring_matches_one_device(dtype, chunk=32, d=64)


@pytest.mark.slow
@needs_emulator
def test_the_benchmark_runs_end_to_end_on_numpy_stand_ins(stand_in_cupy, tmp_path):
    """bench_two_gpus.main on a tiny problem: every run (single call, NCCL ring, one-device
    simulation) in the table and the JSON, each ring's output that of the single call."""
    spec = importlib.util.spec_from_file_location("bench_two_gpus", EXAMPLE / "bench_two_gpus.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "results.json"
    assert bench.main(["--tokens", "128", "--hq", str(HQ), "--hkv", str(HKV), "--d", "64", "--gpus", "2",
                       "--sim-ranks", "2", "--warmup", "0", "--repeats", "1", "--json", str(out)]) == 0
    import json
    results = json.loads(out.read_text())
    for dtype, bound in (("bf16", 2 * (2 + 3) * U), ("fp8_e4m3", 2 * RECIPE_FP64_BOUND)):
        runs = results["runs"][dtype]
        assert set(runs) == {"single", "ring x2", "sim x2"}
        for label in ("ring x2", "sim x2"):
            assert not runs[label]["nan"] and runs[label]["rel_error_vs_single"] <= bound, (dtype, label)
