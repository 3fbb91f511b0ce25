"""Short prompts on one NVIDIA GPU: zyfa against its peers where each call is a few key blocks.

Issue 44's shapes (d128, Hq 32 / Hkv 8, causal and not): B16 S512, B32 S256, B64 S128 (and
B4 S2048 for scale).  Each implementation is built by ``bench/peers.py`` (``build_impl``: the
same tensors, quantisation and descales) and timed three ways, in turn in each of ``--rounds``
rounds (the median reported):

* ``call``: CUDA events around each eager call, the median over the window (peers.py's
  ``time_call``): what a caller without graphs sees, host launch gaps included;
* ``graph``: ``--graph-calls`` calls captured into one CUDA graph, events around each replay,
  the median divided by the calls: the GPU's time alone;
* ``kernels`` (``--profile``): the device time of each kernel a call launches (torch.profiler),
  so that a call's time can be split into its kernels (zyfa FP8: the V^T pre-pass and the
  attention kernel).

FLOPs = 2 B Hq S^2 (d_qk + d_v), halved for causal.  Everything runs on one side stream so
that every call (the cuDNN graph's handle included) can be captured.

    python bench/short_prompts.py --out bench/results/RUN/short_prompts.json
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import peers   # noqa: E402

SHAPES = [(16, 32, 8, 512, 128, 128), (32, 32, 8, 256, 128, 128), (64, 32, 8, 128, 128, 128),
          (4, 32, 8, 2048, 128, 128)]
IMPLS = ("zyfa_bf16", "zyfa_fp8", "sdpa_cudnn", "cudnn_fe_fp8")


class _NoSampler:
    """peers.time_call's sampler, without NVML: this page reports times only."""
    def start(self):
        pass

    def stop(self) -> dict:
        return {}


def time_graph(call, n_calls: int, replays: int) -> float:
    """Milliseconds a call, from ``n_calls`` calls captured into one CUDA graph (median of
    ``replays`` replays, each between two events)."""
    import torch
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=torch.cuda.current_stream()):
        for _ in range(n_calls):
            call()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    ms = []
    for _ in range(replays):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        ms.append(e0.elapsed_time(e1) / n_calls)
    return statistics.median(ms)


def kernel_times(call, calls: int = 50) -> dict:
    """Microseconds of device time a call, per kernel name (torch.profiler's CUDA activity)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    out = {}
    for ev in prof.key_averages():
        t = getattr(ev, "self_device_time_total", None) or getattr(ev, "self_cuda_time_total", 0)
        if t and ev.count >= calls:
            out[ev.key[:90]] = round(t / calls, 2)
    return out


def run(args) -> dict:
    import torch
    side = torch.cuda.Stream()
    points = []
    with torch.cuda.stream(side):
        for shape in args.shapes:
            for causal in args.causal:
                ctx = peers.point_context(shape, args.seed)
                fl = peers.flops(shape, causal)
                calls, res = {}, {}
                for name in args.impls:
                    try:
                        call, _out, notes = peers.build_impl(name, ctx, causal, None)
                        call()
                        torch.cuda.synchronize()
                        calls[name] = call
                        res[name] = {"notes": notes, "call_ms": [], "graph_ms": []}
                    except Exception as e:   # noqa: BLE001
                        res[name] = {"missing": f"{type(e).__name__}: {str(e)[:200]}"}
                for _ in range(args.rounds):
                    for name, call in calls.items():
                        res[name]["call_ms"].append(
                            peers.time_call(call, args.min_s, args.warm_s, _NoSampler())["median_ms"])
                        try:
                            res[name]["graph_ms"].append(time_graph(call, args.graph_calls, args.replays))
                        except Exception as e:   # noqa: BLE001
                            res[name]["graph_missing"] = f"{type(e).__name__}: {str(e)[:200]}"
                            torch.cuda.synchronize()
                for name in calls:
                    r = res[name]
                    for key in ("call_ms", "graph_ms"):
                        if r[key]:
                            ms = statistics.median(r[key])
                            r[key.replace("_ms", "_us")] = round(ms * 1e3, 2)
                            r[key.replace("_ms", "_tflops")] = round(fl / ms / 1e9, 1)
                    if args.profile:
                        r["kernels_us"] = kernel_times(calls[name])
                points.append({"shape": list(shape), "causal": causal, "flops": fl, "results": res})
                print(line(points[-1]), flush=True)
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "python": platform.python_version(), "rounds": args.rounds,
            "graph_calls": args.graph_calls, "points": points}


def line(p) -> str:
    B, Hq, Hkv, S, dqk, dv = p["shape"]
    cells = []
    for name, r in p["results"].items():
        if "call_us" in r:
            cells.append(f"{name} {r['call_us']:.1f} us / graph {r.get('graph_us', float('nan')):.1f} us "
                         f"({r.get('graph_tflops', 0):.0f} TF/s)")
        else:
            cells.append(f"{name} missing")
    return f"B{B} S{S} {'causal' if p['causal'] else 'full'}: " + " | ".join(cells)


def markdown(data) -> str:
    names = [n for n in IMPLS if any(n in p["results"] for p in data["points"])]
    rows = [f"{data['device']}; us a call (eager, events a call) / us a call in a CUDA graph of "
            f"{data['graph_calls']} calls; median of {data['rounds']} rounds", "",
            "| shape | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for p in data["points"]:
        B, Hq, Hkv, S, *_ = p["shape"]
        cells = []
        for n in names:
            r = p["results"].get(n, {})
            cells.append(f"{r['call_us']:.1f} / {r.get('graph_us', float('nan')):.1f}" if "call_us" in r else "-")
        rows.append(f"| B{B} S{S} {'causal' if p['causal'] else 'full'} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=None, help="BxHqxHkvxSxDqkxDv tuples, comma-separated")
    ap.add_argument("--causal", default="both", choices=("both", "causal", "noncausal"))
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--min-s", type=float, default=0.15)
    ap.add_argument("--warm-s", type=float, default=0.05)
    ap.add_argument("--graph-calls", type=int, default=20)
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--profile", action="store_true", help="device time per kernel (torch.profiler)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="JSON path (a .md beside it)")
    args = ap.parse_args(argv)
    args.shapes = peers.parse_shapes(args.shapes) if args.shapes else SHAPES
    args.causal = {"both": (False, True), "causal": (True,), "noncausal": (False,)}[args.causal]
    args.impls = args.impls.split(",")
    data = run(args)
    print(markdown(data))
    if args.out:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=1))
        out.with_suffix(".md").write_text(markdown(data) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
