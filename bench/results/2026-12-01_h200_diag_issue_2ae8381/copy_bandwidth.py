import torch
for n in (64 << 20, 128 << 20):
    x = torch.randint(0, 120, (n,), dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
    for _ in range(5): y.copy_(x)
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record()
    for _ in range(50): y.copy_(x)
    e1.record(); torch.cuda.synchronize()
    us = e0.elapsed_time(e1) / 50 * 1000
    print(f"copy {n >> 20} MiB: {us:.1f} us, {2 * n / us / 1e6:.2f} TB/s")
