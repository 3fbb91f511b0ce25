"""Every available variant on small shapes, for ``compute-sanitizer`` (memcheck, racecheck).

Dense with GQA and ragged lengths (Sq < Sk and Sq > Sk, so causal rows that see no key
exist), strided views, and varlen with empty and single-token sequences: the cases of
``zyfa_runtime.selfcheck`` plus one more varlen batch (its cu_seqlens on the host, staged to the
device by a queued copy) and a call repeated from its plan (``out``
given: the second call queues the first one's launches again).  Each result is also checked against
its reference, so a run that the tool lets through still has to be right.

    compute-sanitizer --tool memcheck --error-exitcode 9 python3 bench/sanitize.py
    compute-sanitizer --tool racecheck --error-exitcode 9 python3 bench/sanitize.py [NAME ...]

Names (substrings of a variant's name) pick the variants, all by default: racecheck takes
minutes a variant.
"""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from zyfa_runtime import flash_attn_func  # noqa: E402
from zyfa_runtime.api import kernel_table  # noqa: E402
from zyfa_runtime.driver import get_driver  # noqa: E402
from zyfa_runtime.memory import DeviceArray, to_device  # noqa: E402
from zyfa_runtime.selfcheck import _descales, _quantise, bounds, check_variant, varlen_case  # noqa: E402


def planned_repeat(driver, v, rng) -> bool:
    """A dense GQA call with ``out`` given, poisoned, then again from its plan: the same bits,
    no NaN."""
    host = [_quantise(rng.standard_normal(shape).astype(np.float32), v.dtype)
            for shape in ((2, 70, 4, v.d_qk), (2, 131, 2, v.d_qk), (2, 131, 2, v.d_v))]
    q, k, vv = (to_device(driver, 0, h[0], v.dtype) for h in host)
    scales = _descales(driver, 0, tuple(h[2] for h in host))
    out = DeviceArray(driver, 0, (2, 70, 4, v.d_v), "bf16")
    runs = []
    for _ in range(2):
        driver.memset_d8(out.ptr, 0xFF, out.nbytes)
        flash_attn_func(q, k, vv, causal=v.causal, out=out, **scales)
        runs.append(out.numpy().view(np.uint16).copy())
    return bool(np.array_equal(*runs)) and not np.isnan(out.numpy().astype(np.float32)).any()


def main() -> int:
    driver = get_driver()
    table = kernel_table(driver)
    arch = table.device_arch(0)
    rng = np.random.default_rng(0)
    bad = 0
    # plain calls run the plain kernels (the serving ones: tests/test_gpu_serving_features.py)
    variants = [v for v in table.available(arch)
                if not v.serving and (not sys.argv[1:] or any(n in v.name for n in sys.argv[1:]))]
    if not variants:
        print(f"no available variant matches {sys.argv[1:]}")
        return 2
    for v in variants:
        for r in check_variant(driver, 0, v, seed=1):
            bad += not r.ok
            print(f"{v.name:<40} {r.case:<22} O {r.o_error:.2e} LSE {r.lse_error:.2e} "
                  f"{'ok' if r.ok else 'FAIL'}", flush=True)
        (o, lse), _ = varlen_case(driver, 0, v, rng, seq_q=[1, 0, 40, 1], seq_k=[1, 5, 0, 70],
                                  hq=4, hkv=2, host_cu=True)
        ok = o <= bounds(v)[0] and lse <= bounds(v)[1]
        bad += not ok
        print(f"{v.name:<40} {'varlen 1/0, host cu':<22} O {o:.2e} LSE {lse:.2e} "
              f"{'ok' if ok else 'FAIL'}", flush=True)
        ok = planned_repeat(driver, v, rng)
        bad += not ok
        print(f"{v.name:<40} {'repeated from its plan':<22} {'ok' if ok else 'FAIL'}", flush=True)
    print(f"{len(variants)} variants, {bad} failures")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
