import sys, torch
sys.path.insert(0, ".")
from bench import peers
import zyfa_runtime as zr
from zyfa_runtime import plan as plan_mod
from zyfa_runtime.catalogue import Variant
which = sys.argv[1]
causal = sys.argv[2] == "causal"
shape = (1, 32, 8, 8192, 128, 128)
v = Variant("sm_90a", "fp8_e4m3", 128, 128, causal, short=(which == "short"))
side = torch.cuda.Stream()
with torch.cuda.stream(side):
    ctx = peers.point_context(shape, 0)
    call, _o, _n = peers.build_impl("zyfa_fp8", ctx, causal, None)
    with plan_mod.forced_variant(v):
        for _ in range(3):
            call()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStart()
        call()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
