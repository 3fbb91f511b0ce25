"""AMD AITER's gfx950 FAv3 forward kernels (silicon-proven, written by AMD) on the emulator.

The ``peer`` tests need the ``amd-aiter`` wheel: pip downloads it from PyPI on first use
into the user cache (or ``$ZYFA_PEERS_DIR``), pinned by sha256.  Without network and
cache they FAIL -- they are never skipped.  ``test_ci_causal_d128`` is the quick one (one
workgroup, hazard checker attached); every kernel runs in the ``slow`` sweep and in
``python bench/aiter_gfx950.py``.
"""

from __future__ import annotations

import importlib.util
import struct
import types
from pathlib import Path

import numpy as np
import pytest

from zyfa_emulator import CodeObject, CodeObjectFormatError, LoadedCode
from zyfa_emulator.peers import aiter_fav3 as aiter

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("aiter_gfx950_bench",
                                                  ROOT / "bench" / "aiter_gfx950.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def peer_dir():
    return aiter.fetch()            # raises (the test fails) when the wheel is unreachable


@pytest.fixture(scope="module")
def runner(peer_dir):
    return aiter.AiterFav3(directory=peer_dir)


# -- code objects: what AMD's carry, what is still refused --------------------------------

def _elf(flags, abiversion):
    return types.SimpleNamespace(flags=flags, abiversion=abiversion)


@pytest.mark.parametrize("flags,abi,target", [
    (0x54F, 4, "amdgcn-amd-amdhsa--gfx950"),                    # xnack any, sramecc any (V6)
    (0x34F, 3, "amdgcn-amd-amdhsa--gfx950:xnack+"),              # xnack on, sramecc unsupported
    (0xA4F, 2, "amdgcn-amd-amdhsa--gfx950:sramecc-:xnack-"),     # both off (V4)
    (0x14F, 1, "amdgcn-amd-amdhsa--gfx950:sramecc-:xnack+"),     # V3 single bits
])
def test_target_from_elf_flags_when_metadata_has_none(flags, abi, target):
    assert CodeObject._target(_elf(flags, abi), {}) == target


@pytest.mark.parametrize("target", ["amdgcn-amd-amdhsa--gfx942", "amdgcn-amd-amdhsa--gfx9500",
                                    "gfx950", "amdgcn-amd-amdhsa--gfx942:gfx950", 7])
def test_foreign_metadata_targets_are_refused(target):
    with pytest.raises(CodeObjectFormatError):
        CodeObject._target(_elf(0x54F, 4), {"amdhsa.target": target})


def test_metadata_target_with_features_is_accepted():
    t = "amdgcn-amd-amdhsa--gfx950:sramecc+:xnack-"
    assert CodeObject._target(_elf(0x54F, 4), {"amdhsa.target": t}) == t


@pytest.mark.peer
@pytest.mark.parametrize("kernel", aiter.KERNELS)
def test_amds_code_objects_load(peer_dir, kernel):
    image = aiter.code_object_path(kernel, peer_dir).read_bytes()
    assert struct.unpack_from("<I", image, 48)[0] == 0x54F           # e_flags
    co = CodeObject(image)
    assert "amdhsa.target" not in co.metadata
    assert co.target == "amdgcn-amd-amdhsa--gfx950"
    (k,) = co.kernels.values()
    assert k.name == aiter.symbol(kernel)
    assert k.group_segment_fixed_size == 160 * 1024
    block = aiter.TILE[(192, 128) if "hd192" in kernel else (128, 128)][1]
    assert k.metadata["reqd_workgroup_size"] == [block, 1, 1]
    # every instruction of the object has semantics (v_add_i32 / v_sub_i32 included)
    assert [i.text() for i in LoadedCode(co).check_all()] == []


@pytest.mark.peer
def test_other_architectures_are_still_refused(peer_dir):
    image = bytearray(aiter.code_object_path("fwd_hd128_bf16", peer_dir).read_bytes())
    struct.pack_into("<I", image, 48, 0x54C)                           # EF_AMDGPU_MACH gfx942
    with pytest.raises(CodeObjectFormatError, match="not gfx950"):
        CodeObject(bytes(image))


# -- the argument block, parsed from AITER's header ---------------------------------------

def test_parse_struct_packed_and_padding():
    common = "struct p2 { unsigned int _p0; unsigned int _p1; };\n" \
             "struct p3 { unsigned int _p0; unsigned int _p1; unsigned int _p2; };"
    header = """// a comment { with braces }
    struct __attribute__((packed)) args {
        void* ptr_o;   p2 _p0;
        float scalar;  p3 _p1;
        const void* ptr_q;
        unsigned int n; /* trailing */
    };
    struct loose { unsigned int a; void* b; };"""
    f = aiter.parse_struct("args", header, common)
    assert [(x.name, x.kind, x.offset, x.size) for x in f] == [
        ("ptr_o", "ptr", 0, 8), ("_p0", "pad", 8, 8), ("scalar", "f32", 16, 4),
        ("_p1", "pad", 20, 12), ("ptr_q", "ptr", 32, 8), ("n", "u32", 40, 4)]
    loose = aiter.parse_struct("loose", header)
    assert [(x.offset, x.size) for x in loose] == [(0, 4), (8, 8)]   # natural alignment
    with pytest.raises(ValueError, match="not defined"):
        aiter.parse_struct("missing", header)


def _info(args, size=32, name="k"):
    return types.SimpleNamespace(kernarg_segment_size=size, args=tuple(args), name=name)


def test_layout_check_and_pack():
    layout = aiter.ArgLayout((aiter.Field("p", "ptr", 0, 8), aiter.Field("_pad", "pad", 8, 8),
                              aiter.Field("x", "u32", 16, 4), aiter.Field("_q", "pad", 20, 12)),
                             32)
    ok = [{"name": "P", "offset": 0, "size": 8, "value_kind": "global_buffer"},
          {"name": "pad", "offset": 8, "size": 8, "value_kind": "by_value"},
          {"name": "X", "offset": 16, "size": 4, "value_kind": "by_value"}]
    layout.check(_info(ok))
    with pytest.raises(ValueError, match="expects"):
        layout.check(_info(ok, size=48))
    bad = [dict(ok[0]), ok[1], dict(ok[2], offset=20)]
    with pytest.raises(ValueError, match="disagrees"):
        layout.check(_info(bad))
    raw = layout.pack({"p": 0x1122334455667788, "x": 7})
    assert raw == struct.pack("<Q8xI12x", 0x1122334455667788, 7)
    with pytest.raises(ValueError, match="missing"):
        layout.pack({"p": 1})
    with pytest.raises(ValueError, match="32 bits"):
        layout.pack({"p": 1, "x": -1})


@pytest.mark.peer
def test_header_layout_matches_every_code_object(peer_dir, runner):
    layout = aiter.ArgLayout.from_headers(peer_dir)
    assert layout.size == 512
    names = [f.name for f in layout.values]
    assert names[:5] == ["ptr_o", "ptr_q", "ptr_k", "ptr_v", "ptr_lse"]
    assert {f.name: f.offset for f in layout.values}["ptr_kseq_padding"] == 496
    assert all(f.offset % 16 == 0 for f in layout.values)          # one 16-byte slot each
    for kernel in aiter.KERNELS:
        runner.function(kernel)                                     # loads and checks


@pytest.mark.peer
def test_fetch_reuses_the_verified_cache(peer_dir, monkeypatch):
    def no_download(dest):
        raise AssertionError("the cache should have been re-used")
    monkeypatch.setattr(aiter, "_download", no_download)
    assert aiter.fetch() == peer_dir
    stamp = (peer_dir / "SOURCE.json").read_text()
    assert aiter.WHEEL_SHA256 in stamp


def test_fetch_rejects_a_wheel_with_another_hash(tmp_path, monkeypatch):
    fake = tmp_path / aiter.WHEEL
    fake.write_bytes(b"PK\x05\x06" + b"\0" * 18)                   # an empty zip
    monkeypatch.setenv("ZYFA_PEERS_DIR", str(tmp_path / "peers"))
    monkeypatch.setenv("ZYFA_AITER_WHEEL", str(fake))
    with pytest.raises(aiter.PeerUnavailable, match="sha256"):
        aiter.fetch()
    assert not aiter.cache_dir().exists()                             # nothing half-written


# -- correctness against fp64 ------------------------------------------------------------

def _check(result):
    assert np.isfinite(result.o_error) and np.isfinite(result.lse_error)
    assert result.o_error <= aiter.O_BOUND, result
    assert result.lse_error <= aiter.LSE_BOUND, result
    # only the report-only rules may appear; any other rule would have raised
    assert set(result.launch.hazards) <= set(aiter.PEER_REPORT_ONLY)


@pytest.mark.peer
def test_ci_causal_d128(runner):
    """fwd_hd128_bf16_causal, Sq 256 / Sk 512 (bottom-right), hazard checker attached."""
    result = aiter.run_case(runner, _bench().CI_CASE)
    _check(result)
    assert result.launch.grid == (1, 1, 1) and result.launch.block == (512, 1, 1)


@pytest.mark.peer
@pytest.mark.slow
@pytest.mark.parametrize("case", _bench().CASES, ids=lambda c: f"{c.kernel}-{c.shape_text()}")
def test_every_kernel(runner, case):
    _check(aiter.run_case(runner, case))
