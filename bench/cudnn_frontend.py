"""The cuDNN frontend's SDPA graphs as peers of bench/peers.py: ``cudnn_fe_bf16`` (``sdpa``) and
``cudnn_fe_fp8`` (``sdpa_fp8``), built once per point on the harness's own tensors.

The Python package is ``cudnn`` from the ``nvidia-cudnn-frontend`` wheel, on the cuDNN library
that torch loads (9.19 with torch 2.11 + CUDA 13).  Where it is not installed, or a graph is
refused, ``build`` raises and the harness reports the peer as missing with the reason.

Layouts: Q, K, V and O stay in the harness's [B, S, H, D] memory; the graph sees them as
(b, h, s, d) with strides (S H D, D, H D, 1).  Grouped-query attention is native (K and V have
Hkv heads).  Causal is the top-left diagonal with no key past the query's own index, which is
the harness's bottom-right alignment when Sq == Sk (the only case built here).

FP8 (e4m3 Q, K, V with the harness's per-tensor descales): S is quantised for the PV product
with scale 448 and descale 1/448 (P in [0, 1] onto e4m3's range).  The output is asked for in
bf16 first; cuDNN 9.19 refuses that on Hopper (bf16 output from FP8 inputs is a Blackwell
feature there), and then the graph writes e4m3 with scale_o = 448 / max|V|: every output row is
a convex combination of V's rows, so |O| <= max|V| and O fills e4m3's range without overflow.
``Graph.out_scale`` is that factor (1 for bf16 output); dividing by it dequantises O.
"""

from __future__ import annotations

E4M3_MAX = 448.0

_UID = dict(q=1, k=2, v=3, o=4, descale_q=5, descale_k=6, descale_v=7, scale_s=8, descale_s=9,
            scale_o=10, amax_o=11)


def _module():
    """The frontend's ``cudnn`` module, on torch's libcudnn (loaded first), or an error that
    names the wheel to install."""
    import torch
    torch.backends.cudnn.version()   # torch's libcudnn loaded before the frontend looks for one
    try:
        import cudnn
    except ImportError as e:
        raise RuntimeError(f"the cuDNN frontend is not installed (pip install nvidia-cudnn-frontend): "
                           f"{type(e).__name__}: {e}") from e
    return cudnn


_HANDLES: dict = {}


def _handle(cudnn, stream: int):
    """One cuDNN handle per process, bound to ``stream`` (torch's current stream)."""
    h = _HANDLES.get("handle")
    if h is None:
        h = _HANDLES["handle"] = cudnn.create_handle()
    cudnn.set_stream(h, stream)
    return h


def versions() -> dict:
    """The frontend's and the cuDNN library's versions, or why there are none."""
    try:
        cudnn = _module()
        return {"cudnn_frontend": getattr(cudnn, "__version__", "present"),
                "cudnn_backend": cudnn.backend_version_string()}
    except Exception as e:   # noqa: BLE001
        return {"cudnn_frontend": f"missing: {type(e).__name__}: {str(e).splitlines()[0][:200]}"}


def _bhsd(g, uid, t, data_type):
    """Graph tensor of a [B, S, H, D] torch tensor, seen as (b, h, s, d)."""
    b, s, h, d = t.shape
    sb, ss, sh, sd = t.stride()
    return g.tensor(uid=uid, dim=(b, h, s, d), stride=(sb, sh, ss, sd), data_type=data_type)


#: The keyword of the causal band's right bound, by the frontend's bindings: ``sdpa_fp8`` takes
#: ``right_bound`` and ``sdpa`` ``diagonal_band_right_bound`` in 1.32; either may take the other
#: elsewhere.  The graph's ops capture their arguments and check them when the graph is built,
#: so a keyword is tried by building the whole graph.
CAUSAL_KEYWORDS = {"sdpa_fp8": ("right_bound", "diagonal_band_right_bound"),
                   "sdpa": ("diagonal_band_right_bound", "right_bound")}


class Graph:
    """One SDPA graph for fixed tensors; ``run()`` executes it on torch's current stream.

    ``left_bound``: a sliding window, the band's left bound (None: none).
    ``q``, ``k``, ``v``: [B, S, H, D] torch tensors (bf16, or float8_e4m3fn with fp32 descale
    tensors of one element ``descales``); ``out``: the [B, S, Hq, Dv] output, bf16, or e4m3 where
    the FP8 graph's bf16 output is refused (``out_dtype``, ``out_scale``)."""

    def __init__(self, q, k, v, causal: bool, sm_scale: float, descales=None, left_bound=None):
        import torch
        cudnn = _module()
        if q.shape[1] != k.shape[1] and causal:
            raise NotImplementedError("cudnn_fe causal with Sq != Sk is not built here")
        self.fp8 = descales is not None
        self.handle = _handle(cudnn, torch.cuda.current_stream().cuda_stream)
        dt = cudnn.data_type
        B, S, Hq, _ = q.shape
        Dv = v.shape[3]
        refusals = []
        for out_fp8 in ((False, True) if self.fp8 else (False,)):
            out = torch.empty(B, S, Hq, Dv, device=q.device,
                              dtype=torch.float8_e4m3fn if out_fp8 else torch.bfloat16)
            try:
                self._build_any_keyword(cudnn, dt, q, k, v, out, causal, sm_scale, out_fp8, left_bound)
            except Exception as e:   # noqa: BLE001  (the graph refused: the next output type)
                refusals.append(f"{'e4m3' if out_fp8 else 'bf16'} output: {type(e).__name__}: "
                                + " / ".join(str(e).strip().splitlines())[:600])
                continue
            self.out = out
            self.out_dtype = "e4m3" if out_fp8 else "bf16"
            self.refusals = refusals
            break
        else:
            raise RuntimeError("cuDNN frontend graph refused: " + " | ".join(refusals))
        self.workspace = torch.empty(max(self.g.get_workspace_size(), 1), dtype=torch.uint8, device=q.device)
        self.out_scale = 1.0
        self.pack = {_UID["q"]: q, _UID["k"]: k, _UID["v"]: v, _UID["o"]: self.out}
        if self.fp8:
            one = lambda x: torch.full((1, 1, 1, 1), float(x), dtype=torch.float32, device=q.device)  # noqa: E731
            dq, dk, dv = descales
            if self.out_dtype == "e4m3":
                v_max = float(v.float().abs().amax()) * float(dv.reshape(-1)[0])
                self.out_scale = E4M3_MAX / max(v_max, 1e-30)
            self.pack.update({_UID["descale_q"]: dq.reshape(1, 1, 1, 1), _UID["descale_k"]: dk.reshape(1, 1, 1, 1),
                              _UID["descale_v"]: dv.reshape(1, 1, 1, 1), _UID["scale_s"]: one(E4M3_MAX),
                              _UID["descale_s"]: one(1.0 / E4M3_MAX), _UID["scale_o"]: one(self.out_scale),
                              _UID["amax_o"]: one(0.0)})
        try:
            self.plan = str(self.g.get_plan_name_at_index(0))
        except Exception:   # noqa: BLE001
            self.plan = None

    def _build_any_keyword(self, cudnn, dt, q, k, v, out, causal, sm_scale, out_fp8, left_bound=None):
        """``_build`` with the causal bound under each keyword the op may take (a TypeError: the
        binding did not take it)."""
        names = CAUSAL_KEYWORDS["sdpa_fp8" if self.fp8 else "sdpa"] if causal else (None,)
        for i, name in enumerate(names):
            try:
                return self._build(cudnn, dt, q, k, v, out, sm_scale, out_fp8, name, left_bound)
            except TypeError:
                if i + 1 == len(names):
                    raise

    def _build(self, cudnn, dt, q, k, v, out, sm_scale, out_fp8, bound_keyword, left_bound=None):
        io = dt.FP8_E4M3 if self.fp8 else dt.BFLOAT16
        g = cudnn.pygraph(io_data_type=io, intermediate_data_type=dt.FLOAT, compute_data_type=dt.FLOAT,
                          handle=self.handle)
        tq, tk, tv = (_bhsd(g, _UID[n], t, io) for n, t in (("q", q), ("k", k), ("v", v)))
        causal_kw = ({"diagonal_alignment": cudnn.diagonal_alignment.TOP_LEFT, bound_keyword: 0}
                     if bound_keyword else {})
        if left_bound is not None:   # a sliding window: the band's left bound (bench/features.py)
            causal_kw["diagonal_band_left_bound"] = int(left_bound)
        if self.fp8:
            scalar = lambda n: g.tensor(uid=_UID[n], dim=(1, 1, 1, 1), stride=(1, 1, 1, 1),  # noqa: E731
                                        data_type=dt.FLOAT)
            kw = dict(q=tq, k=tk, v=tv, descale_q=scalar("descale_q"), descale_k=scalar("descale_k"),
                      descale_v=scalar("descale_v"), descale_s=scalar("descale_s"),
                      scale_s=scalar("scale_s"), scale_o=scalar("scale_o"), generate_stats=False,
                      attn_scale=sm_scale)
            o, _stats, _amax_s, amax_o = g.sdpa_fp8(**kw, **causal_kw)
            amax_o.set_uid(_UID["amax_o"]).set_output(True).set_dim((1, 1, 1, 1)) \
                  .set_stride((1, 1, 1, 1)).set_data_type(dt.FLOAT)
        else:
            kw = dict(q=tq, k=tk, v=tv, generate_stats=False, attn_scale=sm_scale)
            o, _stats = g.sdpa(**kw, **causal_kw)
        b, s, h, d = out.shape
        sb, ss, sh, sd = out.stride()
        o.set_uid(_UID["o"]).set_output(True).set_dim((b, h, s, d)).set_stride((sb, sh, ss, sd)) \
         .set_data_type(dt.FP8_E4M3 if out_fp8 else dt.BFLOAT16)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        self.g = g

    def run(self):
        self.g.execute(self.pack, self.workspace, handle=self.handle)

    def notes(self) -> dict:
        n = {"output": self.out_dtype, "plan": self.plan}
        if self.fp8:
            n["out_scale"] = self.out_scale
        if self.refusals:
            n["refused"] = self.refusals
        return n
