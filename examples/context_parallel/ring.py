"""Ring attention: one long causal sequence over N ranks, zig-zag split (zigzag.py), by zyfa.

Each rank keeps its 2C queries and a running (O, LSE): bf16 (1, 2C, Hq, Dv) and fp32
(1, Hq, 2C).  Its K/V go around the ring, one hop a step; at step s it holds rank (r - s) mod N's
and makes one zyfa call (zigzag.step_call) with ``return_lse``:

    step 0        causal, its own K/V           -> straight into (O, LSE)
    step s >= 1   full, a partial (o, lse)      -> merge_attention_states into (O, LSE) in place
                  (all 2C rows, or the late C rows: views of O and LSE)

The schedule of one rank, two streams (the emulator has none: its launches run whole):

    compute:  [views]  attn s=0  -------  wait(arrived 0) attn s=1, merge  ...  wait(arrived N-2) ...
    comm:     wait(views)  shift 0: send own K/V, recv -> buf 0   shift 1: ... recv -> buf 1 ...

K/V blocks are double-buffered: shift s receives into buffer s % 2, the one step s + 1 computes
on; before that, the comm stream waits for the compute of step s - 1, that buffer's last reader
(its other reader, shift s - 1's send, is earlier on the comm stream itself).  Shift s overlaps
the compute of step s.  Step s computes on the rank's own K/V (s = 0) or buffer (s - 1) % 2.
N - 1 shifts in all; the last step sends nothing.  The compute stream's last call waits for the
last shift, so a call's end on the compute stream is the end of all its work, transfers too.
Two calls queued back to back are ordered as well: each call's comm stream waits for the views
of the call (queued on the compute stream after the previous call's work).
"""

from __future__ import annotations

import dataclasses

import zyfa_runtime as zr

from . import zigzag


@dataclasses.dataclass(frozen=True)
class Shape:
    """One rank's share: ``chunk`` tokens a chunk (2 chunks a rank), heads and head dims."""
    chunk: int
    hq: int
    hkv: int
    d_qk: int
    d_v: int

    def q(self) -> tuple:
        return (1, 2 * self.chunk, self.hq, self.d_qk)

    def kv(self, d: int) -> tuple:
        return (1, 2 * self.chunk, self.hkv, d)

    def o(self, rows: int | None = None) -> tuple:
        return (1, 2 * self.chunk if rows is None else rows, self.hq, self.d_v)

    def lse(self, rows: int | None = None) -> tuple:
        return (1, self.hq, 2 * self.chunk if rows is None else rows)


def _rows(x, rows: slice):
    """Rows (the sequence dim) of a (1, S, H, D) array."""
    return x[:, rows]


def _kv_views(device, k, v, dtype: str, chunk: int, stream=None) -> dict:
    """zyfa's views of a held K/V block: all 2C rows (True), and the early C rows (False)."""
    rows = {True: slice(0, None), False: slice(0, chunk)}
    return {every: (device.view(_rows(k, sl), dtype, stream), device.view(_rows(v, sl), dtype, stream))
            for every, sl in rows.items()}


class _RankState:
    """One rank's buffers, streams and events (allocated once, reused every call)."""

    def __init__(self, device, shape: Shape, dtype: str, n: int):
        self.device = device
        self.compute, self.comm = device.stream(), device.stream()
        # K/V double buffer: (k, v) pairs, each the held block's 2C rows.
        self.kv_buffers = [(device.empty(shape.kv(shape.d_qk), dtype), device.empty(shape.kv(shape.d_v), dtype))
                           for _ in range(2)]
        # Partial results, all 2C rows or (a leading view of the same memory) the late C rows.
        c = shape.chunk
        flat_o = device.empty((2 * c * shape.hq * shape.d_v,), "bf16")
        flat_lse = device.empty((2 * c * shape.hq,), "float32")
        self.partial = {True: (flat_o.reshape(shape.o()), flat_lse.reshape(shape.lse())),
                        False: (flat_o[:c * shape.hq * shape.d_v].reshape(shape.o(c)),
                                flat_lse[:c * shape.hq].reshape(shape.lse(c)))}
        # zyfa's views of them, made once (CuPy's DLPack export orders nothing here: new memory)
        self.kv_views = [_kv_views(device, k, v, dtype, shape.chunk) for k, v in self.kv_buffers]
        self.partial_views = {every: (device.view(o, "bf16"), device.view(o_lse, "float32"))
                              for every, (o, o_lse) in self.partial.items()}
        self.inputs_ready = device.event()
        self.computed = [device.event() for _ in range(n)]   # step s's reads of its K/V are done
        self.arrived = [device.event() for _ in range(n)]    # shift s's block is in its buffer


class Ring:
    """Causal attention of one sequence split over ``transport``'s ranks (every rank this process
    drives).  ``__call__`` queues the whole ring and returns without waiting; the results are
    ready on each rank's compute stream (``synchronize()`` waits for all)."""

    def __init__(self, transport, shape: Shape, dtype: str = "bf16", softmax_scale: float | None = None):
        if dtype not in ("bf16", "fp8_e4m3"):
            raise ValueError(f"dtype {dtype!r}: the ring runs bf16 or fp8_e4m3 inputs")
        self.transport, self.shape, self.dtype = transport, shape, dtype
        self.n = transport.n_ranks
        self.softmax_scale = softmax_scale if softmax_scale is not None else shape.d_qk ** -0.5
        self.ranks = {r: _RankState(transport.device(r), shape, dtype, self.n) for r in transport.local_ranks}

    # -- one call --------------------------------------------------------------------------
    def __call__(self, q: dict, k: dict, v: dict, out: dict, lse: dict, descales: dict | None = None) -> None:
        """q[r] (1, 2C, Hq, Dqk), k[r] and v[r] (1, 2C, Hkv, D) of every local rank r, in its local
        (zig-zag) order; out[r] (1, 2C, Hq, Dv) bf16 and lse[r] (1, Hq, 2C) fp32 receive the
        attention of its queries over the whole causal sequence and its natural-log LSE.
        ``descales[r]``: FP8's (descale_q, descale_k, descale_v) for rank r, one for the whole
        sequence (its K/V are computed on every rank)."""
        views = {r: self._views(r, q[r], k[r], v[r], out[r], lse[r]) for r in self.ranks}
        for step in range(self.n):
            if step < self.n - 1:
                self._shift(step, k, v)
            for r in self.ranks:
                self._attend(r, step, views[r], (descales or {}).get(r))

    def synchronize(self) -> None:
        for state in self.ranks.values():
            state.device.synchronize()

    # -- its stages ------------------------------------------------------------------------
    def _views(self, r: int, q, k, v, out, lse) -> dict:
        """zyfa's views of rank r's inputs and outputs (made on its compute stream, which so
        waits for whatever produced them; the comm stream waits for them too) and of its
        buffers."""
        s, sh = self.ranks[r], self.shape
        for name, x, want in (("q", q, sh.q()), ("k", k, sh.kv(sh.d_qk)), ("v", v, sh.kv(sh.d_v)),
                              ("out", out, sh.o()), ("lse", lse, sh.lse())):
            if tuple(x.shape) != want:
                raise ValueError(f"rank {r}: {name} has shape {tuple(x.shape)}, expected {want}")
        for name, x in (("k", k), ("v", v)):
            if not x.flags.c_contiguous:
                raise ValueError(f"rank {r}: {name} must be contiguous (it is sent as it lies)")
        dev, late = s.device, slice(sh.chunk, None)

        def view(x, dtype):
            return dev.view(x, dtype, s.compute)
        views = {"q": {True: view(q, self.dtype), False: view(_rows(q, late), self.dtype)},
                 "acc": {True: (view(out, "bf16"), view(lse, "float32")),
                         False: (view(_rows(out, late), "bf16"), view(lse[:, :, late], "float32"))},
                 "kv": [_kv_views(dev, k, v, self.dtype, sh.chunk, s.compute)] + s.kv_views,
                 "partial": s.partial_views}
        dev.record(s.inputs_ready, s.compute)
        dev.wait(s.comm, s.inputs_ready)
        return views

    def _held(self, step: int) -> int:
        """Index into views["kv"]: the rank's own K/V at step 0, else buffer (step - 1) % 2."""
        return 0 if step == 0 else 1 + (step - 1) % 2

    def _shift(self, step: int, k: dict, v: dict) -> None:
        """Shift ``step``: every rank sends the block it computes on at this step and receives the
        next one into buffer step % 2, once step - 1's compute (its last reader) is done."""
        sends, recvs, streams = {}, {}, {}
        for r, s in self.ranks.items():
            if step > 0:
                s.device.wait(s.comm, s.computed[step - 1])
            sends[r] = [k[r], v[r]] if step == 0 else list(s.kv_buffers[(step - 1) % 2])
            recvs[r] = list(s.kv_buffers[step % 2])
            streams[r] = s.comm
        self.transport.shift(sends, recvs, streams)
        for r, s in self.ranks.items():
            s.device.record(s.arrived[step], s.comm)

    def _attend(self, r: int, step: int, views: dict, descales) -> None:
        """Rank r's call of ``step`` (zigzag.step_call) and, after step 0, its merge."""
        s = self.ranks[r]
        call = zigzag.step_call(r, step, self.n, self.shape.chunk)
        if step > 0:
            s.device.wait(s.compute, s.arrived[step - 1])
        k, v = views["kv"][self._held(step)][call.all_keys]
        acc_o, acc_lse = views["acc"][call.all_queries]
        o, o_lse = (acc_o, acc_lse) if step == 0 else views["partial"][call.all_queries]
        dq, dk, dv = descales if descales is not None else (None, None, None)
        zr.flash_attn_func(views["q"][call.all_queries], k, v, causal=call.causal, softmax_scale=self.softmax_scale,
                           descale_q=dq, descale_k=dk, descale_v=dv, out=o, lse=o_lse, return_lse=True,
                           stream=s.compute)
        if step > 0:
            zr.merge_attention_states(acc_o, acc_lse, o, o_lse, out=acc_o, out_lse=acc_lse, stream=s.compute)
        s.device.record(s.computed[step], s.compute)
