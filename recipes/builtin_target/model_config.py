"""The built-in target's architecture: one dict, used for training and for export.

A plain HF `qwen3` config so both transformers' Qwen3ForCausalLM (training) and
mlx-lm's `qwen3` model (inference) read it. rope_theta stays top-level (the
transformers-4 form) because transformers 5 still accepts it and mlx-lm reads it
directly; no `rope_parameters`, so mlx-lm does not treat it as rope scaling.
~4.0M parameters: 4096x192 tied embedding (0.79M) + 8 x 0.41M layers.
"""

from __future__ import annotations

ARCH = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "vocab_size": 4096,
    "hidden_size": 192,
    "intermediate_size": 512,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 48,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "tie_word_embeddings": True,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "use_sliding_window": False,
    "sliding_window": None,
    "initializer_range": 0.02,
    "bos_token_id": None,
    "eos_token_id": 0,  # <|endoftext|>
    "pad_token_id": 0,
    "use_cache": True,
}


def hf_config():
    from transformers import Qwen3Config

    kw = {k: v for k, v in ARCH.items() if k not in ("architectures", "model_type", "rope_scaling")}
    kw["use_cache"] = False  # training: no KV cache
    return Qwen3Config(**kw)
