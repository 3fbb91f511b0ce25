"""Helpers for the emulator tests: assemble gfx950 snippets into a code object with the
project's toolchain (LLVM's assembler) and run them on the emulator.

Each snippet becomes a kernel of its own (symbol = its name) with a minimal kernel
descriptor and metadata, so one assembler run serves a whole test module.  ``run``
executes one snippet with registers set up by the test (ignoring the descriptor);
``dispatch`` goes through the full dispatch path (descriptor, kernarg segment, grid).
The tests of whole kernels take the ``emulator`` fixture (the runtime on the emulator backend
over PREBUILT, the hazard checker as ``hazards`` says) and ``bf16`` from here.
Expected values in the tests are worked out by hand from the ISA guide's definitions;
the assembler only provides the encodings.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from tests.backends import using_backend
from zyfa_emulator import CodeObject, Config, LoadedCode, Machine
from zyfa_runtime import reference
from zyfa_runtime.selfcheck import LSE_BOUND, O_BOUND

#: The code objects the runtime runs in these tests: the checkout's prebuilt/, or
#: $ZYFA_PREBUILT_DIR.
PREBUILT = Path(os.environ.get("ZYFA_PREBUILT_DIR") or Path(__file__).resolve().parents[2] / "prebuilt")


def full_run(config) -> bool:
    """Whether the run selects the ``slow`` tests too (CI's ``-m "slow or not slow"``, or
    ``-m slow``)."""
    from _pytest.mark.expression import Expression
    expr = config.getoption("markexpr") or ""
    try:
        return not expr or Expression.compile(expr).evaluate(lambda name, **kw: name == "slow")
    except Exception:   # an expression this cannot read: check everything
        return True


def hazards(request) -> str:
    """``ZYFA_EMULATOR_HAZARDS`` for a module's emulator: the checker follows every kernel run
    in the full run and in the checker's own tests (``test_emu_hazards``: every kernel
    hazard-clean); the default run's other specifications run without it, which takes a third
    of their time."""
    return "1" if full_run(request.config) or request.module.__name__.endswith("test_emu_hazards") else "0"


def emulated(request, prebuilt=PREBUILT, **env):
    """``with emulated(request) as driver``: the runtime on the emulator backend over
    ``prebuilt``, the hazard checker as ``hazards`` says, ``env`` beside (a test module's
    emulator fixture)."""
    return using_backend("emulator", ZYFA_PREBUILT_DIR=str(prebuilt), ZYFA_EMULATOR_HAZARDS=hazards(request), **env)


@pytest.fixture(scope="module")
def emulator(request):
    """The runtime's driver on the emulator backend over PREBUILT, the hazard checker as
    ``hazards`` says."""
    with emulated(request) as driver:
        yield driver


def bf16(x):
    """``x`` rounded to bf16 (numpy's ml_dtypes type)."""
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16)


def compare(o, lse, ref_o, ref_lse):
    """A BF16 kernel's O and LSE against the fp64 reference's: no NaN, rows without keys where
    the reference has them (zeros, LSE -inf), selfcheck's bounds elsewhere."""
    o = np.asarray(o, np.float64)
    lse = np.asarray(lse, np.float64)
    assert not np.isnan(o).any() and not np.isnan(lse).any()
    assert np.array_equal(np.isneginf(lse), np.isneginf(ref_lse)), "rows without keys differ"
    assert np.array_equal(o[np.all(ref_o == 0, axis=-1)], ref_o[np.all(ref_o == 0, axis=-1)]), "rows without keys"
    finite = np.isfinite(ref_lse)
    assert reference.relative_error(o, ref_o) <= O_BOUND
    assert np.abs(lse[finite] - ref_lse[finite]).max(initial=0.0) <= LSE_BOUND


def built_with(variants, features) -> bool:
    """Whether PREBUILT's manifest has every one of ``variants`` built and listing all of
    ``features`` (a test module's skip condition: the code objects it needs are there)."""
    import json
    try:
        manifest = json.loads((PREBUILT / "manifest.json").read_text())
    except OSError:
        return False
    entries = {e["name"]: e for e in manifest["kernels"]}
    return all(entries.get(v.name, {}).get("built") and set(features) <= set(entries[v.name].get("features", ()))
               for v in variants)

_CACHE: dict[str, LoadedCode] = {}

_DESCRIPTOR = """
.rodata
.p2align 6
.amdhsa_kernel {name}
  .amdhsa_user_sgpr_kernarg_segment_ptr 1
  .amdhsa_user_sgpr_count 2
  .amdhsa_next_free_vgpr 512
  .amdhsa_next_free_sgpr 96
  .amdhsa_accum_offset 256
  .amdhsa_group_segment_fixed_size {lds}
  .amdhsa_kernarg_size {kernarg}
  .amdhsa_float_denorm_mode_32 {denorm}
  .amdhsa_fp16_overflow {ovfl}
  .amdhsa_system_sgpr_workgroup_id_x 1
  .amdhsa_system_sgpr_workgroup_id_y {wgy}
  .amdhsa_system_sgpr_workgroup_id_z {wgz}
  .amdhsa_system_vgpr_workitem_id {tid}
.end_amdhsa_kernel
"""

_META_KERNEL = """  - .name: {name}
    .symbol: {name}.kd
    .kernarg_segment_size: {kernarg}
    .kernarg_segment_align: 8
    .group_segment_fixed_size: {lds}
    .private_segment_fixed_size: 0
    .wavefront_size: 64
    .sgpr_count: 96
    .vgpr_count: 512
    .agpr_count: 256
    .max_flat_workgroup_size: 1024
    .args:
{args}"""


def toolchain():
    try:
        from generator.toolchain import ToolchainError, find_toolchain
    except ImportError as e:   # the build side is absent (an installed package)
        pytest.skip(f"no gfx950 assembler: {e}")
    try:
        return find_toolchain("gfx950")
    except ToolchainError as e:
        pytest.skip(f"no gfx950 assembler here: {e}")


def source(snippets: dict) -> str:
    """Assembly text of one code object holding every snippet as a kernel.

    A snippet is its body (str) or a dict with ``body`` and options ``lds``,
    ``kernarg`` (bytes of kernel arguments, all pointers named a0, a1, ...),
    ``denorm`` (MODE.FP_DENORM for fp32), ``ovfl`` (FP16_OVFL), ``tid`` (0/1/2),
    ``wg`` (number of workgroup-id SGPRs, 1..3).
    """
    text = ['.amdgcn_target "amdgcn-amd-amdhsa--gfx950"', ".amdhsa_code_object_version 6"]
    meta = []
    for name, snip in snippets.items():
        opts = snip if isinstance(snip, dict) else {"body": snip}
        lds, kernarg = opts.get("lds", 0), opts.get("kernarg", 16)
        wg = opts.get("wg", 1)
        text += [".text", f".globl {name}", ".p2align 8", f".type {name},@function",
                 f"{name}:", opts["body"], "  s_endpgm"]
        text.append(_DESCRIPTOR.format(name=name, lds=lds, kernarg=kernarg,
                                       denorm=opts.get("denorm", 3), ovfl=opts.get("ovfl", 0),
                                       wgy=int(wg >= 2), wgz=int(wg >= 3), tid=opts.get("tid", 0)))
        args = "".join(f"      - {{.name: a{i}, .offset: {8 * i}, .size: 8, .value_kind: "
                       "global_buffer, .address_space: global}\n" for i in range(kernarg // 8))
        meta.append(_META_KERNEL.format(name=name, lds=lds, kernarg=kernarg, args=args or "      []\n"))
    text += [".amdgpu_metadata", "---", "amdhsa.version: [1, 2]",
             "amdhsa.target: amdgcn-amd-amdhsa--gfx950", "amdhsa.kernels:", *meta, "...",
             ".end_amdgpu_metadata", ""]
    return "\n".join(text)


def build(snippets: dict) -> LoadedCode:
    """Assemble (once per distinct source) and load."""
    src = source(snippets)
    key = hashlib.sha256(src.encode()).hexdigest()
    if key not in _CACHE:
        tc = toolchain()
        with tempfile.TemporaryDirectory() as d:
            out = Path(d) / "snippets.hsaco"
            tc.assemble(src, out)
            _CACHE[key] = LoadedCode(CodeObject(out.read_bytes()))
    return _CACHE[key]


def run(code: LoadedCode, name: str, setup=None, waves: int = 1, lds: int = 0,
        mode: int = 0x2F0, machine: Machine | None = None, **config):
    """Run snippet ``name``; returns its wave (one wave) or the workgroup."""
    m = machine or Machine(config=Config(**config))
    kernel = code.co.kernel(name)
    wg = m.run_snippet(code, waves=waves, lds_size=lds, setup=setup, mode=mode,
                       entry=code.entry(kernel))
    return wg.waves[0] if waves == 1 else wg


def f32(x) -> np.ndarray:
    return np.asarray(x, np.float32).view(np.uint32)


def as_f32(u) -> np.ndarray:
    return np.asarray(u, np.uint32).view(np.float32)
