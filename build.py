#!/usr/bin/env python3
"""Build every kernel of the catalogue into prebuilt/ and write prebuilt/manifest.json.

    catalogue -> emit source -> compile / assemble -> check the code object -> manifest

The manifest is the single source of truth the runtime loads from: per kernel its
variant, file, sha256, symbol, block size, shared memory, kernel-argument layout
(checked here against what the compiler recorded in the code object) and grid rule;
the auxiliary kernels (catalogue.AuxKernel: not attention) in ``aux_kernels``, each
with its ``kind`` in place of a variant.
Builds are incremental (a kernel is rebuilt only when its source or compiler
changed), parallel (--jobs), selectable (--arch, --only, --skip) and reproducible: two clean
builds produce byte-identical prebuilt/ (no timestamps, no temp paths).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import hashlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent
if __name__ == "__main__" and __spec__ is not None:
    # `python -m build` in this directory finds this file before the PyPA builder: hand over
    # to the real `build` package (the standard wheel flow, which in turn runs this file as
    # a script through the in-tree backend).
    import runpy
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT]
    sys.modules.pop("build", None)
    runpy.run_module("build", run_name="__main__", alter_sys=True)
    sys.exit(0)
sys.path.insert(0, str(ROOT))

from generator import c_header, codeobject, kernel_source, toolchain  # noqa: E402
from zyfa_runtime import __version__  # noqa: E402
from zyfa_runtime.cache import atomic_write  # noqa: E402
from zyfa_runtime.catalogue import (ARCHES, TOOLKIT, VT_BLOCK, VT_THREADS, AuxKernel, Variant,  # noqa: E402
                                    all_aux, all_variants,
                                    PERSISTENT_COUNTER_BYTES, SHORT_KEYS, F16_KEYS, SPLIT_TAIL_DRAIN_BLOCKS, SPLIT_TAIL_OVERHEAD_BLOCKS,
                                    SPLIT_TAIL_SWITCH_BLOCKS, grid_rule,
                                    dependent_launch, features, has_vt_prepass, iter_select, kernarg_size,
                                    split_tail_counter_bytes,
                                    split_tail_grid_rule, split_tail_slot_bytes, split_tail_symbol, tiles_rule,
                                    kernargs, tensor_maps, vt_prepass_grid_rule, vt_prepass_symbol)

MANIFEST_FORMAT = 1


class BuildError(RuntimeError):
    pass


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def inspect(v: Variant | AuxKernel, image: bytes) -> dict:
    """What the code object says about itself, checked against the catalogue."""
    expected = [(a.offset, a.size) for a in kernargs(v)]
    threads = v.tile.threads if isinstance(v, Variant) else v.spec.threads
    if v.vendor == "hip":
        meta = codeobject.amdgpu_kernels(image).get(v.symbol)
        if meta is None:
            raise BuildError(f"{v.name}: symbol {v.symbol} missing from the code object metadata")
        got = [(a["offset"], a["size"]) for a in meta["args"]][:len(expected)]
        hidden = meta["args"][len(expected):]
        if got != expected or any(not a["value_kind"].startswith("hidden_") for a in hidden):
            raise BuildError(f"{v.name}: kernarg layout {got} in the code object differs from the "
                             f"catalogue's {expected}")
        if meta["wavefront_size"] != 64 or meta["max_flat_workgroup_size"] != threads:
            raise BuildError(f"{v.name}: wavefront/workgroup size differ from the catalogue")
        return {"kernarg_size": meta["kernarg_segment_size"],
                "static_shared": meta["group_segment_fixed_size"],
                "registers": {"vgpr": meta["vgpr_count"], "sgpr": meta["sgpr_count"],
                              "agpr": meta.get("agpr_count", 0)},
                "scratch": meta["private_segment_fixed_size"]}
    kernels = codeobject.cubin_kernels(image)
    symbols = [v.symbol] if isinstance(v, AuxKernel) else (
        [v.symbol] + ([vt_prepass_symbol(v)] if has_vt_prepass(v) else [])
        + ([split_tail_symbol(v)] if v.tile.split_tail else []))
    for symbol in symbols:
        if symbol not in kernels:
            raise BuildError(f"{v.name}: symbol {symbol} missing from the cubin")
        got = [(p["offset"], p["size"]) for p in kernels[symbol]["params"]]
        if got != expected:
            raise BuildError(f"{v.name}: parameter layout {got} of {symbol} in the cubin differs "
                             f"from the catalogue's {expected}")
    meta = kernels[v.symbol]
    if meta["param_size"] != kernarg_size(kernargs(v)):
        # cuLaunchKernel refuses an argument buffer of another size (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)
        raise BuildError(f"{v.name}: the cubin's parameters take {meta['param_size']} bytes, the catalogue's "
                         f"argument buffer {kernarg_size(kernargs(v))}: end the argument list on 8 bytes")
    return {"kernarg_size": kernarg_size(kernargs(v)),
            "static_shared": meta.get("shared_static", 0),
            "registers": {"reg": meta["registers"]},
            "scratch": meta.get("local_bytes", 0)}


def entry_for(v: Variant, tc, source_hash: str, image: bytes) -> dict:
    info = inspect(v, image)
    return {
        "name": v.name,
        "variant": v.to_json(),
        "built": True,
        "file": v.filename,
        "sha256": sha256(image),
        "source_hash": source_hash,
        "compiler": tc.name,
        "symbol": v.symbol,
        "block_size": v.tile.threads,
        "tile": {"block_m": v.tile.block_m, "block_n": v.tile.block_n},
        "dynamic_smem": v.tile.dynamic_smem,
        "shared_bytes": v.tile.dynamic_smem + info["static_shared"],
        "kernarg_size": info["kernarg_size"],
        "kernargs": [a.to_json() for a in kernargs(v)],
        "grid": grid_rule(v),
        "registers": info["registers"],
        "scratch_bytes": info["scratch"],
        **({"prepass": prepass_entry(v)} if has_vt_prepass(v) else {}),
        **({"dependent_launch": True} if dependent_launch(v) else {}),
        **({"persistent": {"tiles": tiles_rule(v), "counter_bytes": PERSISTENT_COUNTER_BYTES}}
           if v.tile.persistent else {}),
        # a short-prompt variant (catalogue.Variant.short): the runtime takes it for calls of at
        # most max_seqlen_k keys a sequence (plan.variant_for)
        **({"short": {"max_seqlen_k": SHORT_KEYS}} if v.short else {}),
        # an f16-math variant (catalogue.Variant.f16): likewise, for at most max_seqlen_k keys
        **({"f16": {"max_seqlen_k": F16_KEYS}} if v.f16 else {}),
        **({"split_tail": split_tail_entry(v)} if v.tile.split_tail else {}),
        **({"tensor_maps": tensor_maps(v)} if tensor_maps(v) else {}),
        # the serving features the kernel implements (catalogue.features; plan.require_features
        # refuses a call needing one it does not list): absent where none
        **({"features": list(features(v))} if features(v) else {}),
    }


def aux_entry_for(a: AuxKernel, tc, source_hash: str, image: bytes) -> dict:
    """An auxiliary kernel's manifest entry (catalogue.AuxKernel): its ``kind`` and arch in
    place of a variant, its own arguments and grid."""
    info = inspect(a, image)
    return {
        "kind": a.kind,
        "name": a.name,
        "arch": a.arch,
        "built": True,
        "file": a.filename,
        "sha256": sha256(image),
        "source_hash": source_hash,
        "compiler": tc.name,
        "symbol": a.symbol,
        "block_size": a.spec.threads,
        "rows": a.spec.rows,
        "dynamic_smem": 0,
        "shared_bytes": info["static_shared"],
        "kernarg_size": info["kernarg_size"],
        "kernargs": [x.to_json() for x in kernargs(a)],
        "grid": a.spec.grid,
        "registers": info["registers"],
        "scratch_bytes": info["scratch"],
    }


def prepass_entry(v: Variant) -> dict:
    """The V^T pre-pass: a second entry point of the code object, launched before the kernel
    with the same arguments (catalogue.has_vt_prepass)."""
    return {"symbol": vt_prepass_symbol(v), "block_size": VT_THREADS, "grid": vt_prepass_grid_rule(v),
            "vt_block": VT_BLOCK}


def split_tail_entry(v: Variant) -> dict:
    """The balanced tail (catalogue.Tile.split_tail): the tail kernel, a third entry point of the
    code object launched after the kernel with the same arguments, its grid, the tiles' grid,
    the bytes of a piece's slot and of a cut tile's counter, and the planning constants."""
    return {"symbol": split_tail_symbol(v), "grid": split_tail_grid_rule(v), "tiles": tiles_rule(v),
            "slot_bytes": split_tail_slot_bytes(v), "counter_bytes": split_tail_counter_bytes(v),
            "overhead_blocks": SPLIT_TAIL_OVERHEAD_BLOCKS, "switch_blocks": SPLIT_TAIL_SWITCH_BLOCKS,
            "drain_blocks": SPLIT_TAIL_DRAIN_BLOCKS}


def unbuilt_entry(v: Variant | AuxKernel, reason: str) -> dict:
    if isinstance(v, AuxKernel):
        return {"kind": v.kind, "name": v.name, "arch": v.arch, "built": False, "reason": reason,
                "file": v.filename, "symbol": v.symbol}
    return {"name": v.name, "variant": v.to_json(), "built": False, "reason": reason,
            "file": v.filename, "symbol": v.symbol}


def build_one(v: Variant | AuxKernel, tc, out_dir: Path, old: dict | None) -> tuple[dict, bool]:
    """Build variant (or auxiliary kernel) v, or reuse the existing file; returns (manifest
    entry, cache hit)."""
    aux = isinstance(v, AuxKernel)
    source = kernel_source.emit_aux(v) if aux else kernel_source.emit(v)
    entry_for_v = aux_entry_for if aux else entry_for
    source_hash = sha256((tc.identity() + "\n" + source).encode())
    path = out_dir / v.filename
    if old and old.get("built") and old.get("source_hash") == source_hash and path.exists():
        image = path.read_bytes()
        if sha256(image) == old["sha256"]:
            return entry_for_v(v, tc, source_hash, image), True
    tmp = out_dir / (v.filename + ".build")
    try:
        if v.built_from == "asm-generator":
            tc.assemble(source, tmp)
        else:
            tc.compile_cxx(source, tmp)
        image = tmp.read_bytes()
    finally:
        tmp.unlink(missing_ok=True)
    entry = entry_for_v(v, tc, source_hash, image)   # checks the layout before the file lands
    atomic_write(path, image)
    return entry, False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=ARCHES, help="build only this arch")
    ap.add_argument("--only", help="build only variants whose name contains one of these "
                                   "comma-separated substrings")
    ap.add_argument("--skip", help="leave out variants whose name contains one of these comma-separated "
                                   "substrings (e.g. _serving: catalogue.Variant.serving)")
    ap.add_argument("--jobs", "-j", type=int, default=0, help="parallel compiles (default: CPUs)")
    ap.add_argument("--out", type=Path, default=ROOT / "prebuilt", help="output directory")
    args = ap.parse_args(argv)

    out_dir = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = out_dir / "manifest.json"
    old_entries = {}
    if manifest_path.exists():
        try:
            old = json.loads(manifest_path.read_text())
            if old.get("package_version") == __version__:
                old_entries = {e["name"]: e for e in old.get("kernels", []) + old.get("aux_kernels", [])}
        except (ValueError, KeyError):
            old_entries = {}

    variants = all_variants()
    auxes = all_aux()
    selected = list(iter_select(variants + auxes, args.arch, args.only, args.skip))
    archs = sorted({v.arch for v in selected})
    toolchains = {}
    for arch in archs:
        try:
            toolchains[arch] = toolchain.find_toolchain(arch)
        except toolchain.ToolchainError as e:
            print(f"build.py: {e}", file=sys.stderr)
            return 2

    entries: dict[str, dict] = {}
    for v in variants + auxes:   # what is not selected keeps its previous entry if its file is intact
        e = old_entries.get(v.name)
        path = out_dir / v.filename
        if e and e.get("built") and path.exists() and sha256(path.read_bytes()) == e["sha256"]:
            entries[v.name] = e
        else:
            entries[v.name] = unbuilt_entry(v, "not built: run build.py (see --arch / --only / --skip)")

    n, t0, hits = len(selected), time.monotonic(), 0
    jobs = args.jobs if args.jobs > 0 else max(1, len(__import__("os").sched_getaffinity(0)))
    print(f"building {n} kernels with {jobs} job(s) into {out_dir.name}/ "
          + ", ".join(f"{a}: {tc.name} {tc.version}" for a, tc in toolchains.items()), flush=True)
    failed = []
    with cf.ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(build_one, v, toolchains[v.arch], out_dir, old_entries.get(v.name)): v
                   for v in selected}
        for i, fut in enumerate(cf.as_completed(futures), 1):
            v = futures[fut]
            try:
                entry, hit = fut.result()
            except Exception as e:  # report every failure, then fail the build
                failed.append((v, e))
                print(f"[{i:2d}/{n}] {v.name:<44} FAILED: {e}", flush=True)
                continue
            hits += hit
            entries[v.name] = entry
            regs = entry["registers"]
            print(f"[{i:2d}/{n}] {v.name:<44} {'cached' if hit else 'built ':6} "
                  f"{time.monotonic() - t0:6.1f}s  " + " ".join(f"{kind} {count}" for kind, count in regs.items())
                  + f"  shared {entry['shared_bytes']} B", flush=True)

    manifest = {
        "format": MANIFEST_FORMAT,
        "package_version": __version__,
        "toolkits": {a: TOOLKIT[a] for a in ARCHES},
        "compilers": {a: {"name": tc.name, "version": tc.version} for a, tc in sorted(toolchains.items())},
        "kernels": [entries[v.name] for v in variants],
        "aux_kernels": [entries[a.name] for a in auxes],
    }
    if old_entries and manifest_path.exists():   # keep the record of compilers not rerun now
        prev = json.loads(manifest_path.read_text()).get("compilers", {})
        for a, c in prev.items():
            manifest["compilers"].setdefault(a, c)
    manifest["compilers"] = dict(sorted(manifest["compilers"].items()))
    atomic_write(manifest_path, (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode())
    atomic_write(out_dir / "zyfa_kernels.h", c_header.write_header(manifest).encode())
    built = sum(e["built"] for e in manifest["kernels"])
    built_aux = sum(e["built"] for e in manifest["aux_kernels"])
    print(f"done in {time.monotonic() - t0:.1f}s: {n - hits} built, {hits} cached, "
          f"{len(failed)} failed; manifest lists {len(variants)} kernels, {built} built, and "
          f"{len(auxes)} auxiliary kernels, {built_aux} built", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
