"""Sampling fields shared by the OpenAI and Anthropic bodies.

Every number is bounded here, before it reaches MLX or a C type: a count
(max_tokens, top_k, a penalty's context) fits an int32, a seed the 64-bit
MLX key it becomes, and each token id the target's vocabulary.
"""

import re

from ..engine.sampling import SamplingParams
from .errors import ApiError
from .fields import check_range, get, shown

COUNT_MAX = 2**31 - 1  # counts reach MLX as int32
SEED_MAX = 2**64 - 1  # a seed becomes an unsigned 64-bit MLX key
_TOKEN_KEY = re.compile(r"-?[0-9]{1,20}")  # ASCII digits only: int() reads other scripts' digits too


def read_sampling(body: dict, max_temperature: float) -> SamplingParams:
    """Temperature 0 (greedy) unless asked, as `dflash2 generate`; 422 outside the ranges.
    (A tiny temperature decodes greedily: the request's rule, engine/request.py.)"""
    temperature = get(body, "temperature", float, 0.0)
    top_p = get(body, "top_p", float, 1.0)
    top_k = get(body, "top_k", int, 0)
    min_p = get(body, "min_p", float, 0.0)
    seed = get(body, "seed", int)
    check_range("temperature", temperature, 0.0, max_temperature)
    check_range("top_p", top_p, 0.0, 1.0, low_open=True)
    if top_k == -1:  # vLLM's spelling of "off"
        top_k = 0
    check_range("top_k", top_k, 0, COUNT_MAX)
    check_range("min_p", min_p, 0.0, 1.0)
    check_range("seed", seed, 0, SEED_MAX)
    return SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed)


def read_max_tokens(body: dict, keys: tuple[str, ...], default: int, required: bool = False) -> int:
    for key in keys:
        value = get(body, key, int)
        if value is not None:
            check_range(key, value, 1, COUNT_MAX)
            return value
    if required:
        raise ApiError(400, f"'{keys[0]}' is required", keys[0])
    return default


def check_model(body: dict, settings) -> None:
    """Any model name is served by the loaded pair, unless the server was started with
    --strict-model-name: then only its served names (a 404 names them)."""
    model = get(body, "model", str)
    if model is not None and settings.strict_model_names and model not in settings.served_names:
        names = ", ".join(f"'{n}'" for n in settings.served_names)
        raise ApiError(404, f"model '{model}' is not served here: use {names} (see GET /v1/models)", "model")


def check_prompt_length(ids: list, limit: int, param: str) -> None:
    if len(ids) > limit:
        raise ApiError(400, f"the prompt has {len(ids)} tokens, over this server's limit of {limit} "
                            "(--max-prompt-tokens): shorten it", param)
    if not ids:
        raise ApiError(400, "the prompt is empty", param)


def read_logits(body: dict) -> tuple:
    """Logit bias and penalties as mlx-lm's `make_logits_processors` keywords (name, value)
    pairs; OpenAI's ranges (bias in [-100, 100], presence / frequency in [-2, 2]) and mlx-lm's
    repetition_penalty (in (0, 100]) with its context sizes (default 20, as mlx-lm's server)."""
    out = []
    bias = get(body, "logit_bias", dict)
    if bias:
        pairs = []
        for key, value in bias.items():
            if not _TOKEN_KEY.fullmatch(key) or isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ApiError(400, "'logit_bias' maps token ids (as strings of digits) to numbers", "logit_bias")
            check_range("logit_bias", value, -100.0, 100.0)
            if int(key) < 0:
                raise ApiError(422, f"'logit_bias' names token {key}: token ids are 0 or more", "logit_bias")
            pairs.append((int(key), float(value)))
        out.append(("logit_bias", tuple(sorted(pairs))))
    for name, low, high in (("presence_penalty", -2.0, 2.0), ("frequency_penalty", -2.0, 2.0)):
        value = get(body, name, float, 0.0)
        check_range(name, value, low, high)
        if value:
            out += [(name, value), (name.replace("penalty", "context_size"),
                                    get(body, name.replace("penalty", "context_size"), int, 20))]
    repetition = get(body, "repetition_penalty", float)
    if repetition is not None and repetition != 1.0:
        check_range("repetition_penalty", repetition, 0.0, 100.0, low_open=True)  # a bound: far past 1 it just bans them
        out += [("repetition_penalty", repetition),
                ("repetition_context_size", get(body, "repetition_context_size", int, 20))]
    for name, value in out:
        if name.endswith("context_size"):
            check_range(name, value, 1, COUNT_MAX)
    return tuple(out)


def check_token_ids(ids, vocab_size: int, param: str) -> None:
    """400 at the first id outside the target's vocabulary: MLX reads an embedding row
    past the table's end (a crash), and a negative id overflows a C type."""
    for i, token in enumerate(ids):
        if not 0 <= token < vocab_size:
            raise ApiError(400, f"'{param}'[{i}] is {shown(token)}: token ids must be in [0, {vocab_size - 1}]",
                           param)


def check_vocabulary(logits: tuple, vocab_size: int) -> None:
    """A logit_bias token past the vocabulary is a 422 (mlx-lm would index out of range)."""
    for name, value in logits:
        if name == "logit_bias":
            for token, _ in value:
                if token >= vocab_size:
                    raise ApiError(422, f"'logit_bias' names token {shown(token)}: this model has {vocab_size} tokens",
                                   "logit_bias")
