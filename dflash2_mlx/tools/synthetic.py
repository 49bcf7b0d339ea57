"""Small random checkpoints in the real formats, for tests and offline benchmarks.

Targets are written the way mlx-lm writes them (config.json + safetensors,
optionally quantized by mlx-lm's own `quantize_model`), tokenizers as a
byte-level BPE `tokenizer.json`, drafters with exactly the released key names
and nesting (see shared fixtures), scaled down. Everything loads through the
same code paths as a Hub checkpoint.
"""

import json
import shutil
from pathlib import Path
from typing import Optional

import mlx.core as mx
from mlx.utils import tree_flatten, tree_map_with_path

from ..engine.drafter.config import DFLASH2_ARCH, DFLASH_ARCH, DrafterConfig
from ..engine.drafter.model import Drafter
from ..loading.model_classes import model_classes
from ..train.export import released_weights

EOS = "<|endoftext|>"

# Tiny configs per supported family; keys are the HF config keys.
TARGET_CONFIGS = {
    "qwen3": dict(head_dim=16, rope_theta=10000.0, max_position_embeddings=2048),
    "qwen2": dict(rope_theta=10000.0, max_position_embeddings=2048),
    "llama": dict(head_dim=16, rope_theta=10000.0, max_position_embeddings=2048),
    "mistral": dict(head_dim=16, rope_theta=10000.0, max_position_embeddings=2048),
    # Phi-3: fused qkv and gate_up projections (its GGUF files keep them fused too).
    "phi3": dict(rope_theta=10000.0, max_position_embeddings=2048, original_max_position_embeddings=2048),
    "qwen3_moe": dict(
        head_dim=16, rope_theta=10000.0, max_position_embeddings=2048, num_experts=4,
        num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[], moe_intermediate_size=32,
        norm_topk_prob=True,
    ),
    # Hybrid targets: Gated DeltaNet layers with an attention layer every second one.
    "qwen3_5": dict(
        head_dim=16, max_position_embeddings=2048, linear_num_value_heads=4, linear_num_key_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, full_attention_interval=2,
    ),
    "qwen3_5_moe": dict(
        head_dim=16, max_position_embeddings=2048, linear_num_value_heads=4, linear_num_key_heads=2,
        linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4, full_attention_interval=2,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
    ),
    "qwen3_next": dict(
        head_dim=16, rope_theta=10000.0, partial_rotary_factor=0.25, max_position_embeddings=2048,
        linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
        linear_conv_kernel_dim=4, full_attention_interval=2, num_experts=4, num_experts_per_tok=2,
        decoder_sparse_step=1, mlp_only_layers=[], moe_intermediate_size=32, shared_expert_intermediate_size=32,
    ),
    # Sliding-window target: [local, local, local, global] layers, a tiny window. Pass
    # tie_word_embeddings=False (as the real model): tied, the random model echoes its input.
    "muse_glimmer": dict(
        head_dim=16, rope_theta=10000.0, max_position_embeddings=2048, sliding_window=8,
        output_multiplier=0.19611613513818404, final_logit_softcapping=20.0,
    ),
    # Gemma 3 text: [local, local, global] repeating, a tiny window, the embedding
    # scaled by sqrt(hidden_size). Tied (as the real checkpoints) means no lm_head
    # tensor: mlx-lm decides tying from the weights.
    "gemma3_text": dict(
        head_dim=16, rope_theta=10000.0, rope_local_base_freq=10000.0, query_pre_attn_scalar=16,
        max_position_embeddings=2048, sliding_window=8, sliding_window_pattern=3,
    ),
}


def target_config(model_type: str, vocab_size: int = 384, hidden_size: int = 64,
                  num_hidden_layers: int = 4, tie_word_embeddings: bool = True, **overrides) -> dict:
    config = dict(
        model_type=model_type, hidden_size=hidden_size, num_hidden_layers=num_hidden_layers,
        intermediate_size=2 * hidden_size, num_attention_heads=4, num_key_value_heads=2,
        rms_norm_eps=1e-6, vocab_size=vocab_size, tie_word_embeddings=tie_word_embeddings,
        eos_token_id=0,
    )
    config.update(TARGET_CONFIGS[model_type])
    config.update(overrides)
    return config


def _save(folder: Path, weights: dict, config: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(folder / "model.safetensors"), weights, metadata={"format": "mlx"})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def write_target(folder, model_type: str = "qwen3", seed: int = 0, quantize_bits: Optional[int] = None,
                 dtype=mx.float32, tokenizer_text: Optional[str] = None, **dims) -> Path:
    """A random mlx-lm target (optionally quantized as `mlx_lm.convert -q` does) plus tokenizer."""
    from mlx_lm.utils import quantize_model

    folder = Path(folder)
    config = target_config(model_type, **dims)
    model_cls, args_cls = model_classes(config)
    mx.random.seed(seed)
    model = model_cls(args_cls.from_dict(config))
    # Default init makes tiny models repeat one token; larger projections give
    # varied greedy continuations, which makes parity tests meaningful.
    model.update(tree_map_with_path(lambda p, x: x * 2.5 if p.endswith("proj.weight") else x,
                                    model.parameters()))
    model.set_dtype(dtype)
    if quantize_bits:
        model, config = quantize_model(model, config, group_size=32, bits=quantize_bits)
    weights = dict(tree_flatten(model.parameters()))
    if config["tie_word_embeddings"]:
        # Models that build a head anyway (gemma3_text) tie when the file has none.
        weights = {k: v for k, v in weights.items() if not k.startswith("lm_head.")}
    _save(folder, weights, config)
    write_tokenizer(folder, config["vocab_size"] - 2, tokenizer_text)
    return folder


def _training_text() -> str:
    import inspect
    import textwrap

    return textwrap.dedent(inspect.getsource(textwrap)) * 2


def write_tokenizer(folder, vocab_size: int = 382, text: Optional[str] = None) -> None:
    """A byte-level BPE tokenizer with `<|endoftext|>` as token 0 and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS, "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator([text or _training_text()], trainer)
    folder = Path(folder)
    tok.save(str(folder / "tokenizer.json"))
    template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": EOS, "pad_token": EOS,
        "chat_template": template, "model_max_length": 2048,
    }, indent=2))


def drafter_config_dict(target: dict, kind: str = "dflash2", num_layers: int = 2, block_size: int = 16,
                        target_layer_ids: Optional[list[int]] = None, nested_block_size: bool = True,
                        rope_nested: bool = False, sliding: bool = False, **dflash) -> dict:
    """A drafter config.json with the released nesting, sized for `target`."""
    H = target["hidden_size"]
    n_target = target["num_hidden_layers"]
    ids = target_layer_ids if target_layer_ids is not None else [1, n_target - 2][:num_layers]
    mask = target["vocab_size"] - 1  # an embedding row past the tokenizer, like Qwen3's 151669
    config = {
        "architectures": [DFLASH2_ARCH if kind == "dflash2" else DFLASH_ARCH],
        "model_type": "qwen3", "hidden_size": H, "intermediate_size": 2 * H,
        "num_hidden_layers": num_layers, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": H // 4, "rms_norm_eps": 1e-6, "vocab_size": target["vocab_size"],
        "max_position_embeddings": 2048, "attention_bias": False, "tie_word_embeddings": True,
        "num_target_layers": n_target, "dtype": "bfloat16",
        "layer_types": ["sliding_attention" if sliding else "full_attention"] * num_layers,
        "use_sliding_window": sliding, "sliding_window": 8 if sliding else None,
        "dflash_config": {"mask_token_id": mask, "target_layer_ids": ids},
    }
    if rope_nested:
        config["rope_parameters"] = {"rope_theta": 10000.0, "rope_type": "default"}
    else:
        config["rope_theta"] = 10000.0
    if nested_block_size:
        config["dflash_config"]["block_size"] = block_size
    else:
        config["block_size"] = block_size
    if kind == "dflash2":
        config["is_causal"] = False
        config["dflash_config"].update(
            {"conv_group_size": 16, "conv_kernel_size": 2, "selector_rank": 32, "selector_top_k": 16}
        )
    config["dflash_config"].update(dflash)
    return config


def random_drafter(config: dict, seed: int = 0, trained_extras: bool = True) -> Drafter:
    """A drafter with random weights; `trained_extras` also randomises the conv
    corrections and the successor codebook (identity/zero at init)."""
    mx.random.seed(seed)
    dc = DrafterConfig.from_dict(config)
    n_taps = len(dc.target_layer_ids)  # filled from num_target_layers when the file has no ids
    drafter = Drafter(dc, fc_in_features=n_taps * config["hidden_size"])
    if dc.is_dflash2 and trained_extras:
        for layer in drafter.layers:
            for conv in (layer.attention_conv, layer.mlp_conv):
                conv.kernel_projection.weight = 0.05 * mx.random.normal(conv.kernel_projection.weight.shape)
                conv.base_kernel = conv.base_kernel + 0.1 * mx.random.normal(conv.base_kernel.shape)
        sel = drafter.candidate_selector
        sel.successor_codebook.weight = 0.5 * mx.random.normal(sel.successor_codebook.weight.shape)
        sel.predecessor_codebook.weight = 0.5 * mx.random.normal(sel.predecessor_codebook.weight.shape)
    return drafter


def write_drafter(folder, config: dict, seed: int = 0, codebook_suffix: bool = False,
                  trained_extras: bool = True) -> Path:
    drafter = random_drafter(config, seed, trained_extras)
    return _save(Path(folder), released_weights(drafter, codebook_suffix=codebook_suffix), config)


def write_demo_pair(root) -> dict[str, Path]:
    """A random qwen3 target with DFlash and DFlash 2 drafters, for trying the
    tool offline before any real model is downloaded (the text is noise)."""
    root = Path(root)
    target = write_target(root / "target", "qwen3")
    config = json.loads((target / "config.json").read_text())
    return {
        "target": target,
        "dflash2": write_drafter(root / "dflash2", drafter_config_dict(config, "dflash2")),
        "dflash": write_drafter(root / "dflash", drafter_config_dict(config, "dflash")),
    }


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python -m dflash2_mlx.tools.synthetic OUT_FOLDER")
    for name, path in write_demo_pair(sys.argv[1]).items():
        print(f"{name}: {path}")


# Every token of it distinct, and none a token the agent tests' prompts end with (write_fixed_answer_target).
FIXED_ANSWER = " Answer from the tiny model"


def write_fixed_answer_target(folder: Path, context: int = 65536, answer: str = FIXED_ANSWER, layers: int = 1,
                              heads: int = 1, head_dim: int = 16, call: Optional[dict] = None) -> Path:
    """A tiny qwen3 in the real format, with the built-in target's tokenizer and chat template
    (which renders tools) and a context that holds the clients' default prompts (Claude Code's
    is ~28k of its tokens), whose greedy answer to any prompt is `answer` and then its
    end-of-text token: the protocol's model (issue 47 allows a look-alike), whose answer a
    test can find in a client's output. Its weights are set, not trained: every layer's output
    projections are zero, so the last hidden state is the last token's embedding; embeddings
    of ordinary tokens share one direction, which the head maps to the answer's first token,
    and each answer token has a direction of its own, mapped to the token after it (the last
    to end-of-text). So a prompt whose last token is one of the answer's gets the answer's rest
    only. Every layer still runs: the prefill and the prompt cache are real.

    With `call` ({"name", "arguments"}) it is a tool caller: its answer to any prompt is that call
    in the template's format, `<tool_call>{...}</tool_call>`, and its answer to a prompt that
    ends with a tool's result (`</tool_response>`) is `answer`. The tags and the call's JSON are
    tokens added to the vocabulary (as Qwen's tokenizers add `<tool_call>`): a call's text
    repeats tokens, which an answer that follows the last token alone cannot."""
    from tokenizers import AddedToken, Tokenizer

    folder = Path(folder)
    if (folder / "config.json").exists():
        return folder
    hidden, base = 64, 4096
    added = ["<tool_call>", json.dumps(call, separators=(",", ":")), "</tool_call>", "</tool_response>"] if call else []
    # By default one layer and one narrow head: the clients' 10k-28k-token prompts prefill in seconds.
    write_target(folder, "qwen3", hidden_size=hidden, intermediate_size=128, num_hidden_layers=layers,
                 num_attention_heads=heads, num_key_value_heads=1, head_dim=head_dim, vocab_size=base + len(added),
                 max_position_embeddings=context, tie_word_embeddings=False)
    builtin = Path(__file__).resolve().parents[1] / "builtin" / "target"
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        shutil.copy(builtin / name, folder / name)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    if added:
        tokenizer.add_tokens([AddedToken(t, normalized=False) for t in added])
        tokenizer.save(str(folder / "tokenizer.json"))
    text_ids = tokenizer.encode(answer).ids
    chains = [[tokenizer.token_to_id(t) for t in added[:3]], text_ids] if call else [text_ids]
    flat = [i for chain in chains for i in chain]
    assert len(set(flat)) == len(flat) and 0 not in flat and len(flat) + 2 < hidden, "answer tokens must be distinct"
    weights = dict(mx.load(str(folder / "model.safetensors")))
    embed = 0.01 * mx.random.normal((base + len(added), hidden), key=mx.random.key(0))
    embed[:, 0] = 1.0  # the direction every ordinary token shares
    head = mx.zeros((base + len(added), hidden))
    head[chains[0][0], 0] = 10.0
    dim = 1
    for chain in chains:  # each token its own direction, read as "next is the chain's next token"
        for i, token in enumerate(chain):
            embed[token] = mx.zeros((hidden,))
            embed[token, dim] = 1.0
            head[chain[i + 1] if i + 1 < len(chain) else 0, dim] = 10.0
            dim += 1
    if call:  # a tool's result is answered with the text
        result_end = tokenizer.token_to_id(added[3])
        embed[result_end] = mx.zeros((hidden,))
        embed[result_end, dim] = 1.0
        head[text_ids[0], dim] = 10.0
    weights["model.embed_tokens.weight"], weights["lm_head.weight"] = embed, head
    for name in list(weights):
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name] = mx.zeros_like(weights[name])
    mx.save_safetensors(str(folder / "model.safetensors"), weights)
    return folder
