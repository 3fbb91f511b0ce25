"""A numpy llama forward pass (SmolLM2-135M from GGUF) for real attention activations."""

from .gguf_model import (
    Config,
    Model,
    Tokenizer,
    attention_fp64,
    capture_qkv,
    find_smollm2_gguf,
    load_gguf_llama,
    load_prompt,
    load_smollm2,
    prompt_names,
)

__all__ = ["Config", "Model", "Tokenizer", "attention_fp64", "capture_qkv",
           "find_smollm2_gguf", "load_gguf_llama", "load_prompt", "load_smollm2",
           "prompt_names"]
