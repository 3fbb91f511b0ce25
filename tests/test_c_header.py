"""zyfa_kernels.h: generated from the manifest alone, valid C99/C11/C++, struct layouts equal to
the manifest's (checked by a compiled program, not by reading the text), grid functions equal to
the runtime's evaluation, deterministic; and the C example compiles (CUDA, HIP with stubs)."""

import copy
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from generator.c_header import HeaderError, write_header
from zyfa_runtime import __version__
from build import prepass_entry, split_tail_entry
from zyfa_runtime.catalogue import (PERSISTENT_COUNTER_BYTES, SHORT_KEYS, F16_KEYS, SPLIT_TAIL_DRAIN_BLOCKS, SPLIT_TAIL_SWITCH_BLOCKS,
                                    TOOLKIT, all_variants, eval_grid, grid_rule, has_vt_prepass, kernarg_size, kernargs, tensor_maps, tiles_rule,
                                    vt_columns)
from zyfa_runtime.plan import tail_plan

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "c"
CC = shutil.which("gcc") or shutil.which("cc")
CXX = shutil.which("g++") or shutil.which("c++")
needs_cc = pytest.mark.skipif(CC is None or CXX is None, reason="no gcc/g++ (C and C++ compilers) here")


def catalogue_manifest() -> dict:
    """The manifest build.py writes, less what only compiling tells (digests, registers)."""
    kernels = []
    for v in all_variants():
        args = kernargs(v)
        kernels.append({
            "name": v.name, "variant": v.to_json(), "built": True, "file": v.filename,
            "sha256": "0" * 64, "source_hash": "0" * 64, "compiler": "none", "symbol": v.symbol,
            "block_size": v.tile.threads,
            "tile": {"block_m": v.tile.block_m, "block_n": v.tile.block_n},
            "dynamic_smem": v.tile.dynamic_smem, "shared_bytes": v.tile.dynamic_smem,
            "kernarg_size": kernarg_size(args), "kernargs": [a.to_json() for a in args],
            "grid": grid_rule(v), "registers": {}, "scratch_bytes": 0,
            **({"prepass": prepass_entry(v)} if has_vt_prepass(v) else {}),
            **({"tensor_maps": tensor_maps(v)} if tensor_maps(v) else {}),
            **({"persistent": {"tiles": tiles_rule(v), "counter_bytes": PERSISTENT_COUNTER_BYTES}}
               if v.tile.persistent else {}),
            **({"split_tail": split_tail_entry(v)} if v.tile.split_tail else {}),
            **({"short": {"max_seqlen_k": SHORT_KEYS}} if v.short else {}),
            **({"f16": {"max_seqlen_k": F16_KEYS}} if v.f16 else {}),
        })
    return {"format": 1, "package_version": __version__, "toolkits": dict(TOOLKIT),
            "compilers": {"sm_90a": {"name": "nvcc", "version": "V13.0 \"quoted\" \\ back"}},
            "kernels": kernels}


def gappy_manifest() -> dict:
    """Gaps between arguments and at the tail, literal and nested grid terms, one unbuilt."""
    args = [("x", "ptr", 0, 8), ("n", "i32", 8, 4), ("s", "i64", 16, 8), ("m", "i32", 28, 4),
            ("f", "f32", 32, 4), ("t", "i32", 36, 4)]
    e = {"name": "gappy", "built": True, "file": "gappy.cubin", "sha256": "ab" * 32,
         "symbol": "zyfa_gappy", "block_size": 64, "tile": {"block_m": 16, "block_n": 16},
         "dynamic_smem": 0, "shared_bytes": 1024, "kernarg_size": 56,
         "variant": {"arch": "sm_90a", "dtype": "bf16", "d_qk": 64, "d_v": 64, "causal": True},
         "kernargs": [{"name": n, "type": t, "offset": o, "size": s} for n, t, o, s in args],
         "grid": {"x": {"cdiv": [{"cdiv": ["s", 4]}, 2]}, "y": 3, "z": "n"}}
    return {"format": 1, "package_version": "9.9.9", "toolkits": {"sm_90a": "CUDA 13.0"},
            "compilers": {}, "kernels": [e, {"name": "later", "built": False, "reason": "x"}]}


def prebuilt_manifest() -> dict:
    import json
    path = ROOT / "prebuilt" / "manifest.json"
    if not path.exists():
        pytest.skip("no prebuilt/manifest.json here (run build.py)")
    return json.loads(path.read_text())


MANIFESTS = {"catalogue": catalogue_manifest, "gappy": gappy_manifest, "prebuilt": prebuilt_manifest}


def run(cmd, **kw):
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))}\n{p.stdout}\n{p.stderr}"
    return p


def header_dir(tmp_path: Path, manifest: dict) -> Path:
    d = tmp_path / "include"
    d.mkdir(exist_ok=True)
    (d / "zyfa_kernels.h").write_text(write_header(manifest))
    return d


def layout_program(manifest: dict, header: str, values: dict) -> str:
    """A C program printing offsetof/sizeof of every struct member (padding members too) and
    the grid for the given argument values, for the test to compare with the manifest."""
    lines = ["#include <stdio.h>", "#include <string.h>", '#include "zyfa_kernels.h"', "int main(void) {"]
    for e in manifest["kernels"]:
        if not e["built"]:
            continue
        n, t = e["name"], f"zyfa_{e['name']}_args"
        lines.append(f'  printf("size {n} %zu\\n", sizeof({t}));')
        for f in [a["name"] for a in e["kernargs"]] + [p for p, _ in pad_fields(header, n)]:
            lines.append(f'  printf("field {n} {f} %zu %zu\\n", offsetof({t}, {f}), '
                         f"sizeof((({t} *)0)->{f}));")
        lines.append("  {")
        lines.append(f"    {t} a; unsigned int gx, gy, gz;")
        lines.append("    memset(&a, 0, sizeof a);")
        for arg in e["kernargs"]:
            if arg["type"] in ("i32", "i64"):
                lines.append(f"    a.{arg['name']} = {values[arg['name']]};")
        if "persistent" in e:   # the tiles into the struct, then the grid for a device of SMS SMs
            lines.append(f'    if (zyfa_{n}_tiles(&a) != 0) printf("toomany {n}\\n");')
            lines.append(f'    printf("tiles {n} %d %d %d %d\\n", (int)a.tiles_x, (int)a.tiles_y, (int)a.tiles_z, '
                         f"(int)a.tile_count);")
            lines.append(f"    zyfa_{n}_grid(&a, {SMS}u, &gx, &gy, &gz);")
        elif "split_tail" in e:   # the tiles and the tail's plan for a device of SMS SMs, dense and packed
            for dependent in (1, 0):   # a shape whose last wave is cut (TAIL_CUT), on a copy of the struct
                lines.append("    {")
                lines.append(f"      {t} c = a;")
                lines.append("      " + " ".join(f"c.{k} = {x};" for k, x in TAIL_CUT.items()))
                lines.append(f"      zyfa_{n}_tail(&c, {SMS}u, 0, {dependent});")
                lines.append(f'      printf("tail {n} {2 + dependent} %d %d %d %d %d %d %d %d\\n", (int)c.tiles_x, '
                             f"(int)c.tiles_y, (int)c.tiles_z, (int)c.tile_count, (int)c.tail_first, (int)c.tail_ctas, "
                             f"(int)c.tail_gap, (int)c.tail_ramp);")
                lines.append("    }")
            for packed in (1, 0):
                lines.append(f'    if (zyfa_{n}_tail(&a, {SMS}u, {packed}, 1) != 0) printf("toomany {n}\\n");')
                lines.append(f'    printf("tail {n} {packed} %d %d %d %d %d %d %d %d\\n", (int)a.tiles_x, (int)a.tiles_y, '
                             f"(int)a.tiles_z, (int)a.tile_count, (int)a.tail_first, (int)a.tail_ctas, (int)a.tail_gap, "
                             f"(int)a.tail_ramp);")
            lines.append(f"    zyfa_{n}_tail_grid(&a, &gx, &gy, &gz);")
            lines.append(f'    printf("tailgrid {n} %u %u %u\\n", gx, gy, gz);')
            lines.append(f"    zyfa_{n}_grid(&a, &gx, &gy, &gz);")
        else:
            lines.append(f"    zyfa_{n}_grid(&a, &gx, &gy, &gz);")
        lines.append(f'    printf("grid {n} %u %u %u\\n", gx, gy, gz);')
        if "prepass" in e:
            lines.append(f"    zyfa_{n}_prepass_grid(&a, &gx, &gy, &gz);")
            lines.append(f'    printf("pregrid {n} %u %u %u\\n", gx, gy, gz);')
            for batch, sk, total in VT_CASES:
                lines.append(f'    printf("vtcols {n} {batch} {sk} {total} %lld\\n", '
                             f"(long long)zyfa_{n}_vt_columns({batch}, {sk}, {total}));")
        lines.append("  }")
    lines += ["  return 0;", "}"]
    return "\n".join(lines) + "\n"


#: The tail plan's arguments, in the order the test program prints them.
PLAN_KEYS = ("tail_first", "tail_ctas", "tail_gap", "tail_ramp")

#: The SM count the persistent kernels' grid functions are given (fewer than some problems' tiles).
SMS = 37

#: A dense shape whose last wave a balanced-tail kernel cuts on SMS SMs: 192 tiles, 7 past the
#: last whole wave, 64 key blocks each, 13 a CTA once cut.
TAIL_CUT = {"batch": 1, "hq": 3, "seqlen_q": 8192, "seqlen_k": 8192}

#: (batch, seqlen_k, total_k or -1 for a dense batch) for the V^T workspace rule.
VT_CASES = ((1, 1, -1), (3, 128, -1), (2, 129, -1), (4, 300, 777), (5, 0, 0), (1, 5000, 5000))


def pad_fields(header: str, name: str) -> list[tuple[str, int]]:
    body = header.split(f"struct zyfa_{name}_args {{\n")[1].split("};")[0]
    return [(m.group(1), int(m.group(2))) for m in re.finditer(r"uint8_t (pad_\d+)\[(\d+)\];", body)]


def arg_values(manifest: dict, sign: int) -> dict:
    names = sorted({a["name"] for e in manifest["kernels"] if e["built"] for a in e["kernargs"]})
    return {n: sign * (100 + 37 * i) for i, n in enumerate(names)}


# --------------------------------------------------------------------------------------------

@needs_cc
@pytest.mark.parametrize("which", sorted(MANIFESTS))
def test_header_compiles_as_c_and_cxx(tmp_path, which):
    inc = header_dir(tmp_path, MANIFESTS[which]())
    c = tmp_path / "t.c"
    c.write_text('#include "zyfa_kernels.h"\n#include "zyfa_kernels.h"\nint main(void) { return 0; }\n')
    cpp = tmp_path / "t.cpp"
    cpp.write_text(c.read_text())
    for std in ("c99", "c11"):
        run([CC, f"-std={std}", "-pedantic", "-Wall", "-Wextra", "-Werror", "-I", inc, "-c", c,
             "-o", tmp_path / f"{std}.o"])
    for std in ("c++11", "c++17"):
        run([CXX, f"-std={std}", "-pedantic", "-Wall", "-Wextra", "-Werror", "-I", inc, "-c", cpp,
             "-o", tmp_path / f"{std}.o"])


@needs_cc
@pytest.mark.parametrize("which", sorted(MANIFESTS))
def test_struct_layouts_and_grids_equal_the_manifest(tmp_path, which):
    m = MANIFESTS[which]()
    inc = header_dir(tmp_path, m)
    header = (inc / "zyfa_kernels.h").read_text()
    for sign in (1, -1):   # negative sizes must give empty grids, as in the runtime
        values = arg_values(m, sign)
        src = tmp_path / "layout.c"
        src.write_text(layout_program(m, header, values))
        outputs = []
        for compiler, std, lang in ((CC, "c11", "c"), (CXX, "c++17", "c++")):
            exe = tmp_path / f"layout_{lang}"
            run([compiler, "-x", lang, f"-std={std}", "-Wall", "-Werror", "-I", inc, src, "-o", exe])
            outputs.append(run([exe]).stdout)
        assert outputs[0] == outputs[1]   # C and C++ agree
        got_fields, got_size, got_grid, got_pregrid, got_vt, got_tiles = {}, {}, {}, {}, {}, {}
        got_tail = {}
        for line in outputs[0].splitlines():
            kind, name, *rest = line.split()
            if kind == "size":
                got_size[name] = int(rest[0])
            elif kind == "field":
                got_fields.setdefault(name, []).append((rest[0], int(rest[1]), int(rest[2])))
            elif kind == "vtcols":
                got_vt.setdefault(name, []).append(int(rest[3]))
            elif kind == "pregrid":
                got_pregrid[name] = tuple(int(x) for x in rest)
            elif kind == "tiles":
                got_tiles[name] = tuple(int(x) for x in rest)
            elif kind == "tailgrid":
                got_tail[name, "grid"] = tuple(int(x) for x in rest)
            elif kind == "tail":
                got_tail[name, int(rest[0])] = tuple(int(x) for x in rest[1:])
            else:
                got_grid[name] = tuple(int(x) for x in rest)
        built = [e for e in m["kernels"] if e["built"]]
        assert set(got_size) == {e["name"] for e in built}
        for e in built:
            n = e["name"]
            assert got_size[n] == e["kernarg_size"], n
            args = [(a["name"], a["offset"], a["size"]) for a in e["kernargs"]]
            assert got_fields[n][:len(args)] == args, n
            # the padding members fill exactly the bytes the manifest leaves between and after
            # the arguments, so the struct is the manifest's buffer byte for byte
            holes, pos = [], 0
            for _, off, size in sorted(args, key=lambda a: a[1]):
                if off > pos:
                    holes.append((pos, off - pos))
                pos = off + size
            if e["kernarg_size"] > pos:
                holes.append((pos, e["kernarg_size"] - pos))
            assert [(off, size) for _, off, size in got_fields[n][len(args):]] == holes, n
            if "persistent" in e:   # the tiles and their count, then one CTA an SM or a tile
                tiles = eval_grid(e["persistent"]["tiles"], values)
                count = tiles[0] * tiles[1] * tiles[2]
                assert got_tiles[n] == (*tiles, count), n
                want = eval_grid(e["grid"], {**values, "tile_count": count, "sm_count": SMS})
                assert want == (min(count, SMS), 1, 1)
            elif "split_tail" in e:   # the tiles and the tail's plan are the runtime's (plan.tail_plan)
                tiles = eval_grid(e["split_tail"]["tiles"], values)
                count = tiles[0] * tiles[1] * tiles[2]
                tile_values = {**values, "tile_count": count}
                for packed in (0, 1):
                    plan = tail_plan(e, tile_values, SMS, bool(packed))
                    assert got_tail[n, packed] == (*tiles, count, *(plan[k] for k in PLAN_KEYS)), n
                planned = {**values, **tail_plan(e, tile_values, SMS, False)}
                assert got_tail[n, "grid"] == eval_grid(e["split_tail"]["grid"], planned), n
                want = eval_grid(e["grid"], planned)
                cut = {**values, **TAIL_CUT}
                tiles = eval_grid(e["split_tail"]["tiles"], cut)
                count = tiles[0] * tiles[1] * tiles[2]
                for dependent in (1, 0):
                    plan = tail_plan(e, {**cut, "tile_count": count}, SMS, False, dependent=bool(dependent))
                    assert plan == {"tail_first": 185, "tail_ctas": 37, "tail_gap": SPLIT_TAIL_SWITCH_BLOCKS,
                                    "tail_ramp": SPLIT_TAIL_DRAIN_BLOCKS if dependent else 0}
                    assert got_tail[n, 2 + dependent] == (*tiles, count, *(plan[k] for k in PLAN_KEYS)), n
            else:
                assert n not in got_tiles
                want = eval_grid(e["grid"], values)
            assert got_grid[n] == want, n
            if "prepass" in e:   # the pre-pass's grid and workspace rule, as the runtime's
                assert got_pregrid[n] == eval_grid(e["prepass"]["grid"], values), n
                assert got_vt[n] == [vt_columns(b, sk, None if t < 0 else t) for b, sk, t in VT_CASES], n
            else:
                assert n not in got_pregrid and n not in got_vt
        if which == "gappy":
            assert pad_fields(header, "gappy") == [("pad_0", 4), ("pad_1", 4), ("pad_2", 16)]


@needs_cc
def test_persistent_tiles_refuse_more_than_the_kernel_counts(tmp_path):
    """zyfa_<name>_tiles fills the tile fields from the manifest's rule and returns 0, or -1 and
    leaves them where the tiles overflow the kernel's 32-bit count (as the runtime refuses)."""
    m = catalogue_manifest()
    inc = header_dir(tmp_path, m)
    persistent = [e for e in m["kernels"] if "persistent" in e and not e["variant"]["causal"]]
    assert {e["variant"]["dtype"] for e in persistent} == {"bf16", "fp8_e4m3"}
    for e in persistent:
        _check_tiles(tmp_path, inc, e)


def _check_tiles(tmp_path, inc, e):
    n = e["name"]
    src = tmp_path / f"tiles_{n}.c"
    src.write_text("\n".join([
        "#include <stdio.h>", "#include <string.h>", '#include "zyfa_kernels.h"', "int main(void) {",
        f"  zyfa_{n}_args a; memset(&a, 0, sizeof a);",
        "  int r;",
        "  a.seqlen_q = 1000; a.hq = 8; a.batch = 2;",
        f"  r = zyfa_{n}_tiles(&a);",
        '  printf("%d %d %d %d %d\\n", r, a.tiles_x, a.tiles_y, a.tiles_z, a.tile_count);',
        "  a.seqlen_q = 1 << 30; a.hq = 64; a.batch = 64;",
        f"  r = zyfa_{n}_tiles(&a);",
        '  printf("%d %d %d %d %d\\n", r, a.tiles_x, a.tiles_y, a.tiles_z, a.tile_count);',
        "  return 0;", "}", ""]))
    exe = tmp_path / f"tiles_{n}"
    run([CC, "-std=c11", "-Wall", "-Werror", "-I", inc, src, "-o", exe])
    bm = e["tile"]["block_m"]
    fits, over = run([exe]).stdout.splitlines()
    assert fits.split() == ["0", str(-(-1000 // bm)), "8", "2", str(-(-1000 // bm) * 16)]
    assert over.split() == ["-1", str(-(-1000 // bm)), "8", "2", str(-(-1000 // bm) * 16)]


def test_header_is_deterministic_and_independent_of_key_order():
    m = catalogue_manifest()
    first = write_header(m)
    assert write_header(copy.deepcopy(m)) == first

    def reverse_keys(x):
        if isinstance(x, dict):
            return {k: reverse_keys(x[k]) for k in reversed(list(x))}
        if isinstance(x, list):
            return [reverse_keys(i) for i in x]
        return x
    assert write_header(reverse_keys(m)) == first
    assert first.endswith("\n") and "\r" not in first


def test_header_carries_the_manifest_values():
    m = catalogue_manifest()
    h = write_header(m)
    assert f'#define ZYFA_PACKAGE_VERSION "{__version__}"' in h
    assert '#define ZYFA_TOOLKIT_SM_90A "CUDA 13.0"' in h and '#define ZYFA_TOOLKIT_GFX950 "ROCm 7.2.3"' in h
    assert '#define ZYFA_COMPILER_VERSION_SM_90A "V13.0 \\"quoted\\" \\\\ back"' in h
    built = [e for e in m["kernels"] if e["built"]]
    assert f"#define ZYFA_NUM_KERNELS {len(built)}" in h
    for e in built:
        up = e["name"].upper()
        for key, val in (("SYMBOL", f'"{e["symbol"]}"'), ("FILE", f'"{e["file"]}"'),
                         ("BLOCK_SIZE", e["block_size"]), ("DYNAMIC_SMEM", e["dynamic_smem"]),
                         ("SHARED_BYTES", e["shared_bytes"]), ("KERNARG_SIZE", e["kernarg_size"]),
                         ("PERSISTENT", int("persistent" in e)),
                         ("SHORT_MAX_SEQLEN_K", e["short"]["max_seqlen_k"] if "short" in e else 0),
                         ("F16_MAX_SEQLEN_K", e["f16"]["max_seqlen_k"] if "f16" in e else 0)):
            assert re.search(rf"^#define ZYFA_{up}_{key} +{re.escape(str(val))}$", h, re.M), (e["name"], key)
    for e in m["kernels"]:
        if not e["built"]:
            assert f"struct zyfa_{e['name']}_args" not in h
    # the tensor maps a caller encodes (the C example expands the X-macro): the manifest's
    for e in built:
        var, maps = e["variant"], e.get("tensor_maps", {})
        def elem(t):   # O is bf16 whatever the inputs
            return 1 if var["dtype"] == "fp8_e4m3" and t != "o" else 2
        want = " ".join(f"X({arg}, {t}, {elem(t) * var['d_v' if t in 'vo' else 'd_qk']}, {elem(t)}, "
                        f"{', '.join(map(str, sp['box']))}, {sp['swizzle_bytes']})"
                        for arg, sp in sorted(maps.items()) for t in [sp["tensor"]])
        line = f"#define ZYFA_{e['name'].upper()}_TENSOR_MAPS(X)" + (f" {want}" if want else "")
        assert re.search(rf"^{re.escape(line)}$", h, re.M), line
        assert bool(maps) == (var["arch"] == "sm_90a")


def test_header_states_what_each_kernel_takes_of_cu_seqlens_and_descales():
    """The contract follows the arguments: kernels with total_q/total_k clamp packed
    sequences, the others need valid values; FP8 kernels with descale strides take (B, Hkv)
    descales, the others one value each."""
    from zyfa_runtime.catalogue import clamps_cu_seqlens, per_head_descales
    h = write_header(catalogue_manifest())
    for v in all_variants():
        names = {a.name for a in kernargs(v)}
        assert ("total_q" in names) == ("total_k" in names) == clamps_cu_seqlens(v)
        assert ("descale_q_stride_b" in names) == per_head_descales(v) == (v.dtype == "fp8_e4m3")
        clamps = f"/* {v.name}: packed (cu_seqlens_q/_k non-null, int32[batch + 1]): set total_q and total_k"
        valid = f"/* {v.name}: packed (cu_seqlens_q/_k non-null, int32[batch + 1]): the values must be a valid"
        assert (clamps in h, valid in h) == (clamps_cu_seqlens(v), not clamps_cu_seqlens(v)), v.name
        per_head = f"/* {v.name}: descale_q/_k/_v point to fp32 dequantisation factors, one a (sequence b,"
        one = f"/* {v.name}: descale_q/_k/_v each point to one fp32 dequantisation factor"
        assert (per_head in h, one in h) == (per_head_descales(v), v.dtype == "fp8_e4m3" and not per_head_descales(v))


@pytest.mark.parametrize("change, match", [
    (lambda e: e["kernargs"][1].update(offset=4), "overlaps|aligned"),
    (lambda e: e["kernargs"][2].update(offset=12), "aligned"),
    (lambda e: e["kernargs"][0].update(type="u8"), "no C type"),
    (lambda e: e.update(kernarg_size=52), "multiple"),
    (lambda e: e.update(kernarg_size=32), "smaller"),
    (lambda e: e["kernargs"][0].update(name="x y"), "identifier"),
    (lambda e: e["grid"].update(y="nope"), "names no kernel argument"),
])
def test_layouts_c_cannot_express_are_refused(change, match):
    m = gappy_manifest()
    change(m["kernels"][0])
    with pytest.raises(HeaderError, match=match):
        write_header(m)


def test_prebuilt_header_is_current():
    m = prebuilt_manifest()
    path = ROOT / "prebuilt" / "zyfa_kernels.h"
    if not path.exists():
        pytest.skip("prebuilt/ predates the C header: run build.py")
    assert path.read_text() == write_header(m)


# ---- the example ---------------------------------------------------------------------------

def cuda_include() -> Path | None:
    cands = [os.environ.get("CUDA_PATH", ""), os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"]
    nvcc = shutil.which("nvcc")
    if nvcc:
        cands.append(str(Path(nvcc).resolve().parent.parent))
    for c in cands:
        if c and (Path(c) / "include" / "cuda.h").exists():
            return Path(c) / "include"
    return None


BF16 = [v for v in all_variants() if v.dtype == "bf16"]


def example_flags(name: str) -> list[str]:
    return [f"-DZYFA_EXAMPLE_KERNEL={name}", f"-DZYFA_EXAMPLE_KERNEL_UP={name.upper()}"]


@needs_cc
def test_example_hip_stub_compiles_and_stops_at_the_driver(tmp_path):
    inc = header_dir(tmp_path, catalogue_manifest())
    exe = tmp_path / "ex_hip_stub"
    run([CC, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-DZYFA_HIP", "-DZYFA_STUB_DRIVER",
         "-I", inc, EXAMPLE / "zyfa_example.c", "-o", exe, "-lm"])
    co = tmp_path / "fake.hsaco"
    co.write_bytes(b"\x7fELF not really")
    p = subprocess.run([exe, co, "1", "70", "90", "2", "1"], capture_output=True, text=True)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "zyfa_fwd_gfx950_bf16_d128x128_full" in p.stdout and "hipInit" in p.stderr
    assert "stub driver" in p.stderr
    for v in BF16:   # every bf16 gfx950 kernel of the header plugs into the example
        if v.arch == "gfx950":
            run([CC, "-std=c11", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", "-DZYFA_HIP",
                 "-DZYFA_STUB_DRIVER", *example_flags(v.name), "-I", inc, EXAMPLE / "zyfa_example.c"])


@needs_cc
def test_example_makefile_hip_stub_target(tmp_path):
    if shutil.which("make") is None:
        pytest.skip("no make here")
    inc = header_dir(tmp_path, catalogue_manifest())
    work = tmp_path / "ex"
    work.mkdir()
    for f in ("Makefile", "zyfa_example.c"):
        shutil.copy(EXAMPLE / f, work / f)
    run(["make", "-C", work, "hip-stub", f"PREBUILT={inc}", f"CC={CC}"])
    assert (work / "zyfa_example_hip_stub").exists()


@needs_cc
def test_example_cuda_compiles_and_links(tmp_path):
    cuda_inc = cuda_include()
    if cuda_inc is None:
        pytest.skip("no CUDA headers (cuda.h) here: set CUDA_PATH")
    inc = header_dir(tmp_path, catalogue_manifest())
    obj = tmp_path / "ex_cuda.o"
    run([CC, "-std=c11", "-O1", "-Wall", "-Wextra", "-Werror", "-I", inc, "-I", cuda_inc, "-c",
         EXAMPLE / "zyfa_example.c", "-o", obj])
    for v in BF16:
        if v.arch == "sm_90a":
            run([CC, "-std=c11", "-fsyntax-only", "-Wall", "-Wextra", "-Werror", *example_flags(v.name),
                 "-I", inc, "-I", cuda_inc, EXAMPLE / "zyfa_example.c"])
    # Link against a stand-in libcuda.so.1 defining exactly the driver symbols the object uses
    # (every one fails): checks the program links with the real entry-point names (_v2 etc.).
    nm = shutil.which("nm")
    if nm is None:
        pytest.skip("no nm here to list the object's driver symbols")
    syms = sorted({s for s in run([nm, "-u", obj]).stdout.split() if s.startswith("cu")})
    assert {"cuInit", "cuModuleLoadData", "cuLaunchKernel", "cuFuncSetAttribute",
            "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent", "cuMemAlloc_v2", "cuMemcpyHtoD_v2"} <= set(syms)
    stub = tmp_path / "libcuda_stub.c"
    stub.write_text("".join(f"int {s}(void) {{ return 999; }}\n" for s in syms))
    lib = tmp_path / "libcuda.so.1"
    run([CC, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", stub, "-o", lib])
    exe = tmp_path / "ex_cuda"
    run([CC, obj, lib, "-lm", "-o", exe])
    co = tmp_path / "fake.cubin"
    co.write_bytes(b"\x7fELF not really")
    env = dict(os.environ, LD_LIBRARY_PATH=str(tmp_path))
    p = subprocess.run([exe, co], capture_output=True, text=True, env=env)
    assert p.returncode == 2 and "cuInit(0) failed" in p.stderr, p.stdout + p.stderr
