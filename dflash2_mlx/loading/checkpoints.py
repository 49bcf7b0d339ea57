"""Load targets (through mlx-lm) and drafters (strictly, from the released format)."""

import json
from pathlib import Path
from typing import Optional

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten, tree_map_with_path

from ..engine.drafter.config import DrafterConfig
from ..engine.drafter.model import Drafter
from ..errors import CheckpointError, ConfigError
from ..device import default_activation_dtype, target_activation_dtype
from .hub import resolve
from .safetensors_header import check_safetensors
from .target_checks import check_target_folder
from .quantize import apply_saved_quantization, is_quantized, saved_activation_dtype, unpacked_width
from ..engine.target.adapter import Target, check_supported
from .sharded import barrier, shard_target


def read_config(folder: Path, what: str) -> dict:
    path = folder / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{what} folder '{folder}' has no config.json")
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{what} config '{path}' is not valid JSON ({e.msg}, line {e.lineno})") from None
    except UnicodeDecodeError:
        raise CheckpointError(f"{what} config '{path}' is not valid JSON (not UTF-8 text)") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{what} config '{path}' is not a JSON object")
    return config


def read_safetensors(folder: Path, what: str) -> dict[str, mx.array]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{what} folder '{folder}' has no .safetensors weights")
    weights = {}
    for f in files:
        check_safetensors(f, what)
        try:
            weights.update(mx.load(str(f)))
        except Exception as e:  # mlx raises bare RuntimeError/ValueError on bad files
            raise CheckpointError(
                f"{what} weights '{f}' are truncated or corrupt ({str(e).splitlines()[0]}): "
                "download them again"
            ) from None
    return weights


# -- target --------------------------------------------------------------------


def cast_floating(model, dtype) -> None:
    """Cast float parameters to `dtype`. Downcasts skip what the model keeps in
    its own precision (mlx-lm's `cast_predicate`, e.g. qwen3_5's A_log);
    upcasting to fp32 loses nothing, so it covers every float parameter."""
    keep = getattr(model, "cast_predicate", None)
    if keep is None or dtype == mx.float32:
        keep = lambda _: True  # noqa: E731
    model.update(tree_map_with_path(
        lambda path, x: x.astype(dtype) if mx.issubdtype(x.dtype, mx.floating) and keep(path) else x,
        model.parameters(),
    ))


def majority_dtype(counts) -> mx.Dtype:
    """The dtype holding the most elements among (dtype, count) pairs (fp32 when there are none):
    from loaded weights here, from safetensors headers in `doctor`."""
    sizes: dict = {}
    for dtype, count in counts:
        sizes[dtype] = sizes.get(dtype, 0) + count
    return max(sizes, key=sizes.get) if sizes else mx.float32


def stored_float_dtype(model: nn.Module) -> mx.Dtype:
    """The float dtype most of `model`'s float weights were stored in (fp32 when it has none)."""
    return majority_dtype((x.dtype, x.size) for _, x in tree_flatten(model.parameters())
                          if mx.issubdtype(x.dtype, mx.floating))


def has_experts(model: nn.Module) -> bool:
    """Whether `model` has mixture-of-experts layers (mlx-lm's switch layers)."""
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

    return any(isinstance(m, (SwitchLinear, QuantizedSwitchLinear)) for _, m in model.named_modules())


def load_target(
    ref: str,
    revision: Optional[str] = None,
    activation_dtype: Optional[mx.Dtype] = None,
    tokenizer_config: Optional[dict] = None,
    group: Optional[mx.distributed.Group] = None,
    time_collectives: bool = True,
):
    """Load an mlx-lm target and its tokenizer. Returns (Target, TokenizerWrapper).

    Quantized targets (mlx-lm's `quantization` metadata) keep their packed
    weights; only float parameters and activations take `activation_dtype`.
    With a distributed `group` of more than one rank the target is split over
    it (tensor or pipeline parallel, loading/sharded.py) and `time_collectives` times its
    all_sums.
    """
    from mlx_lm.utils import load_model, load_tokenizer  # 1 s of imports: keep lazy

    folder = resolve(ref, "target", revision)
    config = read_config(folder, "target")
    model_type = config.get("model_type")
    if model_type is None:
        raise CheckpointError(f"target config '{folder}/config.json' has no model_type")
    check_supported(model_type)
    if not list(folder.glob("*.safetensors")):
        raise CheckpointError(f"target folder '{folder}' has no .safetensors weights")
    check_target_folder(folder, config)
    sharded = group is not None and group.size() > 1
    # What the checks above cannot foresee is still about this folder, not a bug here:
    # mlx-lm and tokenizers raise whatever their parsers meet (tokenizers a bare Exception).
    try:
        # Split targets load lazily: each rank materialises only its slices.
        model, config = load_model(folder, lazy=sharded)
    except Exception as e:
        raise CheckpointError(f"target '{ref}' does not load ({_first_line(e)}): check its config.json "
                              "and weights, or download them again") from None
    target = shard_target(model, model_type, group, time_collectives) if sharded else None
    cast_floating(model, activation_dtype or target_activation_dtype(stored_float_dtype(model), is_quantized(model),
                                                                     has_experts(model)))
    try:
        tokenizer = load_tokenizer(folder, tokenizer_config, eos_token_ids=config.get("eos_token_id"))
    except Exception as e:
        raise CheckpointError(f"target '{ref}' tokenizer does not load ({_first_line(e)}): check its "
                              "tokenizer files, or download them again") from None
    _no_length_warning(tokenizer)
    if sharded:
        mx.eval(model.parameters())
        barrier(group)
    return target or Target(model), tokenizer


def _no_length_warning(tokenizer) -> None:
    """Switch off transformers' warning about a prompt over the tokenizer's
    `model_max_length`: the model's own context is checked before prefill
    (text/context.py), and refused in one line that says what to do."""
    hf = getattr(tokenizer, "_tokenizer", tokenizer)
    given = getattr(hf, "deprecation_warnings", None)
    if isinstance(given, dict):  # transformers' record of the warnings it gave once
        given["sequence-length-is-longer-than-the-specified-maximum"] = True


def _first_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


# -- drafter -------------------------------------------------------------------


def sanitize_drafter_weights(weights: dict[str, mx.array], folder: Path) -> dict[str, mx.array]:
    """The one place checkpoint names are fixed."""
    out = {}
    for name, value in weights.items():
        if name.startswith("model."):
            name = name[len("model.") :]
        if name.startswith(("lm_head.", "embed_tokens.")):
            raise ConfigError(
                f"drafter '{folder}' ships its own '{name}': drafters that carry an LM head "
                "or embedding are not supported (DFlash drafters use the target's)"
            )
        if name.endswith(("_codebook",)) and name.startswith("candidate_selector."):
            name = name + ".weight"
        if name in out:  # e.g. both codebook spellings, or with and without `model.`
            raise CheckpointError(f"drafter '{folder}' has tensor '{name}' twice (under two spellings)")
        out[name] = value
    return out


def check_weights(model: nn.Module, weights: dict[str, mx.array], folder: Path) -> None:
    """Strict load: every tensor present, none extra, every shape as built."""
    expected = dict(tree_flatten(model.parameters()))
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise CheckpointError(f"drafter '{folder}' is missing tensor '{missing[0]}'{more}")
    if extra:
        more = f" and {len(extra) - 1} more" if len(extra) > 1 else ""
        raise CheckpointError(
            f"drafter '{folder}' has unexpected tensor '{extra[0]}'{more}: it does not match its config.json"
        )
    for name, value in weights.items():
        if tuple(value.shape) != tuple(expected[name].shape):
            raise CheckpointError(
                f"drafter '{folder}' tensor '{name}' has shape {tuple(value.shape)}, "
                f"config.json implies {tuple(expected[name].shape)}"
            )


def load_drafter(
    ref: str,
    revision: Optional[str] = None,
    activation_dtype: Optional[mx.Dtype] = None,
) -> Drafter:
    """Load a DFlash or DFlash 2 drafter (or an MLX-quantized copy of one)."""
    folder = resolve(ref, "drafter", revision)
    raw = read_config(folder, "drafter")
    config = DrafterConfig.from_dict(raw)
    weights = sanitize_drafter_weights(read_safetensors(folder, "drafter"), folder)
    if "fc.weight" not in weights:
        raise CheckpointError(f"drafter '{folder}' is missing tensor 'fc.weight'")
    quantization = raw.get("quantization")
    # The fc input width is n_taps × target hidden: read it from the file.
    fc_in = unpacked_width(weights["fc.weight"].shape[1], quantization, "fc")
    drafter = Drafter(config, fc_in_features=fc_in)
    if quantization:
        apply_saved_quantization(drafter, quantization)
    check_weights(drafter, weights, folder)
    drafter.load_weights(list(weights.items()), strict=True)
    drafter.set_dtype(activation_dtype or saved_activation_dtype(raw) or default_activation_dtype())
    drafter.eval()
    mx.eval(drafter.parameters())
    return drafter
