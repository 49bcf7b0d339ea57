"""Assemble a training run: target, data split, drafter (new or upgraded)."""

import hashlib
import os
from pathlib import Path
from typing import Optional, Sequence

import mlx.core as mx

from ..engine.drafter.config import DrafterConfig
from ..engine.drafter.model import Drafter
from ..errors import DFlashError
from ..engine.pair import Pair, fingerprint
from ..loading.builtin import resolve_builtin
from ..loading.checkpoints import load_drafter, load_target
from .data import Packed, pack_examples, read_examples, regenerate
from .export import new_drafter_config, upgraded_config
from .feature_store import FeatureStore
from .outdir import check_out_dir
from .trainer import DrafterTrainer, TrainConfig


def find_mask_token(target, tokenizer) -> int:
    """A mask id that is an embedding row but never a generated text token."""
    vocab = tokenizer.get_vocab() if hasattr(tokenizer, "get_vocab") else {}
    if "<|mask|>" in vocab:
        return vocab["<|mask|>"]
    if target.embedding_rows > len(vocab):
        return len(vocab)  # first row past the tokenizer, as Qwen3 drafters use
    # No spare row (SmolLM2: 49,152 rows, all tokens): a special token that neither ends nor
    # frames a turn, so the model never writes it in an answer (SmolLM2: <empty_output>).
    template = getattr(tokenizer, "chat_template", None) or ""
    framing = {getattr(tokenizer, a, None) for a in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")}
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    spare = [i for i, tok in added.items() if getattr(tok, "special", False) and i not in framing
             and i < target.embedding_rows and str(tok) not in template]
    if spare:
        return max(spare)
    raise DFlashError("the target has no spare embedding row or unused special token for a mask token: "
                      "pass --mask-token-id")


def is_heldout(name: str, fraction: float) -> bool:
    """Deterministic split of whole examples (files, modules) by name."""
    h = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return h < fraction


def upgrade_to_dflash2(source: Drafter, config: dict) -> Drafter:
    """A DFlash 2 drafter holding `source`'s backbone, conv and selector at identity."""
    drafter = Drafter(DrafterConfig.from_dict(config), fc_in_features=source.fc.weight.shape[1])
    drafter.update(source.parameters())  # same backbone config: the shapes match by construction
    init_selector(drafter, seed=0)
    return drafter


def init_selector(drafter: Drafter, seed: int) -> None:
    """docs/algorithm.md §3: A ~ N(0, 0.02) and B = 0, so the first scores are the drafter's logits."""
    sel = drafter.candidate_selector
    sel.predecessor_codebook.weight = 0.02 * mx.random.normal(sel.predecessor_codebook.weight.shape,
                                                              key=mx.random.key(seed))
    sel.successor_codebook.weight = mx.zeros_like(sel.successor_codebook.weight)


def check_run_options(kind: str = "dflash2", num_layers: int = 1, block_size: int = 16, seq_len: int = 256,
                      selector_rank: int = 256, regenerate_tokens: int = 0,
                      target_layer_ids: Optional[Sequence[int]] = None) -> None:
    """The shape options, refused before any folder is made or model loaded."""
    if target_layer_ids is not None and (not target_layer_ids or min(target_layer_ids) < 0):
        raise DFlashError(f"--target-layers {list(target_layer_ids)} must be layer numbers from 0, e.g. 1,15,28")
    if kind not in ("dflash", "dflash2"):
        raise DFlashError(f"--kind '{kind}' is not one of dflash, dflash2")
    for flag, value in (("--layers", num_layers), ("--selector-rank", selector_rank)):
        if value < 1:
            raise DFlashError(f"{flag} {value} must be at least 1")
    if regenerate_tokens < 0:
        raise DFlashError(f"--regenerate {regenerate_tokens} must be 0 (off) or a number of tokens")
    if block_size < 2:
        raise DFlashError(f"--block-size {block_size} must be at least 2")
    if seq_len <= block_size:
        raise DFlashError(f"--block-size {block_size} does not fit --seq-len {seq_len}: a block needs context before it")


def prepare(
    target_ref: str,
    data: Sequence[str],
    out_dir,
    *,
    kind: str = "dflash2",
    num_layers: int = 1,
    block_size: int = 16,
    seq_len: int = 256,
    init_from: Optional[str] = None,
    mask_token_id: Optional[int] = None,
    regenerate_tokens: int = 0,
    heldout_fraction: float = 0.05,
    selector_rank: int = 256,
    target_layer_ids: Optional[Sequence[int]] = None,
    feature_store: Optional[str] = None,
    config: TrainConfig = TrainConfig(),
    group=None,
) -> DrafterTrainer:
    check_run_options(kind, num_layers, block_size, seq_len, selector_rank, regenerate_tokens, target_layer_ids)
    out_dir = Path(out_dir).expanduser()
    check_out_dir(out_dir)  # before anything is written into it
    examples = read_examples(data)  # bad data fails before the folder is made
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".write-test-{os.getpid()}"  # one per process: ranks share the folder
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise DFlashError(f"cannot write to output folder '{out_dir}' ({e.strerror}): choose another --out") from None

    target, tokenizer = load_target(resolve_builtin(target_ref, "target"), activation_dtype=mx.float32)
    if mx.default_device() == mx.cpu:
        float_weights(target)
    if target_layer_ids and max(target_layer_ids) >= target.num_layers:
        raise DFlashError(f"--target-layers {list(target_layer_ids)}: the target has layers 0-{target.num_layers - 1}")
    if init_from:
        from ..loading.hub import resolve
        from ..loading.checkpoints import read_config

        ref = resolve_builtin(init_from, "drafter")
        source = load_drafter(ref, activation_dtype=mx.float32)
        if kind == "dflash" and source.is_dflash2:
            raise DFlashError("--init-from gives a DFlash 2 drafter but --kind is dflash")
        source_pair = Pair.make(target, source)  # raises when it does not fit
        # The run keeps the source's own config (sliding layers, rank, transforms...).
        dcfg = read_config(resolve(ref, "drafter"), "drafter")
        dcfg.pop("quantization", None), dcfg.pop("quantization_config", None)
        dcfg.setdefault("dflash_config", {})["target_layer_ids"] = list(source_pair.layer_ids)
        drafter = source
        if kind == "dflash2" and not source.is_dflash2:
            dcfg = upgraded_config(dcfg, selector_rank)
            drafter = upgrade_to_dflash2(source, dcfg)
    else:
        mask = find_mask_token(target, tokenizer) if mask_token_id is None else mask_token_id
        dcfg = new_drafter_config(target, kind, num_layers, block_size, mask, selector_rank,
                                  target_layer_ids=target_layer_ids)
        mx.random.seed(config.seed)  # the initial weights are part of the run's identity
        drafter = Drafter(DrafterConfig.from_dict(dcfg), fc_in_features=len(dcfg["dflash_config"]["target_layer_ids"]) * target.hidden_size)
        if kind == "dflash2":
            init_selector(drafter, config.seed)
    drafter.set_dtype(mx.float32)
    if regenerate_tokens:
        examples = regenerate(examples, target.model, tokenizer, regenerate_tokens)
    held = [e for e in examples if is_heldout(e.source, heldout_fraction)]
    train = [e for e in examples if not is_heldout(e.source, heldout_fraction)] or examples
    eos = tokenizer.eos_token_id
    packed = pack_examples(train, tokenizer, seq_len, eos)
    sequences = packed.tokens
    if not held:
        import warnings

        warnings.warn("no held-out examples in --data (too few files or lines): evaluation uses "
                      "training sequences, so its numbers are not held-out")
    held_packed = pack_examples(held, tokenizer, seq_len, eos) if held else Packed(sequences[:8], packed.answers[:8])
    heldout = held_packed.tokens
    # Blocks are drawn inside the answers, where the target writes at inference (packing.sample_anchors).
    trainer = DrafterTrainer(target, drafter, dcfg, sequences, heldout, config, out_dir, group,
                             answers=(packed.answers, held_packed.answers))
    if feature_store:
        identity = fingerprint(target.model, [target.model_type])
        ids = trainer.pair.layer_ids
        trainer.use_feature_stores(FeatureStore(feature_store, target, ids, sequences, identity, "train"),
                                   FeatureStore(feature_store, target, ids, heldout, identity, "heldout"))
    return trainer


def float_weights(target) -> None:
    """Dequantize a quantized target in place (float32): the same function, and on a
    CPU the float matmuls are the fast ones (SmolLM2's prefill on one core here: 8
    tokens/s quantized, 209 in float32 through recipes/blas_shim). The target is frozen, so
    its features are what the quantized model computes, up to rounding."""
    from mlx_lm.utils import dequantize_model

    if any(hasattr(m, "bits") for _, m in target.model.named_modules()):
        dequantize_model(target.model)
        target.model.set_dtype(mx.float32)
