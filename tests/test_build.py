"""build.py: every kernel into prebuilt/, a manifest that is the single source of truth,
checked against what the compilers recorded, incremental and reproducible."""

import hashlib
import json
import re
from pathlib import Path

import pytest

import build
from generator import c_header, codeobject
from generator import sass_convergence as sc
from generator import wgmma_hazards as wh
from zyfa_runtime.__main__ import support_matrix
from zyfa_runtime.catalogue import TOOLKIT, Variant, all_aux, all_variants, features, grid_rule, kernargs

ROOT = Path(__file__).resolve().parent.parent


#: The builds here leave the serving kernels out (their compiles would take as long again as the
#: default run's budget has): test_the_serving_kernels_build_without_spills builds them.
SKIP = ["--skip", "_serving"]
PLAIN = [v for v in all_variants() if not v.serving]   # and the short-prompt and f16-math variants
#: The default run's clean build: the plain kernels of one head-dim pair (every compiler and the
#: FP8 generator run: nvcc, the HIP compiler, the assembler) and every auxiliary kernel.  The
#: full run's (``slow``) builds every plain kernel: a third of the default run's time.
SELECTION = ["--only", "_d64x64_,merge_attention_states,quantize_fp8"]
SELECTED = [v for v in PLAIN if "_d64x64_" in v.name]


def clean(tmp_path_factory, name, *only):
    out = tmp_path_factory.mktemp(name)
    assert build.main(["--out", str(out), "--jobs", "2", *SKIP, *only]) == 0
    return out


@pytest.fixture(scope="module")
def clean_build(tmp_path_factory):
    """A clean build of SELECTION."""
    return clean(tmp_path_factory, "selection", *SELECTION)


@pytest.fixture(scope="module")
def full_build(tmp_path_factory):
    """A clean build of every plain and auxiliary kernel."""
    return clean(tmp_path_factory, "full")


def manifest(d: Path) -> dict:
    return json.loads((d / "manifest.json").read_text())


def test_a_selective_clean_build_lists_every_kernel_and_builds_the_selection(clean_build):
    m = manifest(clean_build)
    kernels = {e["name"]: e for e in m["kernels"]}
    assert set(kernels) == {v.name for v in all_variants()}
    built = {n for n, e in kernels.items() if e["built"]}
    assert built == {v.name for v in SELECTED}
    assert {e["name"] for e in m["aux_kernels"] if e["built"]} == {a.name for a in all_aux()}
    assert len(SELECTED) == 8 and {v.arch for v in SELECTED} == {"sm_90a", "gfx950"}
    assert all(e["reason"] for n, e in kernels.items() if n not in built)


@pytest.mark.slow
def test_manifest_lists_every_variant_and_builds_them_all(full_build):
    m = manifest(full_build)
    assert m["package_version"] and m["toolkits"] == TOOLKIT
    assert set(m["compilers"]) == {"sm_90a", "gfx950"}
    assert all(c["name"] and c["version"] for c in m["compilers"].values())
    kernels = {e["name"]: e for e in m["kernels"]}
    assert set(kernels) == {v.name for v in all_variants()}
    built = {n for n, e in kernels.items() if e["built"]}
    assert built == {v.name for v in PLAIN}     # and the serving ones listed, unbuilt (--skip)
    # sm_90a: 16 plain, the 2 short-prompt and the 2 f16-math variants (catalogue.Variant.short, .f16)
    assert len([n for n in built if "sm_90a" in n]) == 20 and len([n for n in built if "gfx950" in n]) == 16
    assert len([n for n in built if n.endswith("_short")]) == 2 and len([n for n in built if n.endswith("_f16")]) == 2
    assert all("--skip" in kernels[v.name]["reason"] for v in all_variants() if v.serving)


@pytest.mark.parametrize("v", [pytest.param(v, id=v.name, marks=() if v in SELECTED else pytest.mark.slow)
                               for v in PLAIN])
def test_manifest_entry_agrees_with_its_code_object(request, v):
    out = request.getfixturevalue("clean_build" if v in SELECTED else "full_build")
    entry_agrees_with_its_code_object(out, v)


def entry_agrees_with_its_code_object(out: Path, v: Variant) -> dict:
    e = {x["name"]: x for x in manifest(out)["kernels"]}[v.name]
    image = (out / e["file"]).read_bytes()
    assert hashlib.sha256(image).hexdigest() == e["sha256"]
    assert e["symbol"] == v.symbol and e["grid"] == grid_rule(v)
    assert e["kernargs"] == [a.to_json() for a in kernargs(v)]
    assert e["block_size"] == v.tile.threads
    layout = [(a["offset"], a["size"]) for a in e["kernargs"]]
    if v.arch == "gfx950":
        meta = codeobject.amdgpu_kernels(image)[v.symbol]
        assert codeobject.amdgpu_target(image).endswith("gfx950")
        assert [(a["offset"], a["size"]) for a in meta["args"]][:len(layout)] == layout
        assert meta["kernarg_segment_size"] == e["kernarg_size"] >= layout[-1][0] + layout[-1][1]
        assert meta["group_segment_fixed_size"] == e["shared_bytes"] <= 160 * 1024
        assert meta["vgpr_count"] == e["registers"]["vgpr"] and meta["sgpr_count"] == e["registers"]["sgpr"]
        assert meta["private_segment_fixed_size"] == e["scratch_bytes"] == 0
        assert meta["wavefront_size"] == 64 and meta["max_flat_workgroup_size"] == e["block_size"]
    else:
        meta = codeobject.cubin_kernels(image)[v.symbol]
        assert [(p["offset"], p["size"]) for p in meta["params"]] == layout
        assert meta["registers"] == e["registers"]["reg"] <= 255
        assert e["shared_bytes"] == e["dynamic_smem"] + meta.get("shared_static", 0) <= 227 * 1024
    return e


@pytest.mark.slow
def test_the_serving_kernels_build_without_spills_in_the_plain_kernels_registers(tmp_path):
    """The serving variants (sm_90a with the window, sinks and KV caches compiled in, their
    softcap specialisations the softcap too) build, agree with their manifest entries and list
    their features, in the registers their plain kernels are launched with and no more local
    memory (none at BF16 a CTA a tile: ptxas spilled nothing; FP8 d64 full has its plain
    kernel's 8 bytes).  The persistent ones (BF16 d128) keep the scheduler's tile records in
    local memory as their plain kernels do (160-168 bytes), a few more with the window's work:
    none of it read or written in the block loop, where cuobjdump can show it."""
    assert build.main(["--out", str(tmp_path), "--jobs", "2", "--arch", "sm_90a", "--only", "fwd_"]) == 0
    tool = wh.cuobjdump()
    for v in all_variants():
        if v.serving:
            e = entry_agrees_with_its_code_object(tmp_path, v)
            plain = entry_agrees_with_its_code_object(tmp_path, Variant(v.arch, v.dtype, v.d_qk, v.d_v, v.causal))
            assert e["features"] == list(features(v)) and "features" not in plain
            assert ("softcap" in e["features"]) == v.softcap
            if v.tile.persistent:
                assert e["scratch_bytes"] <= plain["scratch_bytes"] + 64, v.name
                if tool:
                    for name, body in wh.functions(wh.sass(tmp_path / v.filename, tool)).items():
                        assert sc.local_memory(sc.block_loop(body)) == [], (v.name, name)
            else:
                assert e["scratch_bytes"] <= plain["scratch_bytes"] and (v.dtype != "bf16" or e["scratch_bytes"] == 0)
            assert e["registers"]["reg"] <= plain["registers"]["reg"], v.name


@pytest.mark.slow
def test_two_clean_builds_are_byte_identical(full_build, tmp_path):
    assert build.main(["--out", str(tmp_path), "--jobs", "1", *SKIP]) == 0
    files1 = sorted(p.name for p in full_build.iterdir())
    files2 = sorted(p.name for p in tmp_path.iterdir())
    assert files1 == files2
    for name in files1:
        assert (full_build / name).read_bytes() == (tmp_path / name).read_bytes(), name


def test_c_header_is_written_from_the_manifest(clean_build):
    header = (clean_build / "zyfa_kernels.h").read_text()
    assert header == c_header.write_header(manifest(clean_build))
    assert header.count("typedef struct zyfa_") == len(SELECTED) + len(all_aux())   # the built kernels only


def test_rebuild_is_incremental(clean_build, capsys):
    before = (clean_build / "manifest.json").read_bytes()
    assert build.main(["--out", str(clean_build), *SKIP, *SELECTION]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"0 built, {len(SELECTED) + len(all_aux())} cached", out)
    assert (clean_build / "manifest.json").read_bytes() == before


def test_selective_build_keeps_the_rest_listed(tmp_path, capsys):
    # --only matches substrings of the names (the serving variant's too), --skip leaves some out
    assert build.main(["--out", str(tmp_path), "--arch", "sm_90a", "--only", "bf16_d64x64_full", *SKIP]) == 0
    assert "[ 1/1]" in capsys.readouterr().out
    kernels = manifest(tmp_path)["kernels"]
    assert len(kernels) == len(all_variants()) == 68
    assert [e["name"] for e in kernels if e["built"]] == ["fwd_sm_90a_bf16_d64x64_full"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fwd_sm_90a_bf16_d64x64_full.cubin",
                                                         "manifest.json", "zyfa_kernels.h"]


def test_a_tampered_output_is_rebuilt(tmp_path):
    assert build.main(["--out", str(tmp_path), "--arch", "sm_90a", "--only", "fp8_e4m3_d64x64_full"]) == 0
    name = Variant("sm_90a", "fp8_e4m3", 64, 64, False).filename
    good = (tmp_path / name).read_bytes()
    (tmp_path / name).write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    assert build.main(["--out", str(tmp_path), "--arch", "sm_90a", "--only", "fp8_e4m3_d64x64_full"]) == 0
    assert (tmp_path / name).read_bytes() == good


@pytest.mark.slow
def test_readme_support_matrix_is_generated_from_the_manifest(full_build):
    text = (ROOT / "README.md").read_text()
    block = text.split("<!-- matrix:begin -->\n")[1].split("<!-- matrix:end -->")[0]
    assert block.strip() == support_matrix(manifest(full_build)).strip()
