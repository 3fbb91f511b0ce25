#!/usr/bin/env python3
"""The FP8 accuracy study: which arithmetic for P, measured on Gaussian inputs and on
SmolLM2-135M's real activations, per layer and end to end.

    python bench/accuracy.py                 # the full study (about 15 min on 2 cores)
    python bench/accuracy.py --quick         # smaller shapes, fewer layers (a minute)
    python bench/accuracy.py --adaptive      # gfx950's adaptive merge, swept (about 30 min)
    python bench/accuracy.py --adaptive --unit wave --layers 1,9,17,25   # decided per wave
    python bench/accuracy.py --granularity all   # quantize_fp8's granularities (about 25 min)
    python bench/accuracy.py --granularity tensor,block+smooth_k --quick
    python bench/accuracy.py --input-errors     # quantisation alone, per granularity (2 min)
    python bench/accuracy.py --diagonal         # the causal diagonal's forms on SmolLM2

Every number is ||out - ref|| / ||ref|| against the fp64 reference, computed two ways:
"deq" on the dequantised FP8 inputs (the error of the attention arithmetic alone) and
"orig" on the unquantised inputs (what a user sees, input quantisation included).
Inputs are quantised per tensor to e4m3 with descale = amax / 448, as the API takes them.
The FP8 recipes are the exact models of ``zyfa_runtime.fp8_models``.

It writes the tables between the ``<!-- tables:begin -->`` / ``<!-- tables:end -->``
markers of docs/numerics.md (the rest of that file is prose kept by hand) and the raw
numbers to docs/numerics.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")   # many small GEMMs: processes, not threads
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from zyfa_runtime import e4m3, quantize_model, reference  # noqa: E402
from zyfa_runtime.fp8_models import sequence_forward  # noqa: E402

#: The recipes of the study: the two baselines, the chosen targets, the first zyfa design
#: ("lean64": Lean P, integer block max, rounded sum) and its ablations.
STUDY = [
    "aiter", "fa3", "fa3/rounded",
    "gfx950", "gfx950/pk_u8", "sm_90a", "sm_90a/quad", "sm_90a/fold",
    "lean64", "lean64/exact", "lean64/unrounded", "lean64/shift1", "lean64/running",
    "lean64/quad-bfp32", "lean128/bfp32c",
]

HEAD_DIMS = [(64, 64), (128, 128), (192, 128), (256, 256)]


def quantise(x: np.ndarray):
    """Per-tensor e4m3: (codes, descale) with descale = amax / 448 (fp32)."""
    descale = np.float32(max(float(np.abs(x).max()), 1e-30) / 448.0)
    codes = e4m3.encode(np.asarray(x, np.float64) / float(descale), saturate=True)
    return codes, descale


def rel(out, ref) -> float:
    return reference.relative_error(out, ref)


def per_head_errors(out, ref) -> list[float]:
    """Relative error of each head: out/ref (S, H, D)."""
    return [rel(out[:, h], ref[:, h]) for h in range(out.shape[1])]


def fp8_outputs(q, k, v, causal: bool, recipes, scale=None):
    """One sequence's fp64 references (on the e4m3 inputs, on the originals) and every recipe's
    output on the per-tensor e4m3 codes: (ref_deq, ref_orig, {recipe: out})."""
    (qc, dq), (kc, dk), (vc, dv) = quantise(q), quantise(k), quantise(v)
    deq = [e4m3.decode(c) * float(d) for c, d in ((qc, dq), (kc, dk), (vc, dv))]
    ref_deq = reference.attention(*(x[None] for x in deq), causal=causal, softmax_scale=scale)[0]
    ref_orig = reference.attention(q[None], k[None], v[None], causal=causal, softmax_scale=scale)[0]
    outs = {name: sequence_forward(qc, kc, vc, name, descale_q=dq, descale_k=dk, descale_v=dv,
                                   causal=causal, softmax_scale=scale)[0] for name in recipes}
    return ref_deq, ref_orig, outs


def fp8_case(q, k, v, causal: bool, recipes, scale=None):
    """Errors of every recipe on one sequence, per head: {recipe: (deq[h], orig[h])}."""
    ref_deq, ref_orig, outs = fp8_outputs(q, k, v, causal, recipes, scale)
    res = {"fp64 on e4m3 inputs": ([0.0] * q.shape[1], per_head_errors(ref_deq, ref_orig))}
    for name, out in outs.items():
        res[name] = (per_head_errors(out, ref_deq), per_head_errors(out, ref_orig))
    return res


# ------------------------------------------------------------------------------------
# 1. Gaussian inputs

def gaussian_task(args):
    dq, dv, causal, seq, heads, seed, recipes = args
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((seq, heads, dq))
    k = rng.standard_normal((seq, heads, dq))
    v = rng.standard_normal((seq, heads, dv))
    res = fp8_case(q, k, v, causal, recipes)
    return (dq, dv, causal), {n: (float(np.mean(a)), float(np.mean(b))) for n, (a, b) in res.items()}


# ------------------------------------------------------------------------------------
# 2. SmolLM2 layers: captured post-RoPE Q, K, V

def capture(prompts, tokens):
    from bench.llm import capture_qkv, load_prompt, load_smollm2
    model = load_smollm2()
    return {p: capture_qkv(model, load_prompt(p), tokens) for p in prompts}


def derived_128(q, k, v):
    """Head-dim-128 heads derived from SmolLM2 (labelled as derived): key/value heads 0 and 1
    concatenated, and for each of their 3 query heads the matching pair concatenated, so the
    scores are the sums of two real heads' scores."""
    group = q.shape[1] // k.shape[1]
    q2 = np.concatenate([q[:, 0:group], q[:, group:2 * group]], axis=2)
    k2 = np.concatenate([k[:, 0:1], k[:, 1:2]], axis=2)
    v2 = np.concatenate([v[:, 0:1], v[:, 1:2]], axis=2)
    return q2, k2, v2


def chosen_layers(args, default):
    """The layers named by ``--layers`` (comma-separated), else ``default``."""
    return [int(x) for x in args.layers.split(",")] if args.layers else default


#: SmolLM2's own softmax scale, also for the derived d128 heads.
LAYER_SCALE = 1.0 / np.sqrt(64.0)


def layer_inputs(q, k, v, derived: bool):
    """A captured layer's Q, K, V in float64, as captured (d64) or as the derived d128 heads."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    return derived_128(q, k, v) if derived else (q, k, v)


def layer_task(args):
    key, q, k, v, recipes, derived = args
    return key, fp8_case(*layer_inputs(q, k, v, derived), True, recipes, scale=LAYER_SCALE)


# ------------------------------------------------------------------------------------
# 3. End to end: the whole model with each recipe's attention

def fp8_attention_fn(recipe):
    def attention(q, k, v, *, causal=True, softmax_scale=None):
        (qc, dq), (kc, dk), (vc, dv) = quantise(q[0]), quantise(k[0]), quantise(v[0])
        out, _ = sequence_forward(qc, kc, vc, recipe, descale_q=dq, descale_k=dk, descale_v=dv,
                                  causal=causal, softmax_scale=softmax_scale)
        return out[None]
    return attention


def log_softmax(x):
    x = np.asarray(x, np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def e2e_task(args):
    """One (attention, prompt) forward; with ``ref_file`` the per-position KL to the log
    probabilities stored there and top-1 agreement, else the log probabilities to store.
    ``name``: "fp64", "fp64 on e4m3 inputs", a recipe (per-tensor amax / 448 descales), or
    "attention|case" of the granularity study (:func:`granular_attention`)."""
    name, prompt, tokens, ref_file = args
    from bench.llm import load_prompt, load_smollm2
    model = load_smollm2()
    ids = model.encode(load_prompt(prompt))[:tokens]
    if "|" in name:
        attention = granular_attention(*name.split("|"))
    elif name == "fp64":
        attention = None
    elif name == "fp64 on e4m3 inputs":
        def attention(q, k, v, *, causal=True, softmax_scale=None):
            deq = [e4m3.decode(c) * float(d) for c, d in (quantise(x) for x in (q, k, v))]
            return reference.attention(*deq, causal=causal, softmax_scale=softmax_scale)
    else:
        attention = fp8_attention_fn(name)
    logp = log_softmax(model.forward(ids, attention=attention))
    if ref_file is None:
        return name, prompt, logp
    ref = np.load(ref_file)
    kl = np.sum(np.exp(ref) * (ref - logp), axis=-1)
    return name, prompt, (kl, ref.argmax(-1) == logp.argmax(-1))


# ------------------------------------------------------------------------------------
# 4. gfx950's adaptive merge (``Recipe.exact_within``): error and the share of the kernel's
#    (32-row wave, 64-key block) pairs in which some row rescales O

ADAPTIVE_DELTAS = (3.0, 2.0, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0)


def _adaptive_case(q, k, v, causal, scale, unit="row"):
    """Per delta: per-head errors against fp64 on the e4m3 inputs, and (rescaling wave-blocks,
    wave-blocks) over the heads; the every-block recipe ("gfx950") first."""
    from zyfa_runtime import fp8_models
    (qc, dq), (kc, dk), (vc, dv) = quantise(q), quantise(k), quantise(v)
    deq = [e4m3.decode(c) * float(d) for c, d in ((qc, dq), (kc, dk), (vc, dv))]
    ref = reference.attention(*(x[None] for x in deq), causal=causal, softmax_scale=scale)[0]
    sq, hq, hk = q.shape[0], q.shape[1], k.shape[1]
    res = {}
    for delta in (None,) + ADAPTIVE_DELTAS:
        recipe = fp8_models.RECIPES["gfx950"].replace(exact_within=delta)
        if delta is not None:
            recipe = recipe.replace(exact_unit=unit)
        errs, hits, pairs = [], 0, 0
        for h in range(hq):
            kv = h // (hq // hk)
            r = fp8_models.head_forward(qc[:, h], kc[:, kv], vc[:, kv], recipe, descale_q=dq,
                                        descale_k=dk, descale_v=dv, causal=causal,
                                        softmax_scale=scale)
            errs.append(rel(r.out, ref[:, h]))
            waves = r.rescaled[: sq // 32 * 32].reshape(sq // 32, 32, -1)
            seen = np.isfinite(r.ref_max[: sq // 32 * 32]).reshape(sq // 32, 32, -1).any(axis=1)
            hits += int((waves.any(axis=1) & seen).sum())
            pairs += int(seen.sum())
        res[delta] = (errs, hits, pairs)
    return res


def adaptive_task(args):
    kind, a, b, causal, unit = args
    if kind == "gauss":
        rng = np.random.default_rng(a)
        q, k, v = (rng.standard_normal((4096, 2, b)) for _ in range(3))
        return (kind, a, b, causal), _adaptive_case(q, k, v, causal, None, unit)
    z = np.load(a)
    q, k, v = (z[f"{b}_{i}"].astype(np.float64) for i in range(3))
    return (kind, a, b, causal), _adaptive_case(q, k, v, causal, 1.0 / np.sqrt(64.0), unit)


def adaptive(args) -> int:
    """SmolLM2 (2 prompts x 8 layers x 9 heads, 2,048 tokens, d64, causal and not) and Gaussian
    (4,096 tokens, 2 heads, d128 non-causal, d64 causal) through gfx950's recipe with each
    delta of the adaptive merge (decided per row, or per 32-row wave with ``--unit wave``);
    prints a markdown table."""
    layers = chosen_layers(args, range(1, 30, 4))
    with tempfile.TemporaryDirectory() as tmp, ProcessPoolExecutor(max_workers=args.jobs) as pool:
        caps = capture(["technical_storage", "dialogue_garden"], 2048)
        files = []
        for p, per_layer in caps.items():
            f = os.path.join(tmp, f"{p}.npz")
            np.savez(f, **{f"{layer}_{i}": per_layer[layer][i] for layer in layers for i in range(3)})
            files.append(f)
        tasks = [("gauss", args.seed, 128, False, args.unit),
                 ("gauss", args.seed + 1, 64, True, args.unit)] + \
            [("smol", f, layer, c, args.unit) for f in files for layer in layers
             for c in (True, False)]
        out = dict(pool.map(adaptive_task, tasks))

    def smol(delta, causal):
        parts = [r[delta] for key, r in out.items() if key[0] == "smol" and key[3] == causal]
        return (np.median([e for p in parts for e in p[0]]),
                sum(p[1] for p in parts) / sum(p[2] for p in parts))
    g128, g64 = out[("gauss", args.seed, 128, False)], out[("gauss", args.seed + 1, 64, True)]
    base = (smol(None, True)[0], smol(None, False)[0], np.mean(g128[None][0]), np.mean(g64[None][0]))
    print("| delta | SmolLM2 causal median (x every) | waves rescaling | SmolLM2 non-causal median "
          "(x every) | waves rescaling | Gaussian d128 4k (x every) | waves rescaling | Gaussian "
          "d64 causal 4k (x every) |")
    print("|---|---|---|---|---|---|---|---|")
    for delta in (None,) + ADAPTIVE_DELTAS:
        (mc, fc), (mn, fn) = smol(delta, True), smol(delta, False)
        e128, e64 = np.mean(g128[delta][0]), np.mean(g64[delta][0])
        f128 = g128[delta][1] / g128[delta][2]
        name = "every block" if delta is None else f"{delta:g}"
        print(f"| {name} | {mc:.5f} ({mc / base[0]:.3f}) | {100 * fc:.0f} % | {mn:.5f} "
              f"({mn / base[1]:.3f}) | {100 * fn:.0f} % | {e128:.5f} ({e128 / base[2]:.3f}) | "
              f"{100 * f128:.0f} % | {e64:.5f} ({e64 / base[3]:.3f}) |", flush=True)
    return 0


# ------------------------------------------------------------------------------------
# 5. Granularity (issue 48): Q, K, V quantised by quantize_fp8's model per tensor, per
#    (sequence, KV head) or per block (128 queries, 64 keys; V per (sequence, KV head)), with
#    or without K's mean subtracted, power-of-two descales (the default, and what gfx950's
#    E8M0 operand scales take); each through fp64 attention and the target recipes.

#: case -> (granularity, smooth_k)
GRANULARITY_CASES = {"tensor": ("tensor", False), "head": ("head", False), "head+smooth_k": ("head", True),
                     "block": ("block", False), "block+smooth_k": ("block", True)}
GRANULARITY_ATTENTION = ["fp64 on e4m3 inputs", "gfx950", "sm_90a", "aiter"]


def granular_attention(name: str, case: str):
    """The model's attention callable: q (1, T, Hq, D), k, v quantised by quantize_model at
    ``case``, then fp64 attention on the codes times their descales, or recipe ``name`` with
    those descales.  smooth_k leaves the output unchanged in exact arithmetic (every score of
    a row shifts by the same q . mean); only the LSE moves, which the model does not use."""
    granularity, smooth_k = GRANULARITY_CASES[case]

    def attention(q, k, v, *, causal=True, softmax_scale=None):
        z = quantize_model.quantize_fp8(q, k, v, granularity=granularity, smooth_k=smooth_k)
        kw = dict(descale_q=z.descale_q, descale_k=z.descale_k, descale_v=z.descale_v, causal=causal,
                  softmax_scale=softmax_scale)
        if name == "fp64 on e4m3 inputs":
            return reference.attention(*(e4m3.decode(c) for c in (z.q, z.k, z.v)), **kw)
        return reference.fp8_attention(z.q, z.k, z.v, recipe=name, **kw)
    return attention


def granular_layer_task(args):
    """One captured layer: per (case, attention) the per-head errors against fp64 on the
    dequantised inputs of that case ("deq") and on the unquantised inputs ("orig")."""
    key, q, k, v, cases = args
    q, k, v = (x.astype(np.float64)[None] for x in (q, k, v))
    kw = dict(causal=True, softmax_scale=1.0 / np.sqrt(64.0))
    orig = reference.attention(q, k, v, **kw)[0]
    res = {}
    for case in cases:
        outs = {n: granular_attention(n, case)(q, k, v, **kw)[0] for n in GRANULARITY_ATTENTION}
        deq = outs["fp64 on e4m3 inputs"]
        for n, out in outs.items():
            res[(case, n)] = (per_head_errors(out, deq), per_head_errors(out, orig))
    return key, res


def input_errors(args) -> int:
    """What quantisation alone does to SmolLM2's Q, K, V (one prompt, every layer, 2,048 tokens):
    per case and power_of_two, the relative error ||deq - x|| / ||x|| of each tensor (with
    smooth_k: of K reconstructed as its codes' values plus the mean), mean over layers, and the
    share of elements whose dequantised value differs from the per-tensor one (power-of-two
    descales; "-" where every value moves: fp32 descales, K plus its fp32 mean); prints a table."""
    layers = chosen_layers(args, range(30))
    caps = capture(["technical_storage"], 2048)["technical_storage"]
    rows = {}
    for layer in layers:
        x = [a[None].astype(np.float32) for a in caps[layer]]
        deq = {}
        for p2 in (True, False):
            for case, (g, smooth) in GRANULARITY_CASES.items():
                z = quantize_model.quantize_fp8(*x, granularity=g, smooth_k=smooth, power_of_two=p2)
                group = 1 if g == "block" else x[0].shape[2] // x[1].shape[2]    # block: per query head
                d = [quantize_model.dequantize(z.q, z.descale_q, granularity=g, block=quantize_model.Q_BLOCK,
                                               heads_of_group=group),
                     quantize_model.dequantize(z.k, z.descale_k, granularity=g, block=quantize_model.K_BLOCK)
                     + z.mean[:, None],
                     quantize_model.dequantize(z.v, z.descale_v, granularity=g)]
                deq[(case, p2)] = d
                errs = [rel(a, b) for a, b in zip(d, x)]
                # a power-of-two descale moves no value that stays in e4m3's normal range
                moved = [float(np.mean(a != b)) if p2 and not (smooth and t == 1) else np.nan
                         for t, (a, b) in enumerate(zip(d, deq[("tensor", p2)]))]
                rows.setdefault((case, p2), []).append(errs + moved)
    print("| granularity | descales | Q error | K error | V error | Q moved | K moved | V moved |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (case, p2), vals in rows.items():
        m = np.mean(vals, axis=0)
        print(f"| {case} | {'2^e' if p2 else 'amax / 448'} | " + " | ".join(f"{100 * e:.2f} %" for e in m[:3])
              + " | " + " | ".join("-" if np.isnan(e) else f"{100 * e:.3f} %" for e in m[3:]) + " |", flush=True)
    return 0


#: The causal diagonal's forms (fp8_models.Recipe.diagonal): sm_90a's two e4m3 terms, the
#: studied f16 P, one byte; FA3's recipe for scale.
DIAGONAL_STUDY = ("sm_90a", "sm_90a/f16", "sm_90a/one", "fa3")


def diagonal_task(args):
    layer, q, k, v, derived = args
    q, k, v = layer_inputs(q, k, v, derived)
    ref, _, outs = fp8_outputs(q, k, v, True, DIAGONAL_STUDY, scale=LAYER_SCALE)
    edge = np.r_[0:128, q.shape[0] - 128:q.shape[0]]
    return (derived, layer), {name: (per_head_errors(out, ref), per_head_errors(out[edge], ref[edge]))
                              for name, out in outs.items()}


def diagonal(args) -> int:
    """The causal diagonal's forms on SmolLM2 (one prompt, 2,048 tokens, the --layers layers;
    the d64 heads as captured and the derived d128 ones): each recipe's median per-head error
    against fp64 on the e4m3 inputs, over every row and over the first and last 128 (prints a
    table)."""
    layers = chosen_layers(args, range(1, 30, 4))
    caps = capture(["technical_storage"], 2048)["technical_storage"]
    tasks = [(layer, *caps[layer], derived) for derived in (False, True) for layer in layers]
    errs: dict = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for (derived, _layer), res in pool.map(diagonal_task, tasks):
            for name, (every, edge) in res.items():
                e = errs.setdefault((derived, name), ([], []))
                e[0].extend(every)
                e[1].extend(edge)
    print(f"SmolLM2 'technical_storage', 2,048 tokens, causal, layers {list(layers)}: median per-head error")
    print("| heads | recipe | every row | first and last 128 rows |")
    print("|---|---|---:|---:|")
    for (derived, name), (every, edge) in errs.items():
        print(f"| {'d128 (derived)' if derived else 'd64'} | {name} | {np.median(every):.2e} | {np.median(edge):.2e} |")
    return 0


def granularity(args) -> int:
    """Per-head error on SmolLM2's layers and end-to-end KL for every (case, attention);
    writes its table between the ``<!-- granularity:begin/end -->`` markers of docs/numerics.md
    and its numbers under "granularity" in docs/numerics.json (other keys kept)."""
    cases = list(GRANULARITY_CASES) if args.granularity == "all" else args.granularity.split(",")
    unknown = set(cases) - set(GRANULARITY_CASES)
    if unknown:
        raise SystemExit(f"unknown granularity cases {sorted(unknown)}; known: {list(GRANULARITY_CASES)}")
    layer_tokens = 512 if args.quick else 2048
    layers = chosen_layers(args, range(0, 30, 10) if args.quick else range(30))
    prompts_layers = ["technical_storage"] if args.quick else ["technical_storage", "dialogue_garden"]
    e2e_prompts = ["prose_lighthouse"] if args.quick else ["prose_lighthouse", "technical_storage",
                                                          "dialogue_garden"]
    e2e_tokens = 128 if args.quick else 400
    t0 = time.monotonic()
    data = {"settings": dict(quick=args.quick, cases=cases, layer_tokens=layer_tokens, layers=list(layers),
                             prompts=prompts_layers, e2e_prompts=e2e_prompts, e2e_tokens=e2e_tokens,
                             descales="power of two (quantize_fp8's default)", inputs="fp32 activations")}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        # End to end first: the fp64 model's log probabilities, then each (case, attention).
        with tempfile.TemporaryDirectory() as tmp:
            ref_files = {}
            for _, p, lp in pool.map(e2e_task, [("fp64", p, e2e_tokens, None) for p in e2e_prompts]):
                ref_files[p] = os.path.join(tmp, f"{p}.npy")
                np.save(ref_files[p], lp)
            keys = [(c, n, p) for c in cases for n in GRANULARITY_ATTENTION for p in e2e_prompts]
            e2e = {(c, n, p): res for (c, n, p), (_, _, res) in
                   zip(keys, pool.map(e2e_task, [(f"{n}|{c}", p, e2e_tokens, ref_files[p]) for c, n, p in keys]))}
        t_e2e = time.monotonic() - t0
        print(f"end to end done {t_e2e:.0f}s", flush=True)
        caps = capture(prompts_layers, layer_tokens)
        tasks = [((p, layer), *caps[p][layer], cases) for p in prompts_layers for layer in layers]
        layer_res = dict(pool.map(granular_layer_task, tasks))
        print(f"layers done {time.monotonic() - t0:.0f}s", flush=True)

    today = json.loads((ROOT / "docs" / "numerics.json").read_text())
    today_kl_aiter = today["end_to_end"]["aiter"]["fp64"]["kl"]
    rows, out = [], {}
    for c in cases:
        for n in GRANULARITY_ATTENTION:
            kl = float(np.mean(np.concatenate([e2e[(c, n, p)][0] for p in e2e_prompts])))
            top1 = float(np.mean(np.concatenate([e2e[(c, n, p)][1] for p in e2e_prompts])))
            errs = [layer_res[key][(c, n)] for key in layer_res]
            deq = float(np.median([e for e_deq, _ in errs for e in e_deq]))
            orig = float(np.median([e for _, e_orig in errs for e in e_orig]))
            out[f"{n}|{c}"] = dict(kl=kl, top1=top1, median_deq=deq, median_orig=orig,
                                   today_median_orig=today["smollm2_layers"][f"{n}|d64|orig"][0])
    base = out.get("aiter|tensor", {}).get("kl")
    for key, r in out.items():
        n, c = key.split("|")
        vs_run = f"{r['kl'] / base:.2f}x" if base else "-"
        rows.append(f"| `{n}` | {c} | {r['kl']:.3e} | {vs_run} | {r['kl'] / today_kl_aiter:.2f}x | "
                    f"{100 * r['top1']:.1f}% | {r['median_orig']:.4f} | "
                    f"{r['median_orig'] / r['today_median_orig']:.2f}x | {r['median_deq']:.4f} |")
    data["results"] = out
    data["today"] = dict(aiter_kl=today_kl_aiter)
    data["seconds"] = dict(end_to_end=t_e2e, total=time.monotonic() - t0)
    n_pos = e2e_tokens * len(e2e_prompts)
    table = "\n".join([
        f"_Generated by `python bench/accuracy.py --granularity {args.granularity}"
        f"{' --quick' if args.quick else ''}{' --layers ' + args.layers if args.layers else ''}` "
        f"({data['seconds']['total'] / 60:.0f} min on {args.jobs} processes; raw numbers under \"granularity\" in `docs/numerics.json`). KL(p_fp64 || p) in nats "
        f"over {n_pos} next-token positions of {len(e2e_prompts)} prompts, every layer's attention "
        f"quantised and computed so; per-head relative error over {len(prompts_layers)} prompts x "
        f"{len(list(layers))} layers x {layer_tokens} tokens x 9 heads, median, against fp64 attention "
        f"on the unquantised inputs (\"orig\") and on the dequantised ones (\"deq\"); \"today\": the "
        f"per-tensor amax / 448 figures of the tables above (AITER's KL {today_kl_aiter:.3e})._",
        "",
        "| attention | granularity | KL | KL / AITER per tensor (this run) | KL / AITER today | top-1 "
        "| median error orig | / today's per-tensor | median error deq |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
        *rows])
    md = args.out.read_text()
    if "<!-- granularity:begin -->" in md and not args.quick:
        head, rest = md.split("<!-- granularity:begin -->", 1)
        _, tail = rest.split("<!-- granularity:end -->", 1)
        args.out.write_text(head + "<!-- granularity:begin -->\n" + table + "\n<!-- granularity:end -->" + tail)
    if not args.quick:
        js = args.out.with_suffix(".json")
        full = json.loads(js.read_text())
        full["granularity"] = data
        js.write_text(json.dumps(full, indent=1) + "\n")
    print(table)
    return 0


# ------------------------------------------------------------------------------------

def median_table(rows: dict, cols: list[str]) -> str:
    out = ["| recipe | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for name, vals in rows.items():
        out.append(f"| `{name}` | " + " | ".join(vals) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes and few layers")
    ap.add_argument("--jobs", type=int, default=max(1, len(os.sched_getaffinity(0))))
    ap.add_argument("--seed", type=int, default=20261130)
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "numerics.md")
    ap.add_argument("--adaptive", action="store_true",
                    help="sweep gfx950's adaptive merge (prints a table, writes nothing)")
    ap.add_argument("--unit", choices=("row", "wave"), default="row",
                    help="--adaptive: who decides exact or lattice, each row or each 32-row wave")
    ap.add_argument("--layers", default="",
                    help="--adaptive, --granularity: SmolLM2 layers, comma-separated (default 1, 5, ..., 29 "
                         "and all 30)")
    ap.add_argument("--granularity", default="",
                    help="the granularity study: 'all' or cases, comma-separated, of "
                         + ", ".join(GRANULARITY_CASES) + " (writes only its own table and JSON key; "
                         "with --quick writes nothing)")
    ap.add_argument("--input-errors", action="store_true",
                    help="what quantize_fp8's model does to SmolLM2's Q, K, V per granularity (prints a table)")
    ap.add_argument("--diagonal", action="store_true",
                    help="the causal diagonal's forms (two terms, f16, one byte) on SmolLM2 (prints a table)")
    args = ap.parse_args(argv)
    if args.input_errors:
        return input_errors(args)
    if args.diagonal:
        return diagonal(args)
    if args.adaptive:
        return adaptive(args)
    if args.granularity:
        return granularity(args)

    gauss_seq, gauss_heads = (256, 2) if args.quick else (1024, 4)
    layer_tokens = 512 if args.quick else 2048
    layers = range(0, 30, 10) if args.quick else range(30)
    prompts_layers = ["technical_storage"] if args.quick else ["technical_storage", "dialogue_garden"]
    e2e_prompts = ["prose_lighthouse"] if args.quick else ["prose_lighthouse", "technical_storage",
                                                          "dialogue_garden"]
    e2e_tokens = 128 if args.quick else 400
    t0 = time.monotonic()
    data = {"settings": dict(quick=args.quick, seed=args.seed, gauss=[gauss_seq, gauss_heads],
                             layer_tokens=layer_tokens, layers=list(layers), prompts=prompts_layers,
                             e2e_prompts=e2e_prompts, e2e_tokens=e2e_tokens)}

    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        # 1. Gaussian
        tasks = [(dq, dv, c, gauss_seq, gauss_heads, args.seed + i, STUDY)
                 for i, ((dq, dv), c) in enumerate((hd, c) for hd in HEAD_DIMS for c in (False, True))]
        gauss = dict(pool.map(gaussian_task, tasks))
        print(f"gaussian done {time.monotonic() - t0:.0f}s", flush=True)

        # 2. SmolLM2 layers (and derived d128 heads)
        caps = capture(prompts_layers, layer_tokens)
        print(f"captured {time.monotonic() - t0:.0f}s", flush=True)
        tasks = [((p, layer, derived), *caps[p][layer], STUDY, derived)
                 for p in prompts_layers for layer in layers for derived in (False, True)]
        layer_res = dict(pool.map(layer_task, tasks))
        print(f"layers done {time.monotonic() - t0:.0f}s", flush=True)

        # 3. End to end: fp64-attention log probabilities first, then every other forward
        #    compares against them in its own process.
        with tempfile.TemporaryDirectory() as tmp:
            refs = ("fp64", "fp64 on e4m3 inputs")
            ref_files = {}
            for r, p, lp in pool.map(e2e_task, [(r, p, e2e_tokens, None) for r in refs
                                                for p in e2e_prompts]):
                ref_files[(r, p)] = os.path.join(tmp, f"{len(ref_files)}.npy")
                np.save(ref_files[(r, p)], lp)
            keys = [(ref, r, p) for ref in refs
                    for r in (["fp64 on e4m3 inputs"] if ref == "fp64" else []) + STUDY
                    for p in e2e_prompts]
            tasks = [(r, p, e2e_tokens, ref_files[(ref, p)]) for ref, r, p in keys]
            by_ref = {ref: {} for ref in refs}
            for (ref, r, p), (_, _, res) in zip(keys, pool.map(e2e_task, tasks)):
                by_ref[ref][(r, p)] = res
        print(f"end to end done {time.monotonic() - t0:.0f}s", flush=True)

    names = ["fp64 on e4m3 inputs"] + STUDY
    # Gaussian table: mean over heads, deq / orig
    cols = [f"d{dq}/{dv} {'causal' if c else 'full'}" for (dq, dv) in HEAD_DIMS for c in (False, True)]
    g_rows = {n: [f"{gauss[(dq, dv, c)][n][0]:.4f} / {gauss[(dq, dv, c)][n][1]:.4f}"
                  for (dq, dv) in HEAD_DIMS for c in (False, True)] for n in names}
    data["gaussian"] = {f"{dq}x{dv}_{'causal' if c else 'full'}": gauss[(dq, dv, c)]
                        for (dq, dv) in HEAD_DIMS for c in (False, True)}

    # Layer table: median (and 90th percentile) over (prompt, layer, head)
    def stats(derived: bool, name: str, which: int):
        vals = [e for (p, layer, d), res in layer_res.items() if d == derived
                for e in res[name][which]]
        return np.median(vals), np.percentile(vals, 90)
    l_rows, l_data = {}, {}
    for n in names:
        cells = []
        for derived in (False, True):
            for which in (0, 1):
                med, p90 = stats(derived, n, which)
                cells.append(f"{med:.4f} ({p90:.4f})")
                l_data[f"{n}|{'d128' if derived else 'd64'}|{'deq' if which == 0 else 'orig'}"] = \
                    [float(med), float(p90)]
        l_rows[n] = cells
    data["smollm2_layers"] = l_data
    per_layer = {n: [float(np.median(layer_res[(prompts_layers[0], layer, False)][n][0]))
                     for layer in layers] for n in ("aiter", "fa3", "gfx950", "sm_90a", "lean64")}
    data["smollm2_per_layer_deq_median"] = per_layer

    # End to end: KL(p_fp64 || p_recipe) mean over positions, top-1 agreement
    e_rows, e_data = {}, {}
    for n in ["fp64 on e4m3 inputs"] + STUDY:
        row, e_data[n] = [], {}
        for ref in ("fp64", "fp64 on e4m3 inputs"):
            if (n, e2e_prompts[0]) not in by_ref[ref]:
                row += ["-", "-"]
                continue
            kl = float(np.mean(np.concatenate([by_ref[ref][(n, p)][0] for p in e2e_prompts])))
            top1 = float(np.mean(np.concatenate([by_ref[ref][(n, p)][1] for p in e2e_prompts])))
            row += [f"{kl:.3e}", f"{100 * top1:.1f}%"]
            e_data[n][ref] = {"kl": kl, "top1": top1}
        e_rows[n] = row
    data["end_to_end"] = e_data
    data["seconds"] = time.monotonic() - t0

    n_pos = e2e_tokens * len(e2e_prompts)
    tables = "\n".join([
        f"_Generated by `python bench/accuracy.py{' --quick' if args.quick else ''}` "
        f"({data['seconds'] / 60:.0f} min on {args.jobs} processes); raw numbers in "
        f"`docs/numerics.json`._",
        "",
        f"### Gaussian inputs (S = {gauss_seq}, {gauss_heads} heads, mean over heads): "
        "relative error, deq / orig",
        "",
        median_table(g_rows, cols),
        "",
        f"### SmolLM2-135M layers ({len(prompts_layers)} prompts x {len(list(layers))} layers x "
        f"{layer_tokens} tokens, causal): median (90th percentile) of the per-head relative error",
        "",
        "d64 are the model's own heads (9 query / 3 key-value heads); d128 are derived heads "
        "(pairs of real heads concatenated, so each score is the sum of two real scores).",
        "",
        median_table(l_rows, ["d64 deq", "d64 orig", "d128 (derived) deq", "d128 (derived) orig"]),
        "",
        f"### End to end: the whole model with each recipe's attention in every layer "
        f"({n_pos} next-token positions, {len(e2e_prompts)} prompts)",
        "",
        "KL(p_ref || p_recipe) in nats, mean over positions, and top-1 agreement, against two "
        "references: the model with fp64 attention on the original Q/K/V (\"orig\": what a user "
        "sees, dominated by the per-tensor quantisation of Q/K/V) and with fp64 attention on the "
        "e4m3 Q/K/V (\"deq\": the attention arithmetic alone).",
        "",
        median_table(e_rows, ["KL orig", "top-1 orig", "KL deq", "top-1 deq"]),
    ])
    doc = args.out.read_text() if args.out.exists() else "<!-- tables:begin -->\n<!-- tables:end -->\n"
    head, rest = doc.split("<!-- tables:begin -->", 1)
    _, tail = rest.split("<!-- tables:end -->", 1)
    args.out.write_text(head + "<!-- tables:begin -->\n" + tables + "\n<!-- tables:end -->" + tail)
    args.out.with_suffix(".json").write_text(json.dumps(data, indent=1) + "\n")
    print(tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
