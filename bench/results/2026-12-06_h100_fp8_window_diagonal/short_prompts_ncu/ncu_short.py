# One process per implementation, under ncu --profile-from-start off: the three shapes built and
# called three times, then each called once between cudaProfilerStart and cudaProfilerStop.
#   ncu --profile-from-start off --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis \
#       --section WarpStateStats --section SchedulerStats --section LaunchStats --section Occupancy \
#       --csv --page details python3 ncu_short.py IMPL   (IMPL: zyfa_bf16, sdpa_cudnn, zyfa_fp8, cudnn_fe_fp8)
import sys, torch
sys.path.insert(0, ".")
from bench import peers
impl = sys.argv[1]
shapes = [((64, 32, 8, 128, 128, 128), False), ((64, 32, 8, 128, 128, 128), True), ((32, 32, 8, 256, 128, 128), True)]
side = torch.cuda.Stream()
calls = []
with torch.cuda.stream(side):
    for shape, causal in shapes:
        ctx = peers.point_context(shape, 0)
        call, _o, _n = peers.build_impl(impl, ctx, causal, None)
        for _ in range(3):
            call()
        calls.append(call)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for call in calls:
        call()
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
