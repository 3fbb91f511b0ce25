"""bench/ncu_stalls.py: Nsight Compute's source page summed per opcode and per instruction."""
import importlib.util
from pathlib import Path

SPEC = importlib.util.spec_from_file_location("ncu_stalls", Path(__file__).parent.parent / "bench" / "ncu_stalls.py")
ncu_stalls = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(ncu_stalls)


def test_samples_are_summed_per_opcode_with_their_reasons(tmp_path, capsys):
    hdr = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
           "stall_wait", "stall_barrier", "stall_wait (Not Issued)"]
    rows = [["0x10", "MUFU.EX2 R1, R2", "6", "100", "6", "0", "5"],
            ["0x20", "@!P0 MUFU.EX2 R3, R4", "2", "100", "2", "0", "1"],
            ["0x30", "BAR.SYNC.DEFER_BLOCKING R5, 0x100", "2", "50", "0", "2", "0"]]
    path = tmp_path / "source.csv"
    path.write_text('"Kernel Name","k",\n' + "\n".join(",".join(f'"{c}"' for c in r) for r in [hdr] + rows))
    ncu_stalls.main(str(path), 5)
    out = capsys.readouterr().out
    assert "10 samples" in out and "wait 0.800" in out and "barrier 0.200" in out
    mufu = next(line for line in out.splitlines() if line.strip().startswith("MUFU"))
    assert mufu.split()[1:3] == ["0.800", "200"]          # both MUFUs, the predicate stripped
    first = out.split("per instruction")[1].splitlines()[1]
    assert "MUFU.EX2 R1, R2" in first and "wait 1.00" in first   # the most samples first
