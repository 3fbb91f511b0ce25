"""Two-term diagonal everywhere vs only where a row's group sees < 256 keys (rows 0-255), vs
never: SmolLM2 layers, causal, error against fp64 on the same e4m3 inputs, all rows and the
harness's rows (first and last 128).  The limited recipe's rows are taken from the two others:
the rule depends only on a row's position, and rows are computed independently."""
import sys
import numpy as np
sys.path.insert(0, ".")
from bench.accuracy import quantise, derived_128
from zyfa_runtime import e4m3, reference
from zyfa_runtime.fp8_models import sequence_forward

T = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
d = np.load("build/smollm2_qkv.npz")
res = {"everywhere": [], "first 256 keys": [], "never": []}
harness = {k: [] for k in res}
for layer in range(d["q"].shape[0]):
    for derived in (False, True):
        q, k, v = (d[n][layer, :T].astype(np.float64) for n in ("q", "k", "v"))
        if derived:
            q, k, v = derived_128(q, k, v)
        scale = 1 / np.sqrt(64.0)
        (qc, dq), (kc, dk), (vc, dv) = quantise(q), quantise(k), quantise(v)
        deq = [e4m3.decode(c) * float(s) for c, s in ((qc, dq), (kc, dk), (vc, dv))]
        ref = reference.attention(*(x[None] for x in deq), causal=True, softmax_scale=scale)[0]
        outs = {}
        for name, rec in (("everywhere", "sm_90a"), ("never", "sm_90a/one")):
            outs[name] = sequence_forward(qc, kc, vc, rec, descale_q=dq, descale_k=dk, descale_v=dv,
                                          causal=True, softmax_scale=scale)[0]
        outs["first 256 keys"] = np.concatenate([outs["everywhere"][:256], outs["never"][256:]])
        rows = np.r_[0:128, T - 128:T]
        for name, o in outs.items():
            for h in range(o.shape[1]):
                res[name].append((f"{'d128' if derived else 'd64'}", reference.relative_error(o[:, h], ref[:, h])))
                harness[name].append((f"{'d128' if derived else 'd64'}", reference.relative_error(o[rows, h], ref[rows, h])))
print(f"SmolLM2, {T} tokens, causal: median (90th percentile) per-head relative error")
for dd in ("d64", "d128"):
    for name in res:
        a = np.array([e for t, e in res[name] if t == dd]); b = np.array([e for t, e in harness[name] if t == dd])
        print(f"{dd:5s} {name:15s} all rows {np.median(a):.2e} ({np.percentile(a, 90):.2e})   "
              f"harness rows {np.median(b):.2e} ({np.percentile(b, 90):.2e})")
