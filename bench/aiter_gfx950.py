"""AMD AITER's gfx950 FAv3 forward kernels on the emulator: ground truth for the emulator.

AITER's eight BF16 code objects (``amd-aiter`` wheel, fetched by pip into the user cache
and checked against a pinned sha256; see ``zyfa_emulator/peers/aiter_fav3.py``) run on
the CPU emulator with the hazard checker attached, on small shapes, against the fp64
reference (``zyfa_runtime/reference.py``): fresh random normal bf16 inputs, outputs and
LSE poisoned (NaN) before the launch, error = ||out - ref|| / ||ref||, NaN never passes.

    python bench/aiter_gfx950.py                   # the table of every case
    python bench/aiter_gfx950.py --only causal     # cases whose kernel name contains it
    python bench/aiter_gfx950.py --all-report      # every hazard rule report-only

Output: one row per case -- kernel, shape, O error, LSE error, the hazard checker's
report-only findings (rule x distinct code sites), instructions, seconds.  Exit status
1 when a case exceeds its bound (O 4e-3, LSE 1e-3).

Further tables (cycle-model calibration, side by side with the project's kernels) go
into :func:`extra_tables`, which ``main`` prints after the correctness table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zyfa_emulator.peers.aiter_fav3 import (  # noqa: E402
    LSE_BOUND,
    O_BOUND,
    AiterFav3,
    Case,
    Result,
    run_case,
)

#: The correctness cases: every kernel; Sq != Sk (bottom-right causal) for the batch
#: kernels; GQA 1 and 8; varlen with 2-3 sequences of unequal length for ``_group``.
#: Query tiles are 256 rows (d 128) / 128 rows (d 192); causal kernels pair tile x with
#: N-1-x in one workgroup, so two tiles exercise the pairing.
CASES = (
    Case("fwd_hd128_bf16", 1, 1, (256,), (384,)),
    Case("fwd_hd128_bf16", 8, 1, (256,), (256,), seed=1),
    Case("fwd_hd128_bf16_causal", 1, 1, (256,), (256,)),
    Case("fwd_hd128_bf16_causal", 1, 1, (256,), (512,), seed=1),
    Case("fwd_hd128_bf16_causal", 8, 1, (512,), (512,), seed=2),
    Case("fwd_hd128_bf16_group", 1, 1, (100, 300, 60), (130, 200, 90)),
    Case("fwd_hd128_bf16_causal_group", 2, 1, (200, 60, 150), (260, 60, 300)),
    Case("fwd_hd192_hd128_bf16", 1, 1, (128,), (320,)),
    Case("fwd_hd192_hd128_bf16", 8, 1, (128,), (128,), seed=1),
    Case("fwd_hd192_hd128_bf16_causal", 1, 1, (256,), (384,)),
    Case("fwd_hd192_hd128_bf16_causal", 8, 1, (256,), (256,), seed=1),
    Case("fwd_hd192_hd128_bf16_group", 1, 1, (70, 200), (150, 100)),
    Case("fwd_hd192_hd128_bf16_causal_group", 2, 1, (140, 50, 100), (200, 50, 230)),
)

#: The CI case (tests/emulator/test_emu_aiter.py): one causal d128 workgroup.
CI_CASE = Case("fwd_hd128_bf16_causal", 1, 1, (256,), (512,), seed=3)


def correctness(cases=CASES, runner: AiterFav3 | None = None, echo=None) -> list[Result]:
    runner = runner or AiterFav3()
    results = []
    for case in cases:
        r = run_case(runner, case)
        results.append(r)
        if echo:
            echo(row(r))
    return results


HEADER = ("| kernel | shape | O error | LSE error | hazards (report-only: rule x sites) | "
          "instructions | s |\n|---|---|---|---|---|---|---|")


def row(r: Result) -> str:
    flag = "" if r.ok else " **FAIL**"
    return (f"| {r.case.kernel} | {r.case.shape_text()} | {r.o_error:.2e}{flag} | "
            f"{r.lse_error:.2e} | {r.launch.hazard_text()} | {r.launch.instructions} | "
            f"{r.seconds:.0f} |")


def extra_tables(runner: AiterFav3, results: list[Result]) -> list[str]:
    """Tables printed after the correctness table (markdown text, one string each).

    The place for the cycle-model calibration against AITER's published throughput and
    the side-by-side comparison with the project's gfx950 kernels: ``runner`` holds the
    loaded kernels (``runner.function(name)``) and the emulator driver
    (``runner.driver``); ``results`` are the correctness runs above."""
    from bench.gfx950_calibration import markdown_tables
    return markdown_tables()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="run the cases whose kernel name contains this text")
    ap.add_argument("--all-report", action="store_true",
                    help="make every hazard rule report-only (collect all findings)")
    args = ap.parse_args(argv)
    cases = [c for c in CASES if args.only is None or args.only in c.kernel]
    if args.all_report:
        from zyfa_emulator.hazards import RULES
        runner = AiterFav3(report_only=RULES)
    else:
        runner = AiterFav3()
    print(f"AITER FAv3 gfx950 on the emulator (bounds: O {O_BOUND:g}, LSE {LSE_BOUND:g}; "
          f"hazard checker attached, report-only rules: "
          f"{', '.join(sorted(runner.checker.report_only))})\n")
    print(HEADER, flush=True)
    results = correctness(cases, runner, echo=lambda s: print(s, flush=True))
    for table in extra_tables(runner, results):
        print()
        print(table)
    bad = [r for r in results if not r.ok]
    if bad:
        print(f"\n{len(bad)} case(s) out of bounds", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
