"""The serving features' cost on the GPU: sliding window, softcap, sinks and a paged KV cache
against zyfa's plain kernels and the cuDNN frontend's graph, in the same run (issue 47's bars:
window 4096 at 32k tokens >= 0.9x dense TFLOP/s counting only the FLOPs inside the window; softcap
and sinks <= 5 % slower than without; paged (pages of 16, 64, 256) >= 0.95x dense).

Per shape (B, S, Hq, Hkv, D; causal) and dtype, each a row:
  dense     flash_attn_func, no feature (the plain kernels)
  window W  window_size=(W - 1, 0): each query sees its W newest keys, itself included (a row
            for each --window W)
  softcap   softcap=--softcap on the dense call
  sinks     one fp32 sink a query head on the dense call
  paged P   flash_attn_with_kvcache over the same K and V as a cache of pages of P rows (--pages),
            the pages shuffled over the pool, cache_seqlens = S, page_table and lengths unread
            (check_cache_seqlens=False: no copy back in the timed call)
  cudnn     the cuDNN frontend's SDPA graph, dense and with the same window (its band's left
            bound), BF16 only (its FP8 graph takes no band here)
A call's features must be listed by its kernel (the manifest's ``features``); otherwise the row
says why it was refused.  TFLOP/s two ways: over all pairs (Sq Sk, halved for causal) and over
the pairs inside the window (window.visible_count: the issue's measure; the same for rows
without a window).  ``vs dense``: the in-window TFLOP/s over the dense row's.

Every output is checked before it is timed: rows of head 0 of sequence 0 at both ends of the
sequence against an fp32 reference of the same inputs (FP8: the dequantised codes) with the
same features; a row whose error exceeds --max-err is reported as wrong and not timed.  The
rows are then timed in --rounds rounds, each round every row in turn: at 32k tokens a call is
8-18 ms, the card's clock under its power cap drifts from one row to the next by several per
cent, and a row timed once may land on a slow stretch (the same kernel measured 0.90-0.97x
dense by its place in the order alone); ``vs dense`` is then the median of each round's ratio.

Run from the repository root on a GPU machine:
    PYTHONPATH=$PWD python3 bench/features.py --out DIR
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from zyfa_runtime import window as windows  # noqa: E402

#: (B, S, Hq, Hkv, D): Mistral-7B's heads at the issue's 32k, and shorter prompts.
SHAPES = ((1, 32768, 32, 8, 128), (1, 16384, 32, 8, 128), (4, 8192, 32, 8, 128))
CHECK_ROWS = 128


def pair_count(sq: int, sk: int, causal: bool, window_size) -> int:
    """The (query, key) pairs a call computes: window.visible_count of the window it means."""
    return windows.visible_count(sq, sk, windows.normalize(causal, window_size))


def flops(b: int, hq: int, d: int, pairs: int) -> float:
    return 2.0 * b * hq * pairs * (d + d)


def reference_rows(q, k, v, rows, causal, scale, window_size, softcap, sinks):
    """fp32 attention of head 0 of sequence 0 for query ``rows`` (torch, [n, D])."""
    import torch
    s_k = k.shape[1]
    qh = q[0, rows, 0].float()
    kh, vh = k[0, :, 0].float(), v[0, :, 0].float()
    s = (qh @ kh.T) * scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    left, right = windows.normalize(causal, window_size)
    pos = torch.as_tensor(rows, device=q.device)[:, None] + (s_k - q.shape[1])
    j = torch.arange(s_k, device=q.device)[None, :]
    seen = torch.ones_like(s, dtype=torch.bool)
    if right >= 0:
        seen &= j <= pos + right
    if left >= 0:
        seen &= j >= pos - left
    s = s.masked_fill(~seen, -math.inf)
    if sinks is not None:
        s = torch.cat([s, sinks[0].float().expand(s.shape[0], 1)], dim=1)
        p = torch.softmax(s, dim=1)[:, :-1]
    else:
        p = torch.softmax(s, dim=1)
    return p @ vh


def rel_err(out, q, k, v, causal, scale, feat) -> float:
    import torch
    s = q.shape[1]
    rows = list(range(CHECK_ROWS)) + list(range(s - CHECK_ROWS, s))
    ref = reference_rows(q, k, v, rows, causal, scale, feat.get("window_size", (-1, -1)),
                         feat.get("softcap", 0.0), feat.get("sinks"))
    got = out[0, rows, 0].float()
    if not torch.isfinite(got).all():
        return math.inf
    return float((got - ref).norm() / ref.norm())


def paged_cache(t, page: int, perm):
    """``t`` (B, S, H, D) as a KV cache of pages of ``page`` rows (the last page of a sequence
    padded with zeros): page i of sequence b is page ``perm[b pages + i]`` of the pool."""
    import torch
    b, s, h, d = t.shape
    per = -(-s // page)
    padded = torch.zeros((b, per * page, h, d), dtype=t.dtype, device=t.device)
    padded[:, :s] = t
    cache = torch.empty((b * per, page, h, d), dtype=t.dtype, device=t.device)
    cache[perm] = padded.reshape(b * per, page, h, d)
    return cache


def zyfa_call(q, k, v, out, causal, scale, fp8_descales, feat):
    import torch
    import zyfa_runtime as zr
    stream = torch.cuda.current_stream()
    if fp8_descales is None:
        raw, dt, kw = (q, k, v), {}, {}
    else:
        raw, dt = tuple(t.view(torch.uint8) for t in (q, k, v)), {"dtype": "fp8_e4m3"}
        kw = {f"descale_{n}": zr.as_tensor(d) for n, d in zip("qkv", fp8_descales)}
    qr, kr, vr = (zr.as_tensor(t, **dt) for t in raw)
    extra = {n: feat[n] for n in ("window_size", "softcap") if n in feat}
    if "sinks" in feat:
        extra["sinks"] = zr.as_tensor(feat["sinks"])
    o = zr.as_tensor(out)
    page = feat.get("page_size")
    if page:
        b, s = q.shape[:2]
        per = -(-s // page)
        perm = torch.randperm(b * per, generator=torch.Generator().manual_seed(page)).to(q.device)
        kr, vr = (zr.as_tensor(paged_cache(t, page, perm), **dt) for t in raw[1:])
        cache = dict(cache_seqlens=zr.as_tensor(torch.full((b,), s, dtype=torch.int32, device=q.device)),
                     page_table=zr.as_tensor(perm.reshape(b, per).to(torch.int32).contiguous()))

        def call():
            zr.flash_attn_with_kvcache(qr, kr, vr, causal=causal, softmax_scale=scale, out=o, stream=stream,
                                       check_cache_seqlens=False, **cache, **kw, **extra)
        return call

    def call():
        zr.flash_attn_func(qr, kr, vr, causal=causal, softmax_scale=scale, out=o, stream=stream,
                           **kw, **extra)
    return call


def cudnn_call(q, k, v, causal, scale, left_bound):
    from bench import cudnn_frontend
    g = cudnn_frontend.Graph(q, k, v, causal, scale, left_bound=left_bound)
    return g.run, g.out


def run(args) -> dict:
    import torch

    from bench.peers import Sampler, quantise
    sampler = Sampler()
    rows = []
    for b, s, hq, hkv, d in args.shapes:
        torch.manual_seed(0)
        q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16)
        scale = d ** -0.5
        sinks = torch.randn(hq, device="cuda", dtype=torch.float32)
        cases = [("dense", {})] + [(f"window {w}", {"window_size": (w - 1, 0)}) for w in args.window]
        cases += [(f"softcap {args.softcap:g}", {"softcap": args.softcap}), ("sinks", {"sinks": sinks})]
        cases += [(f"paged {p}", {"page_size": p}) for p in args.pages]
        for dtype in args.dtypes:
            if dtype == "fp8":
                (q8, dq), (k8, dk), (v8, dv) = quantise(q), quantise(k), quantise(v)
                ins, desc = (q8, k8, v8), (dq, dk, dv)
                deq = tuple(t.float() * dd for t, dd in zip(ins, desc))
            else:
                ins, desc, deq = (q, k, v), None, (q, k, v)
            impls = [(f"zyfa {dtype} {name}", feat, lambda feat=feat: zyfa_call(*ins, out, True, scale, desc, feat))
                     for name, feat in cases]
            if dtype == "bf16" and not args.no_cudnn:
                impls += [("cudnn bf16 dense", {}, lambda: cudnn_call(q, k, v, True, scale, None))]
                impls += [(f"cudnn bf16 window {w}", {"window_size": (w - 1, 0)},
                           lambda w=w: cudnn_call(q, k, v, True, scale, w + args.cudnn_left_offset))
                          for w in args.window]
            timed = []   # (row, call) of the rows that ran and are right, timed below
            for name, feat, make in impls:
                out = torch.empty(b, s, hq, d, device="cuda", dtype=torch.bfloat16)
                row = {"shape": [b, s, hq, hkv, d], "causal": True, "impl": name,
                       "features": {n: (list(x) if isinstance(x, tuple) else "tensor" if n == "sinks" else x)
                                    for n, x in feat.items()}}
                try:
                    made = make()
                    call, got = (made if isinstance(made, tuple) else (made, out))
                    out.fill_(float("nan"))
                    call()
                    torch.cuda.synchronize()
                    row["rel_err"] = rel_err(got, *deq, True, scale, feat)
                except Exception as e:   # noqa: BLE001 (refused or unsupported: reported)
                    row["refused"] = f"{type(e).__name__}: {e}"[:300]
                    rows.append(row)
                    print(f"{name:28s} {row['refused']}", flush=True)
                    continue
                if not row["rel_err"] <= args.max_err:
                    row["wrong"] = True
                    rows.append(row)
                    print(f"{name:28s} WRONG rel_err {row['rel_err']:.3g}", flush=True)
                    continue
                in_win = pair_count(s, s, True, feat.get("window_size", (-1, -1)))
                row["flops_window"] = flops(b, hq, d, in_win)
                timed.append((row, call))
                rows.append(row)
            time_rows(timed, flops(b, hq, d, pair_count(s, s, True, (-1, -1))), args, sampler)
    return {"device": torch.cuda.get_device_name(0), "gpu": sampler.info(), "rows": rows,
            "args": {k: v for k, v in vars(args).items() if k != "out"}}


def time_rows(timed: list, flops_all: float, args, sampler) -> None:
    """Time one shape and dtype's rows in ``args.rounds`` rounds, each round every row in turn
    (starting one row later each round), so that a drift of the card's clock under its power cap
    reaches every row alike.  A row reports the median of its rounds' medians, and ``vs_dense``
    the median of its rounds' ratios to the dense zyfa row of the same round."""
    import statistics

    from bench.peers import combine_rounds, time_call
    per_round = [[] for _ in timed]
    for r in range(args.rounds):
        for i in [(j + r) % len(timed) for j in range(len(timed))]:
            per_round[i].append(time_call(timed[i][1], args.min_s, args.warm_s, sampler))
    dense = next((i for i, (row, _) in enumerate(timed) if row["impl"].startswith("zyfa") and row["impl"].endswith(" dense")), None)
    for i, (row, _) in enumerate(timed):
        t = combine_rounds(per_round[i]) if args.rounds > 1 else per_round[i][0]
        ms = t["median_ms"]
        row.update(t, tflops_all=flops_all / ms / 1e9, tflops_window=row["flops_window"] / ms / 1e9)
        if dense is not None and row["impl"].startswith("zyfa"):
            ratios = [row["flops_window"] / flops_all * d["median_ms"] / x["median_ms"]
                      for d, x in zip(per_round[dense], per_round[i])]
            row["vs_dense"] = statistics.median(ratios)
            if args.rounds > 1:
                row["round_vs_dense"] = ratios
        print(f"{row['impl']:28s} {ms * 1e3:9.1f} us  {row['tflops_window']:7.1f} TFLOP/s in window  "
              f"{row['tflops_all']:7.1f} all pairs  err {row['rel_err']:.2e}"
              + (f"  {row['vs_dense']:.3f}x dense" if "vs_dense" in row else "")
              + (f"  rounds {' '.join(f'{x:.3f}' for x in row['round_vs_dense'])}" if "round_vs_dense" in row else ""),
              flush=True)


def markdown(data: dict) -> str:
    lines = [f"# Serving features on {data['device']}", "",
             "Causal. TFLOP/s in window: only visible (query, key) pairs counted; all pairs: Sq Sk / 2. "
             "`x dense`: in-window TFLOP/s over the same dtype's dense zyfa row.", "",
             "| shape (B, S, Hq, Hkv, D) | impl | median us | TFLOP/s in window | TFLOP/s all pairs | x dense | "
             "rel err |", "|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        shape = "x".join(map(str, r["shape"]))
        if "refused" in r or r.get("wrong"):
            why = r.get("refused", f"wrong: rel err {r.get('rel_err', float('nan')):.3g}")
            lines.append(f"| {shape} | {r['impl']} | {why} | | | | |")
            continue
        lines.append(f"| {shape} | {r['impl']} | {r['median_ms'] * 1e3:.1f} | {r['tflops_window']:.1f} | "
                     f"{r['tflops_all']:.1f} | {format(r['vs_dense'], '.3f') if 'vs_dense' in r else '-'} | {r['rel_err']:.2e} |")
    return "\n".join(lines) + "\n"


def parse_shape(text: str) -> tuple:
    parts = tuple(int(x) for x in text.split("x"))
    if len(parts) != 5:
        raise argparse.ArgumentTypeError(f"shape {text!r}: BxSxHqxHkvxD")
    return parts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", type=parse_shape, nargs="+", default=list(SHAPES), help="BxSxHqxHkvxD ...")
    ap.add_argument("--dtypes", nargs="+", choices=("bf16", "fp8"), default=["bf16", "fp8"])
    ap.add_argument("--window", type=int, nargs="+", default=[4096],
                    help="keys a query sees, itself included (a row for each)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="timed rounds, each every row in turn; a row reports its rounds' medians' median")
    ap.add_argument("--softcap", type=float, default=30.0)
    ap.add_argument("--pages", type=int, nargs="*", default=[16, 64, 256],
                    help="page sizes of the paged rows (none: no paged rows)")
    ap.add_argument("--min-s", type=float, default=1.0, help="timed seconds a row")
    ap.add_argument("--warm-s", type=float, default=0.3)
    ap.add_argument("--max-err", type=float, default=0.05)
    ap.add_argument("--no-cudnn", action="store_true")
    ap.add_argument("--cudnn-left-offset", type=int, default=0,
                    help="added to W for the cuDNN band's left bound (its convention; the check says which)")
    ap.add_argument("--out", type=Path, default=None, help="directory for features.json and features.md")
    args = ap.parse_args(argv)
    data = run(args)
    text = markdown(data)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "features.json").write_text(json.dumps(data, indent=1))
        (args.out / "features.md").write_text(text)


if __name__ == "__main__":
    main()
