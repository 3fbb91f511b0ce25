"""Emit ``zyfa_kernels.h``: the manifest's kernels as C declarations.

The header is generated from ``manifest.json`` alone -- every offset, size, block
size, shared-memory figure and grid rule in it is read from the manifest, so the
argument layout still has exactly one definition (``catalogue.kernargs``, recorded
in the manifest and checked against the code objects by ``build.py``).

Per built kernel ``<name>`` it declares

* ``struct zyfa_<name>_args``: one field per kernel argument at the manifest's offset,
  natural alignment, explicit ``uint8_t`` padding where the manifest leaves a gap and
  at the tail up to ``kernarg_size``; ``sizeof`` and every ``offsetof`` are checked by
  static assertions.  The struct is the argument buffer handed to ``cuLaunchKernel`` /
  ``hipModuleLaunchKernel`` through ``extra`` (``*_LAUNCH_PARAM_BUFFER_POINTER``).
* ``ZYFA_<NAME>_*`` macros: symbol, file, sha256, arch, dtype, head dims, causal flag,
  tile, block size, dynamic and total shared bytes, kernarg size.
* ``zyfa_<name>_grid(const struct zyfa_<name>_args *, unsigned *gx, *gy, *gz)``: the grid
  rule evaluated on the struct's fields.  A persistent kernel (``ZYFA_<NAME>_PERSISTENT``
  1: one CTA an SM, taking tiles from a counter) has ``zyfa_<name>_tiles(struct ... *)``,
  which fills its ``tiles_x``, ``tiles_y``, ``tiles_z`` and ``tile_count`` fields (or returns
  -1 where the tiles overflow the kernel's int), and its grid function takes the device's SM
  count after the struct.
* Beside an sm_90a kernel, each with a comment on how a caller uses it: its V^T pre-pass
  (``ZYFA_<NAME>_PREPASS_*``, ``zyfa_<name>_prepass_grid``, ``zyfa_<name>_vt_columns``), its
  balanced tail (``ZYFA_<NAME>_TAIL_*``, ``zyfa_<name>_tail`` and ``zyfa_<name>_tail_grid``:
  the tail's plan, partials and counter), whether its launches are programmatic dependents
  (``ZYFA_<NAME>_DEPENDENT_LAUNCH``), and its tensor maps (``ZYFA_<NAME>_TENSOR_MAPS(X)``).
* What it takes of a packed batch's ``cu_seqlens`` (clamped to ``total_q``/``total_k`` where it
  has them, else a valid batch) and of FP8 descales (``(B, Hkv)`` by their strides where it has
  them, else one value each), in comments: read from its arguments.

plus the manifest format, package version, toolkit pins and compilers as macros, and
``ZYFA_KERNELS(X)``, an X-macro listing every built kernel as ``X(name, NAME)``.  The built
auxiliary kernels (the manifest's ``aux_kernels``: not attention) follow, listed by
``ZYFA_AUX_KERNELS(X)``, each with its struct, grid function and macros (``ZYFA_<NAME>_KIND``
says what it computes).
Valid C99, C11 and C++; the output depends only on the manifest (deterministic).
"""

from __future__ import annotations

import re

#: C field type for each (manifest type, size).  Pointers are device addresses and are
#: 64-bit whatever the host's pointer width (CUdeviceptr is an unsigned 64-bit integer).
C_TYPES = {
    ("ptr", 8): ("uint64_t", 8),
    ("i64", 8): ("int64_t", 8),
    ("i32", 4): ("int32_t", 4),
    ("f32", 4): ("float", 4),
    ("tmap", 128): ("uint64_t", 8),   # a CUtensorMap's 128 bytes (its 64-byte alignment is the offset's)
}

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

_PRELUDE = """\
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__cplusplus)
#define ZYFA_STATIC_ASSERT_(cond, msg) static_assert(cond, msg)
#elif defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
#define ZYFA_STATIC_ASSERT_(cond, msg) _Static_assert(cond, msg)
#else /* C99: a negative array size fails the build */
#define ZYFA_STATIC_ASSERT_CAT2_(a, b) a##b
#define ZYFA_STATIC_ASSERT_CAT_(a, b) ZYFA_STATIC_ASSERT_CAT2_(a, b)
#define ZYFA_STATIC_ASSERT_(cond, msg) \\
  typedef char ZYFA_STATIC_ASSERT_CAT_(zyfa_static_assert_, __LINE__)[(cond) ? 1 : -1]
#endif

/* ceil(a / b) for b > 0 (C division truncates toward zero: the ceiling when a <= 0); 0 if b <= 0. */
static inline int64_t zyfa_cdiv_(int64_t a, int64_t b) {
  return b <= 0 ? 0 : a > 0 ? (a + b - 1) / b : a / b;
}

static inline int64_t zyfa_min_(int64_t a, int64_t b) { return a < b ? a : b; }

/* A grid dimension: negative values become 0, as in the runtime's evaluation. */
static inline unsigned int zyfa_grid_dim_(int64_t n) {
  return n > 0 ? (unsigned int)n : 0u;
}
"""

_EPILOGUE = """\
#undef ZYFA_STATIC_ASSERT_
#undef ZYFA_STATIC_ASSERT_CAT_
#undef ZYFA_STATIC_ASSERT_CAT2_

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ZYFA_KERNELS_H */
"""


class HeaderError(ValueError):
    pass


def _ident(s: str, what: str) -> str:
    if not isinstance(s, str) or not _IDENT.match(s):
        raise HeaderError(f"{what} {s!r} is not a C identifier")
    return s


def _cstr(s) -> str:
    s = str(s)
    out = []
    for ch in s:
        if ch in '"\\':
            out.append("\\" + ch)
        elif " " <= ch <= "~":
            out.append(ch)
        else:
            out.append(f"\\{ord(ch) & 0xFF:03o}" if ord(ch) < 0x100 else "?")
    return '"' + "".join(out) + '"'


def _comment(s) -> str:
    return str(s).replace("*/", "* /")


def _struct(name: str, entry: dict) -> tuple[list[str], list[tuple[str, int, int]]]:
    """The struct's lines, and (field, offset, size) of every field, padding included."""
    fields: list[tuple[str, int, int]] = []
    lines = [f"struct zyfa_{name}_args {{"]
    pos, n_pad, max_align = 0, 0, 1
    seen = set()
    for a in entry["kernargs"]:
        fname = _ident(a["name"], f"{name}: argument")
        if fname in seen or fname.startswith("pad_"):
            raise HeaderError(f"{name}: argument name {fname!r} repeated or reserved")
        seen.add(fname)
        key = (a["type"], int(a["size"]))
        if key not in C_TYPES:
            raise HeaderError(f"{name}.{fname}: no C type for type {a['type']!r} of size {a['size']}")
        ctype, align = C_TYPES[key]
        off = int(a["offset"])
        if off % align:
            raise HeaderError(f"{name}.{fname}: offset {off} is not {align}-byte aligned")
        natural = (pos + align - 1) // align * align
        if off < natural:
            raise HeaderError(f"{name}.{fname}: offset {off} overlaps the previous argument")
        if off > pos:   # every gap is spelt out, including those natural alignment would insert
            lines.append(f"  uint8_t pad_{n_pad}[{off - pos}];")
            fields.append((f"pad_{n_pad}", pos, off - pos))
            n_pad += 1
        n = int(a["size"]) // align            # elements: 1 but for a tensor map
        lines.append(f"  {ctype} {fname}{'' if n == 1 else f'[{n}]'};")
        fields.append((fname, off, n * align))
        pos = off + n * align
        max_align = max(max_align, align)
    size = int(entry["kernarg_size"])
    if size < pos:
        raise HeaderError(f"{name}: kernarg_size {size} is smaller than the arguments' end {pos}")
    if size % max_align:
        raise HeaderError(f"{name}: kernarg_size {size} is not a multiple of the struct's "
                          f"alignment {max_align}")
    if size > pos:
        lines.append(f"  uint8_t pad_{n_pad}[{size - pos}];")
        fields.append((f"pad_{n_pad}", pos, size - pos))
    lines.append("};")
    lines.append(f"typedef struct zyfa_{name}_args zyfa_{name}_args;")
    return lines, fields


def _grid_term(name: str, term, args: set[str]) -> str:
    if isinstance(term, bool):
        raise HeaderError(f"{name}: malformed grid term {term!r}")
    if isinstance(term, int):
        return f"(int64_t){term}"
    if isinstance(term, str):
        if term == "sm_count" and "sm_count" in args:   # the persistent grid's parameter
            return "(int64_t)sm_count"
        if term not in args:
            raise HeaderError(f"{name}: grid term {term!r} names no kernel argument")
        return f"(int64_t)a->{term}"
    if isinstance(term, dict) and set(term) == {"min"} and term["min"]:
        out = _grid_term(name, term["min"][0], args)
        for t in term["min"][1:]:
            out = f"zyfa_min_({out}, {_grid_term(name, t, args)})"
        return out
    if isinstance(term, dict) and set(term) == {"cdiv"} and len(term["cdiv"]) == 2:
        x, y = (_grid_term(name, t, args) for t in term["cdiv"])
        return f"zyfa_cdiv_({x}, {y})"
    if isinstance(term, dict) and set(term) == {"mul"} and term["mul"]:
        return "(" + " * ".join(_grid_term(name, t, args) for t in term["mul"]) + ")"
    if isinstance(term, dict) and set(term) == {"if_le"} and len(term["if_le"]) == 4:
        a, b, then, other = (_grid_term(name, t, args) for t in term["if_le"])
        return f"({a} <= {b} ? {then} : {other})"
    raise HeaderError(f"{name}: malformed grid term {term!r}")


def _kernel(entry: dict) -> list[str]:
    name = _ident(entry["name"], "kernel name")
    up = name.upper()
    var = entry.get("variant", {})
    lines, fields = _struct(name, entry)
    out = [f"/* ---- {name} " + "-" * max(0, 78 - len(name) - 9) + " */", ""]
    out += lines
    st = f"struct zyfa_{name}_args"
    out.append(f"ZYFA_STATIC_ASSERT_(sizeof({st}) == {int(entry['kernarg_size'])}, "
               f"\"{name}: kernarg_size\");")
    for f, off, _ in fields:
        out.append(f"ZYFA_STATIC_ASSERT_(offsetof({st}, {f}) == {off}, \"{name}.{f}\");")
    out.append("")
    macros = [
        ("SYMBOL", _cstr(entry["symbol"])),
        ("FILE", _cstr(entry["file"])),
        ("SHA256", _cstr(entry["sha256"])),
        ("ARCH", _cstr(var["arch"])),
        ("DTYPE", _cstr(var["dtype"])),
        ("D_QK", str(int(var["d_qk"]))),
        ("D_V", str(int(var["d_v"]))),
        ("CAUSAL", "1" if var["causal"] else "0"),
        ("BLOCK_M", str(int(entry["tile"]["block_m"]))),
        ("BLOCK_N", str(int(entry["tile"]["block_n"]))),
        ("BLOCK_SIZE", str(int(entry["block_size"]))),
        ("DYNAMIC_SMEM", str(int(entry["dynamic_smem"]))),
        ("SHARED_BYTES", str(int(entry["shared_bytes"]))),
        ("KERNARG_SIZE", str(int(entry["kernarg_size"]))),
        ("PERSISTENT", "1" if "persistent" in entry else "0"),
        # a short-prompt variant (manifest "short"): the kernel for calls of at most this many
        # keys a sequence, the plain kernel of its name less "_short" for longer ones; 0: not one
        ("SHORT_MAX_SEQLEN_K", str(int(entry["short"]["max_seqlen_k"])) if "short" in entry else "0"),
        # an f16-math variant (manifest "f16": e4m3 inputs in f16 tensor math, no pre-pass): the
        # kernel for calls of at most this many keys a sequence, before the short one; 0: not one
        ("F16_MAX_SEQLEN_K", str(int(entry["f16"]["max_seqlen_k"])) if "f16" in entry else "0"),
        ("SPLIT_TAIL", "1" if "split_tail" in entry else "0"),
        ("DEPENDENT_LAUNCH", "1" if entry.get("dependent_launch") else "0"),
        # the serving features (manifest "features"): 1 where the struct has their arguments
        # (window: window_left = window_right = -1 is no window; a zeroed struct means (0, 0))
        *((f.upper(), "1" if f in entry.get("features", ()) else "0")
          for f in ("window", "softcap", "sinks", "kvcache", "paged_kv")),
    ]
    width = max(len(k) for k, _ in macros)
    out += [f"#define ZYFA_{up}_{k:<{width}} {v}" for k, v in macros]
    out.append("")
    args = {a["name"] for a in entry["kernargs"]}
    g = entry["grid"]
    if "persistent" in entry:
        out += _persistent(name, entry, st, args)
        terms = [_grid_term(name, g[axis], args | {"sm_count"}) for axis in ("x", "y", "z")]
        out += _grid_function(f"zyfa_{name}_grid", "grid", st, g, terms, "unsigned int sm_count, ")
    else:
        terms = [_grid_term(name, g[axis], args) for axis in ("x", "y", "z")]
        out += _grid_function(f"zyfa_{name}_grid", "grid", st, g, terms)
    out += _contract(name, args)
    out += _tensor_maps(name, entry)
    if "split_tail" in entry:
        out += _split_tail(name, entry, st, args)
    if "prepass" in entry:
        out += _prepass(name, entry, st, args)
    return out


def _contract(name: str, args: set) -> list[str]:
    """What the kernel takes of a packed batch's cu_seqlens and of FP8 descales, by the
    arguments it has (catalogue.clamps_cu_seqlens, catalogue.per_head_descales)."""
    out = []
    if {"cu_seqlens_q", "total_q", "total_k"} <= args:
        out += [f"/* {name}: packed (cu_seqlens_q/_k non-null, int32[batch + 1]): set total_q and total_k to the",
                " * rows of q and of k/v.  Sequence b is [cu[b], cu[b + 1]) clamped: its first row to",
                " * [0, total], its end to [first, total], its length to seqlen_q / seqlen_k (max_seqlen): any",
                " * values stay inside q, k, v, o and lse (values that are no valid batch give wrong output,",
                " * never an access outside them), so they need not be checked on the host.  Dense: unused. */"]
    elif "cu_seqlens_q" in args:
        out += [f"/* {name}: packed (cu_seqlens_q/_k non-null, int32[batch + 1]): the values must be a valid",
                " * batch -- cu[0] = 0, non-decreasing, cu[batch] = the rows of q (of k/v), no sequence longer",
                " * than seqlen_q (seqlen_k) -- the kernel reads as they are. */"]
    if {"descale_q_stride_b", "descale_q_stride_h"} <= args:
        out += [f"/* {name}: descale_q/_k/_v point to fp32 dequantisation factors, one a (sequence b,",
                " * key/value head g): descale_q[b * descale_q_stride_b + g * descale_q_stride_h] (strides",
                " * in elements, non-negative); every query head of g shares it.  One value a tensor: both",
                " * strides 0; FlashAttention-3's (batch, heads_kv) tensor: its strides (a broadcast view's",
                " * zeros included). */"]
    elif "descale_q" in args:
        out += [f"/* {name}: descale_q/_k/_v each point to one fp32 dequantisation factor (the whole",
                " * tensor's). */"]
    out += _features_contract(name, args)
    return out


def _features_contract(name: str, args: set) -> list[str]:
    """The serving features' arguments a kernel has (catalogue.features: window, softcap,
    sinks, kvcache, paged_kv), each stated where present."""
    out = []
    if {"window_left", "window_right"} <= args:
        out += [f"/* {name}: sliding window: query row i of a sequence of sq queries and sk keys sees keys",
                " * i + sk - sq - window_left .. i + sk - sq + window_right, a bound of -1 being none (a causal",
                " * kernel takes window_right as 0 whatever it holds; no window: -1 and -1). */"]
    if {"softcap", "softcap_scale"} <= args:
        out += [f"/* {name}: softcap: 0 and 0 off; else each scaled score s becomes softcap * tanh(s / softcap),",
                " * with softcap_scale = (float)(softmax_scale / softcap). */"]
    if "sinks" in args:
        out += [f"/* {name}: sinks: null, or fp32[hq]: query head h's logit sinks[h] (in the scaled-score",
                " * space) joins every row's softmax denominator with no value; the LSE includes it. */"]
    if "cache_seqlens" in args:
        out += [f"/* {name}: KV cache: cache_seqlens null (k and v are tensors), or int32[batch]: sequence b's",
                " * keys are the first cache_seqlens[b] rows of its part of the cache (k at b * k_stride_b, v",
                " * alike, seqlen_k rows each), its queries the newest positions; the kernel clamps each count",
                " * to [0, seqlen_k], so that values never read back stay inside the tensors. */"]
    if {"page_table", "page_table_stride", "page_size", "num_pages", "max_pages", "page_magic"} <= args:
        out += [f"/* {name}: paged KV cache (with cache_seqlens): page_table null (not paged), or int32 with",
                " * sequence b's row at b * page_table_stride: key t of sequence b is row t % page_size of page",
                " * page_table[b * page_table_stride + t / page_size] of k and v (num_pages, page_size, heads_kv,",
                " * d): pages at k_stride_b, rows at k_stride_s (v alike), each index clamped to [0, num_pages - 1];",
                " * page_size a multiple of 16 from 16 to 256, seqlen_k = max_pages * page_size, page_magic",
                " * = ceil(2^31 / (page_size / 16)) (as int32: 0x80000000 for page_size 16). */"]
    return out


def _require(name: str, args: set, fields: tuple, what: str) -> None:
    for f in fields:
        if f not in args:
            raise HeaderError(f"{name}: {what} without the argument {f!r}")


def _tiles_into_struct(terms: list[str]) -> list[str]:
    """C lines that evaluate the tiles' grid terms into tx, ty, tz, return -1 where their product
    overflows the kernel's int, and fill the struct's tiles_x, tiles_y, tiles_z and tile_count."""
    return [*(f"  const int64_t t{axis} = (int64_t)zyfa_grid_dim_({term});" for axis, term in zip("xyz", terms)),
            "  if (tx > 0 && ty > 0 && tz > 0 && (tx > INT32_MAX / ty || tx * ty > INT32_MAX / tz)) return -1;",
            "  a->tiles_x = (int32_t)tx;",
            "  a->tiles_y = (int32_t)ty;",
            "  a->tiles_z = (int32_t)tz;",
            "  a->tile_count = (int32_t)(tx * ty * tz);"]


def _split_tail(name: str, entry: dict, st: str, args: set) -> list[str]:
    """A balanced-tail kernel (catalogue.Tile.split_tail): its tiles and the plan of its tail
    into the struct (plan.tail_plan's rule, the manifest's constants), the sizes of its
    partials and counter."""
    up, tail = name.upper(), entry["split_tail"]
    _require(name, args, ("tiles_x", "tiles_y", "tiles_z", "tile_count", "tail_first", "tail_ctas", "tail_gap",
                          "tail_ramp", "partials", "tail_counter", "seqlen_k"), "a balanced-tail kernel")
    t = tail["tiles"]
    terms = [_grid_term(name, t[axis], args) for axis in ("x", "y", "z")]
    block_n = int(entry["tile"]["block_n"])
    out = [f"/* {name} balances its last wave: the tiles past the last whole wave of the device's SMs are",
           f" * not the kernel's but its tail kernel's, ZYFA_{up}_TAIL_SYMBOL (same module, arguments, block and",
           " * dynamic shared memory), launched after it on the same stream where its grid is not empty; its",
           " * CTAs cut them by keys.  The kernel's grid holds the tiles before them, and is empty where the",
           " * tail takes every tile: launch each where its grid is not.  Before a launch:",
           " * zyfa_" + name + "_tail(&args, sm_count, packed, dependent) (returns",
           " * -1, the struct unchanged, where the tiles overflow the kernel's int; tail_ctas = 0 where nothing",
           " * is cut, always for packed batches).  Then, where tail_ctas > 0,",
           f" * args.partials = 2 * tail_ctas * ZYFA_{up}_SLOT_BYTES bytes of device memory, and always",
           f" * args.tail_counter = (tile_count - tail_first, at least 1) * ZYFA_{up}_TAIL_COUNTER_BYTES",
           " * bytes, zeroed once before the first launch that uses them; every launch leaves them zero,",
           " * so launches on one stream share both (launches that may run at the same time need their own). */",
           f"#define ZYFA_{up}_TAIL_SYMBOL {_cstr(tail['symbol'])}"]
    out += [f"#define ZYFA_{up}_SLOT_BYTES {int(tail['slot_bytes'])}",
            f"#define ZYFA_{up}_TAIL_COUNTER_BYTES {int(tail['counter_bytes'])}",
            "/* dependent: 1 where the tail kernel is launched as the kernel's programmatic dependent (its",
            " * CTAs start as the kernel's last ones end, and the plan gives the first ones more blocks). */",
            f"static inline int zyfa_{name}_tail({st} *a, unsigned int sm_count, int packed, int dependent) {{",
            *_tiles_into_struct(terms),
            "  const int64_t tiles = tx * ty * tz;",
            f"  const int64_t nb = zyfa_cdiv_((int64_t)a->seqlen_k, {block_n});",
            "  const int64_t rest = sm_count > 0 ? tiles % sm_count : 0;",
            "  a->tail_first = (int32_t)tiles;",
            "  a->tail_ctas = 0;",
            "  a->tail_gap = 0;",
            "  a->tail_ramp = 0;",
            "  if (!packed && rest > 0 && nb >= 2 && sm_count < 4096u &&",
            f"      zyfa_cdiv_(rest * nb, sm_count) + {int(tail['overhead_blocks'])} < nb) {{",
            "    const int64_t ctas = zyfa_min_(sm_count, rest * nb);",
            f"    int64_t gap = {int(tail['switch_blocks'])}, ramp = dependent && tiles > rest ? {int(tail['drain_blocks'])} : 0;",
            "    for (int k = 0; k < 2; ++k, gap = 0, ramp = 0) {   /* then plain equal blocks */",
            "      const int64_t cost = rest * (nb + gap) - gap, q = cost / ctas, half = (ramp + 1) / 2;",
            "      if (cost >= ((int64_t)1 << 31)) continue;",
            "      if ((gap == 0 && ramp == 0) || (q + 2 + half <= nb && q - half - 1 > gap)) {",
            "        a->tail_first = (int32_t)(tiles - rest);",
            "        a->tail_ctas = (int32_t)ctas;",
            "        a->tail_gap = (int32_t)gap;",
            "        a->tail_ramp = (int32_t)ramp;",
            "        break;",
            "      }",
            "    }",
            "  }",
            "  return 0;",
            "}", ""]
    g = tail["grid"]
    terms = [_grid_term(name, g[axis], args) for axis in ("x", "y", "z")]
    return out + _grid_function(f"zyfa_{name}_tail_grid", "tail kernel's grid", st, g, terms)


def _persistent(name: str, entry: dict, st: str, args: set) -> list[str]:
    """A persistent kernel: its grid of tiles into the struct, and its tile counter."""
    up, pers = name.upper(), entry["persistent"]
    _require(name, args, ("tiles_x", "tiles_y", "tiles_z", "tile_count", "tile_counter"), "a persistent kernel")
    t = pers["tiles"]
    terms = [_grid_term(name, t[axis], args) for axis in ("x", "y", "z")]
    bytes_ = int(pers["counter_bytes"])
    return [f"/* {name} is persistent: one CTA an SM (its grid function takes the device's SM count),",
            " * each taking tiles from a counter.  Before a launch: zyfa_" + name + "_tiles(&args), and",
            f" * args.tile_counter = ZYFA_{up}_COUNTER_BYTES bytes of device memory, zeroed once before the",
            " * first launch that uses them; every launch leaves them zero, so launches on one stream share",
            " * them (give launches that may run at the same time counters of their own). */",
            f"#define ZYFA_{up}_COUNTER_BYTES {bytes_}",
            f"/* tiles: x = {_comment(_rule(t['x']))}, y = {_comment(_rule(t['y']))}, z = {_comment(_rule(t['z']))};",
            " * tile_count their product.  Returns 0, or -1 (the struct unchanged) where the tiles are more",
            " * than the kernel counts (2^31 - 1): split the batch or the sequence. */",
            f"static inline int zyfa_{name}_tiles({st} *a) {{",
            *_tiles_into_struct(terms),
            "  return 0;",
            "}", ""]


def _prepass(name: str, entry: dict, st: str, args: set) -> list[str]:
    """The V^T pre-pass of a kernel: launched first, on the same stream with the same argument
    buffer, from a second symbol of the same code object; its workspace rule."""
    up, pre = name.upper(), entry["prepass"]
    g, block = pre["grid"], int(pre["vt_block"])
    out = [f"/* {name} has a pre-pass: launch ZYFA_{up}_PREPASS_SYMBOL (same module, same args,",
           f" * ZYFA_{up}_PREPASS_BLOCK_SIZE threads, no dynamic shared memory) before the kernel,",
           " * on the same stream.  It writes V^T into the workspace `vt`: hkv * vt_stride_h bytes",
           f" * of device memory, with vt_stride_h = d_v * zyfa_{name}_vt_columns(...); the workspace",
           " * may be reused once the kernel has run." + ("" if "kg" in args else " */"),
           *([" * With a paged cache (page_table not null) it also gathers K's used rows into `kg`:",
              " * batch * max_pages * page_size * hkv * d_qk bytes of device memory (null otherwise), which",
              " * the kernel reads through tmap_k as a contiguous cache (see tmap_k). */"] if "kg" in args else []),
           *([f"/* ZYFA_{up}_DEPENDENT_LAUNCH: the kernel may be launched with",
              " * CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION right after its pre-pass, and a tail",
              " * kernel so right after the kernel (never after another launch): each waits for the launch",
              " * before it where it must.  A plain launch is correct too. */"] if entry.get("dependent_launch") else []),
           f"#define ZYFA_{up}_PREPASS_SYMBOL {_cstr(pre['symbol'])}",
           f"#define ZYFA_{up}_PREPASS_BLOCK_SIZE {int(pre['block_size'])}",
           f"#define ZYFA_{up}_VT_BLOCK {block}",
           f"/* key columns of a key/value head's V^T: dense (total_k < 0; a KV cache's whatever q) batch *",
           f" * cdiv(seqlen_k, {block}) * {block}; packed, (cdiv(total_k, {block}) + batch) * {block} */",
           f"static inline int64_t zyfa_{name}_vt_columns(int64_t batch, int64_t seqlen_k, int64_t total_k) {{",
           f"  int64_t blocks = total_k < 0 ? zyfa_cdiv_(seqlen_k, {block}) * batch : zyfa_cdiv_(total_k, {block}) + batch;",
           f"  return (blocks > 1 ? blocks : 1) * {block};",
           "}"]
    terms = [_grid_term(name, g[axis], args) for axis in ("x", "y", "z")]
    return out + _grid_function(f"zyfa_{name}_prepass_grid", "pre-pass grid", st, g, terms)


def _tensor_maps(name: str, entry: dict) -> list[str]:
    """How a caller encodes the kernel's tensor-map arguments (catalogue.tensor_maps, in the
    manifest), in words and as ZYFA_<NAME>_TENSOR_MAPS(X): X(arg, tensor, row_bytes,
    elem_bytes, box0, box1, box2, box3, swizzle_bytes) per map, nothing for a kernel without."""
    up, var = name.upper(), entry["variant"]
    maps = sorted(entry.get("tensor_maps", {}).items())
    out, xs = [], []
    for arg, spec in maps:
        a = _ident(arg, f"{name}: argument")
        t = _ident(spec["tensor"], f"{name}: tensor-map tensor")
        if t not in ("q", "k", "v", "o"):
            raise HeaderError(f"{name}: a tensor map of {t!r}; the kernels take Q, K, V and O")
        elem = 1 if var["dtype"] == "fp8_e4m3" and t != "o" else 2   # O is bf16
        d = "d_v" if t in ("v", "o") else "d_qk"
        heads, rows, total = ("hq", "seqlen_q", "total_q") if t in ("q", "o") else ("hkv", "keys", "total_k")
        row = elem * int(var[d])
        box = [int(b) for b in spec["box"]]
        if len(box) != 4:
            raise HeaderError(f"{name}: tensor map {arg} has a box of rank {len(box)}, not 4")
        swz = int(spec["swizzle_bytes"])
        scale = "" if elem == 1 else f"{elem} * "
        out += [f"/* `{a}` is a CUtensorMap of {t} for TMA, encoded for each call by cuTensorMapEncodeTiled:",
                f" * CU_TENSOR_MAP_DATA_TYPE_UINT8 (bytes), rank 4, dims {{{row} (= {scale}{d}), {heads}, {rows}, batch}}",
                f" * (packed: {{{row}, {heads}, {total}, 1}}), strides in bytes {{{scale}{t}_stride_h, {scale}{t}_stride_s,",
                f" * {scale}{t}_stride_b}} (positive multiples of 16), box {{{', '.join(map(str, box))}}}, element strides 1,",
                f" * CU_TENSOR_MAP_SWIZZLE_{swz}B, no interleave, L2 promotion 128B, OOB fill none; into a",
                " * 64-byte aligned CUtensorMap, then copied into the struct. */"]
        gathered = t == "k" and "kg" in {x["name"] for x in entry.get("kernargs", ())}
        if t != "q" and "kvcache" in entry.get("features", ()) and gathered:
            out += [f"/* `{a}` of a KV cache (cache_seqlens not null): contiguous, dims "
                    f"{{{row}, {heads}, max_seqlen_k,",
                    " * batch} whatever q; paged (page_table not null), over `kg`, where the pre-pass gathers",
                    f" * the pages' K: dims {{{row}, {heads}, max_pages * page_size, batch}}, strides in bytes "
                    f"{{{row}, {heads} * {row},",
                    f" * max_pages * page_size * {heads} * {row}}}, the box above. */"]
        elif t != "q" and "kvcache" in entry.get("features", ()):
            out += [f"/* `{a}` of a KV cache (cache_seqlens not null): contiguous, dims "
                    f"{{{row}, {heads}, max_seqlen_k,",
                    " * batch} whatever q; paged (page_table not null), the whole cache: dims {"
                    f"{row}, {heads}, page_size, num_pages}}",
                    f" * and box2 = min(page_size & -page_size, {box[2]}) (a power of two dividing the page "
                    "and the tile). */"]
        xs.append(f"X({a}, {t}, {row}, {elem}, {', '.join(map(str, box))}, {swz})")
    out.append("/* X(arg, tensor, row_bytes, elem_bytes, box0, box1, box2, box3, swizzle_bytes) per tensor map */")
    out.append(f"#define ZYFA_{up}_TENSOR_MAPS(X) {' '.join(xs)}".rstrip())
    return out + [""]


def _grid_function(fn: str, what: str, st: str, g: dict, terms: list[str], extra: str = "") -> list[str]:
    """A grid rule as a C function of the argument struct (and ``extra`` parameters), with the
    rule in a comment."""
    out = [f"/* {what}: x = {_comment(_rule(g['x']))}, y = {_comment(_rule(g['y']))}, "
           f"z = {_comment(_rule(g['z']))} */",
           f"static inline void {fn}(const {st} *a, {extra}unsigned int *gx, unsigned int *gy, unsigned int *gz) {{"]
    out += [f"  *{axis} = zyfa_grid_dim_({t});" for axis, t in zip(("gx", "gy", "gz"), terms)]
    return out + ["}", ""]


def _rule(term) -> str:
    if isinstance(term, dict) and "cdiv" in term:
        a, b = term["cdiv"]
        return f"cdiv({_rule(a)}, {_rule(b)})"
    if isinstance(term, dict) and "mul" in term:
        return " * ".join(_rule(t) for t in term["mul"])
    if isinstance(term, dict) and "min" in term:
        return "min(" + ", ".join(_rule(t) for t in term["min"]) + ")"
    if isinstance(term, dict) and "if_le" in term:
        a, b, then, other = term["if_le"]
        return f"({_rule(a)} <= {_rule(b)} ? {_rule(then)} : {_rule(other)})"
    return str(term)


def _aux_kernel(entry: dict) -> list[str]:
    """An auxiliary kernel (the manifest's ``aux_kernels``: not attention, a ``kind`` in place
    of a variant): its argument struct, macros and grid function, as an attention kernel's."""
    name = _ident(entry["name"], "kernel name")
    up = name.upper()
    lines, fields = _struct(name, entry)
    st = f"struct zyfa_{name}_args"
    out = [f"/* ---- {name} " + "-" * max(0, 78 - len(name) - 9) + " */", ""] + lines
    out.append(f"ZYFA_STATIC_ASSERT_(sizeof({st}) == {int(entry['kernarg_size'])}, \"{name}: kernarg_size\");")
    out += [f"ZYFA_STATIC_ASSERT_(offsetof({st}, {f}) == {off}, \"{name}.{f}\");" for f, off, _ in fields]
    out.append("")
    macros = [("KIND", _cstr(_ident(entry["kind"], f"{name}: kind"))),
              ("SYMBOL", _cstr(entry["symbol"])),
              ("FILE", _cstr(entry["file"])),
              ("SHA256", _cstr(entry["sha256"])),
              ("ARCH", _cstr(entry["arch"])),
              ("BLOCK_SIZE", str(int(entry["block_size"]))),
              ("DYNAMIC_SMEM", str(int(entry["dynamic_smem"]))),
              ("SHARED_BYTES", str(int(entry["shared_bytes"]))),
              ("KERNARG_SIZE", str(int(entry["kernarg_size"])))]
    width = max(len(k) for k, _ in macros)
    out += [f"#define ZYFA_{up}_{k:<{width}} {v}" for k, v in macros]
    out.append("")
    args = {a["name"] for a in entry["kernargs"]}
    g = entry["grid"]
    terms = [_grid_term(name, g[axis], args) for axis in ("x", "y", "z")]
    return out + _grid_function(f"zyfa_{name}_grid", "grid", st, g, terms)


def _aux_section(entries: list) -> list[str]:
    """The built auxiliary kernels, after the attention kernels: ``ZYFA_NUM_AUX_KERNELS``,
    ``ZYFA_AUX_KERNELS(X)`` as X(name, NAME) and each kernel's declarations; nothing where
    none is built (a manifest without them gives the header it always gave)."""
    built = [e for e in entries if e.get("built")]
    if not built:
        return []
    out = ["/* Auxiliary kernels: not attention; ZYFA_<NAME>_KIND says what each computes",
           " * (merge_attention_states: docs/api.md). */",
           f"#define ZYFA_NUM_AUX_KERNELS {len(built)}",
           "#define ZYFA_AUX_KERNELS(X) \\"]
    for i, e in enumerate(built):
        n = _ident(e["name"], "kernel name")
        out.append(f"  X({n}, {n.upper()})" + (" \\" if i + 1 < len(built) else ""))
    out.append("")
    for e in built:
        out += _aux_kernel(e)
    return out


def write_header(manifest: dict) -> str:
    """The text of ``zyfa_kernels.h`` for ``manifest`` (a parsed manifest.json)."""
    kernels = manifest.get("kernels", [])
    built = [e for e in kernels if e.get("built")]
    unbuilt = [e for e in kernels if not e.get("built")]
    out = [
        "/* zyfa_kernels.h: the kernels of prebuilt/manifest.json as C declarations.",
        " * Generated by build.py (generator/c_header.py) from the manifest; do not edit.",
        " *",
        " * Per kernel: struct zyfa_<name>_args is the kernel-argument buffer (pass it with",
        " * CU_LAUNCH_PARAM_BUFFER_POINTER / HIP_LAUNCH_PARAM_BUFFER_POINTER and its sizeof),",
        " * ZYFA_<NAME>_* give the symbol, file, block size and shared memory, and",
        " * zyfa_<name>_grid() evaluates the launch grid from the struct's fields.",
        " * Pointer fields hold device addresses; strides are in elements. */",
        "#ifndef ZYFA_KERNELS_H",
        "#define ZYFA_KERNELS_H",
        "",
    ]
    out += _PRELUDE.splitlines()
    out.append("")
    out.append(f"#define ZYFA_MANIFEST_FORMAT {int(manifest['format'])}")
    out.append(f"#define ZYFA_PACKAGE_VERSION {_cstr(manifest['package_version'])}")
    for arch, tk in sorted(manifest.get("toolkits", {}).items()):
        out.append(f"#define ZYFA_TOOLKIT_{_ident(arch, 'arch').upper()} {_cstr(tk)}")
    for arch, c in sorted(manifest.get("compilers", {}).items()):
        a = _ident(arch, "arch").upper()
        out.append(f"#define ZYFA_COMPILER_{a} {_cstr(c.get('name', ''))}")
        out.append(f"#define ZYFA_COMPILER_VERSION_{a} {_cstr(c.get('version', ''))}")
    out.append(f"#define ZYFA_NUM_KERNELS {len(built)}")
    out.append("")
    out.append("/* Every kernel declared below, as X(name, NAME). */")
    if built:
        out.append("#define ZYFA_KERNELS(X) \\")
        for i, e in enumerate(built):
            n = _ident(e["name"], "kernel name")
            out.append(f"  X({n}, {n.upper()})" + (" \\" if i + 1 < len(built) else ""))
    else:
        out.append("#define ZYFA_KERNELS(X)")
    if unbuilt:
        out.append("")
        out.append("/* Listed in the manifest but not built (not declared here):")
        out += [f" *   {_comment(e['name'])}" for e in unbuilt]
        out.append(" */")
    out.append("")
    for e in built:
        out += _kernel(e)
    out += _aux_section(manifest.get("aux_kernels", []))
    out += _EPILOGUE.splitlines()
    return "\n".join(out) + "\n"
