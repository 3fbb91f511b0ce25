"""Command line: ``python -m zyfa_runtime info | matrix | check | bench``."""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

from . import __version__
from .errors import InstallationError, ZyfaError

#: What ``check --quick`` runs on the emulator: one BF16 (HIP C++) and one FP8 (generated
#: assembly) kernel, one case each -- seconds on a CPU, and both gfx950 code paths.
EMULATOR_QUICK = ("fwd_gfx950_bf16_d64x64_causal", "fwd_gfx950_fp8_e4m3_d64x64_causal")


def _driver():
    from .driver import get_driver
    return get_driver()


def _driver_or_emulator():
    """The GPU backend, else (no backend named, no GPU usable) the gfx950 emulator, saying so.
    The choice is made for this process: the calls it checks then run on the same backend."""
    import os
    from .driver import BACKEND_ENV, get_driver
    if os.environ.get(BACKEND_ENV):
        return get_driver()
    try:
        return get_driver()
    except ZyfaError:
        print("zyfa: no GPU backend is usable here (python -m zyfa_runtime info says why): "
              "running the gfx950 code objects on the CPU emulator instead "
              f"(set {BACKEND_ENV} to choose a backend)", flush=True)
        os.environ[BACKEND_ENV] = "emulator"
        return get_driver()


def installed_distributions() -> list[str]:
    """``name version`` of each installed distribution providing ``zyfa_runtime``: zyfa-cuda13,
    zyfa-rocm7-2 and an editable zyfa share it, so more than one means they overwrote each other."""
    from importlib import metadata
    names = sorted(set(metadata.packages_distributions().get("zyfa_runtime", [])))
    return [f"{n} {metadata.version(n)}" for n in names]


def cmd_info(args) -> int:
    from . import cache
    from .api import kernel_table
    from .catalogue import distribution_name
    print(f"zyfa {__version__}")
    dists = installed_distributions()
    print(f"installed    {', '.join(dists) or 'none (run from a source tree)'}")
    if len(dists) > 1:
        print("warning      these distributions overwrite each other's files: "
              "pip uninstall all of them, then install one")
    prebuilt = cache.prebuilt_dir()
    print(f"prebuilt     {prebuilt}")
    print(f"user cache   {cache.cache_root()} (ZYFA_CACHE_DIR overrides)")
    manifest = cache.load_manifest(prebuilt)
    for arch, tk in manifest["toolkits"].items():
        comp = manifest["compilers"].get(arch, {})
        n = sum(1 for e in manifest["kernels"] if e.get("built") and e["variant"]["arch"] == arch)
        if n:
            print(f"toolkit      {arch}: {n} kernels for {tk} (the pin), built with "
                  f"{comp.get('version') or '-'} ({comp.get('name', '-')})")
        else:
            print(f"toolkit      {arch}: {tk}, no kernels in this installation ({distribution_name(tk)} has them)")
    try:
        driver = _driver()
    except Exception as e:
        print(f"backend      none ({e})")
        return 0
    print(f"backend      {driver.name}")
    for key, val in driver.versions().items():
        print(f"{key:<12} {val}")
    try:
        table = kernel_table(driver)
    except InstallationError as e:
        print(f"refused      {e}")
        return 1
    refused = 0
    for dev in range(driver.device_count()):
        try:
            arch = table.device_arch(dev)
        except InstallationError as e:
            print(f"device {dev}     {driver.device_name(dev)} ({driver.arch(dev)}): refused: {e}")
            refused += 1
            continue
        avail = table.available(arch)
        print(f"device {dev}     {driver.device_name(dev)} ({arch}), {len(avail)} kernels available")
        for v in avail:
            print(f"  {v.name}")
    return 1 if refused else 0


def cmd_check(args) -> int:
    from .api import kernel_table
    from .selfcheck import CASES, LSE_BOUND, O_BOUND, RECIPE_FP64_BOUND, ROUNDED_SUM_LSE_BOUND, check_variant
    driver = _driver_or_emulator()
    dev = args.device
    table = kernel_table(driver)
    arch = table.device_arch(dev)
    # the plain kernels: a plain call is planned onto them; the serving variants run calls with
    # window, softcap or sinks (tests/test_gpu_serving_features.py checks them)
    variants = [v for v in table.available(arch) if not v.serving
                and (not args.only or any(p in v.name for p in args.only.split(",")))]
    cases = tuple(CASES)[:1] if args.quick else tuple(CASES)
    if args.quick and driver.name == "emulator" and not args.only:
        variants = [v for v in variants if v.name in EMULATOR_QUICK]
    if not variants:
        print(f"no kernels available for {arch}", file=sys.stderr)
        return 1
    print(f"zyfa {__version__} check on {driver.device_name(dev)} ({arch}), backend {driver.name}; "
          f"bounds: O rel. error <= {O_BOUND:g}, LSE abs. error <= {LSE_BOUND:g} against fp64 "
          f"({ROUNDED_SUM_LSE_BOUND:g} where l sums the rounded P); "
          f"recipe kernels (FP8 Lean P) against their model, and <= {RECIPE_FP64_BOUND:g} against fp64")
    print(f"{'variant':<40} {'case':<22} {'O rel err':>10} {'LSE err':>10}  result")
    failures = 0
    for v in variants:
        for r in check_variant(driver, dev, v, seed=args.seed, cases=cases):
            failures += not r.ok
            print(f"{v.name:<40} {r.case:<22} {r.o_error:10.2e} {r.lse_error:10.2e}  "
                  f"{'ok' if r.ok else 'FAIL'}" + (f"  ({r.note})" if r.note else ""), flush=True)
    total = len(variants) * len(cases)
    print(f"{total - failures}/{total} cases passed over {len(variants)} variants "
          f"on {driver.name}" + (" (the CPU emulator of gfx950: correctness only, no timing)"
                                 if driver.name == "emulator" else ""))
    return 1 if failures else 0


def support_matrix(manifest: dict) -> str:
    """The README's support matrix: one row per (arch, dtype), one column per head-dim pair."""
    from .catalogue import ARCHES, DTYPES, HEAD_DIMS, Variant
    entries = {Variant.from_json(e["variant"]): e for e in manifest["kernels"]}
    head = "| arch | dtype | " + " | ".join(f"{dq}/{dv}" for dq, dv in HEAD_DIMS) + " |"
    rows = [head, "|" + "---|" * (2 + len(HEAD_DIMS))]
    for arch in ARCHES:
        for dtype in DTYPES:
            cells = []
            for dq, dv in HEAD_DIMS:
                built = [entries[Variant(arch, dtype, dq, dv, c)].get("built") for c in (False, True)]
                cells.append("full + causal" if all(built) else "not built" if not any(built)
                             else "partly built")
            toolkit = manifest["toolkits"][arch]
            rows.append(f"| {arch} ({toolkit}) | {dtype} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def cmd_matrix(args) -> int:
    from . import cache
    print(support_matrix(cache.load_manifest(cache.prebuilt_dir())))
    return 0


def flops(b, hq, sq, sk, d_qk, d_v, causal) -> float:
    f = 2.0 * b * hq * sq * sk * (d_qk + d_v)
    return f / 2 if causal else f


def cmd_bench(args) -> int:
    from .api import flash_attn_func
    from .memory import DeviceArray, host_dtype, to_device
    driver = _driver()
    if driver.name in ("emulator", "fake"):
        print(f"zyfa: bench times kernels on a GPU; the {driver.name} backend has no meaningful "
              "time. For the gfx950 kernels' modelled figures: python bench/gfx950_model.py",
              file=sys.stderr)
        return 2
    dev = args.device
    rng = np.random.default_rng(0)
    b, hq, hkv, s, dq, dv = args.batch, args.hq, args.hkv or args.hq, args.seqlen, args.d_qk, \
        args.d_v or args.d_qk
    def rand(shape):
        x = rng.standard_normal(shape).astype(np.float32)
        if args.dtype == "fp8_e4m3":
            x = x / (np.abs(x).max() / 448.0)
        return to_device(driver, dev, x.astype(host_dtype(args.dtype)), args.dtype)
    q, k, v = rand((b, s, hq, dq)), rand((b, s, hkv, dq)), rand((b, s, hkv, dv))
    out = DeviceArray(driver, dev, (b, s, hq, dv), "bf16")
    call = lambda: flash_attn_func(q, k, v, causal=args.causal, out=out)  # noqa: E731
    for _ in range(args.warmup):
        call()
    driver.synchronize(dev)
    # Each sample times `calls` back-to-back calls between two events, so that the host's time
    # to make a call (validation, packing) overlaps the kernels queued before it, as in a real
    # stream of calls; the median of the per-call times of the samples is reported.
    start, end = driver.event_create(), driver.event_create()
    times = []
    for _ in range(args.repeat):
        driver.event_record(start, 0)
        for _ in range(args.calls):
            call()
        driver.event_record(end, 0)
        driver.event_synchronize(end)
        times.append(driver.event_elapsed_ms(start, end) / args.calls)
    med = statistics.median(times)
    tf = flops(b, hq, s, s, dq, dv, args.causal) / (med * 1e-3) / 1e12
    print(f"{args.dtype} b{b} hq{hq} hkv{hkv} s{s} d{dq}x{dv} {'causal' if args.causal else 'full'}: "
          f"median {med:.3f} ms over {args.repeat} x {args.calls} calls -> {tf:.1f} TFLOP/s")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zyfa_runtime", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("info", help="backend, devices, versions, kernels available, cache location")
    sub.add_parser("matrix", help="the support matrix of the manifest, as a markdown table")
    c = sub.add_parser("check", help="every available variant against the fp64 reference "
                       "(on the gfx950 emulator when no GPU is usable)")
    c.add_argument("--device", type=int, default=0, help="device index (default 0)")
    c.add_argument("--quick", action="store_true",
                   help="one case a variant; on the emulator, one BF16 and one FP8 variant")
    c.add_argument("--only", help="comma-separated substrings of variant names")
    c.add_argument("--seed", type=int, default=None, help="default: fresh random inputs")
    bn = sub.add_parser("bench", help="TFLOP/s for one shape (self-attention, Sq = Sk)")
    bn.add_argument("--device", type=int, default=0, help="device index (default 0)")
    bn.add_argument("--dtype", choices=("bf16", "fp8_e4m3"), default="bf16")
    bn.add_argument("--batch", type=int, default=1)
    bn.add_argument("--hq", type=int, default=32)
    bn.add_argument("--hkv", type=int, default=0, help="default: hq")
    bn.add_argument("--seqlen", type=int, default=8192)
    bn.add_argument("--d-qk", type=int, default=128)
    bn.add_argument("--d-v", type=int, default=0, help="default: d_qk")
    bn.add_argument("--causal", action="store_true")
    bn.add_argument("--warmup", type=int, default=5)
    bn.add_argument("--repeat", type=int, default=30, help="samples")
    bn.add_argument("--calls", type=int, default=10, help="back-to-back calls a sample")
    args = ap.parse_args(argv)
    try:
        return {"info": cmd_info, "matrix": cmd_matrix, "check": cmd_check,
                "bench": cmd_bench}[args.cmd](args)
    except ZyfaError as e:   # no usable backend, or an installation that does not fit: say why
        print(f"zyfa: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
