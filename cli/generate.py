"""`dflash2 generate`: one completion, streamed or as one JSON object."""

import json
import sys

from dflash2_mlx.errors import DFlashError

from . import options as o
from . import ui


def read_prompt(prompt):
    if prompt is None:
        raise DFlashError("no prompt: pass --prompt TEXT (or --prompt - to read stdin)")
    return sys.stdin.read() if prompt == "-" else prompt


def generate(
    model: o.Model = "builtin",
    drafter: o.Drafter = "builtin",
    prompt: o.Prompt = None,
    max_tokens: o.MaxTokens = 256,
    temp: o.Temp = 0.0,
    top_p: o.TopP = 1.0,
    top_k: o.TopK = 0,
    min_p: o.MinP = 0.0,
    seed: o.Seed = None,
    block_size: o.BlockSize = None,
    draft_quant: o.DraftQuant = None,
    system_prompt: o.SystemPrompt = None,
    ignore_chat_template: o.IgnoreChatTemplate = False,
    chat_template_config: o.ChatTemplateConfig = None,
    ar: o.AR = False,
    json_output: o.Json = False,
    debug: o.Debug = False,
):
    """Generate a completion with DFlash / DFlash 2 speculative decoding (or --ar)."""
    from dflash2_mlx.sampling import SamplingParams

    # Everything checkable without loading a model is checked first.
    sampling = SamplingParams(temperature=temp, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed)
    if block_size is not None and block_size < 2:
        raise DFlashError(f"--block-size {block_size} is too small: a block holds the anchor and at least one draft (use 2 or more)")
    if max_tokens < 1:
        raise DFlashError(f"--max-tokens {max_tokens} must be at least 1")
    if ar and (block_size is not None or draft_quant):
        import warnings

        warnings.warn("--block-size and --draft-quant do nothing with --ar (no drafter is used)")
    template_kwargs = parse_template_config(chat_template_config)
    text = read_prompt(prompt)
    if not text.strip():
        raise DFlashError("the prompt is empty: give some text (or '-' to read stdin)")

    from dflash2_mlx.generate import stream_generate
    from dflash2_mlx.loading import load_pair
    from dflash2_mlx.prompt import build_prompt

    target, tokenizer, draft = load_pair(model, None if ar else drafter, draft_quant)
    if draft is not None and block_size is not None and block_size > draft.config.block_size:
        raise DFlashError(
            f"--block-size {block_size} exceeds this drafter's block_size {draft.config.block_size}"
        )
    ids = build_prompt(tokenizer, text, system_prompt, not ignore_chat_template, template_kwargs)
    responses = stream_generate(
        target, tokenizer, ids, drafter=draft, max_tokens=max_tokens, sampling=sampling,
        block_size=block_size,
    )
    tokens, from_draft, pieces, last = [], [], [], None
    for r in responses:
        tokens.append(r.token)
        from_draft.append(r.from_draft)
        pieces.append(r.text)
        if not json_output:
            ui.stream_text(r.text)
        last = r
    if json_output:
        record = {
            "text": "".join(pieces), "prompt_token_ids": ids, "token_ids": tokens,
            "from_draft": from_draft, "stats": last.stats.to_dict(),
        }
        sys.stdout.write(json.dumps(record) + "\n")
    else:
        ui.print_closing(last.stats)


def parse_template_config(raw):
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as e:
        raise DFlashError(f"--chat-template-config is not valid JSON ({e.msg}): e.g. '{{\"enable_thinking\": false}}'") from None
    if not isinstance(value, dict):
        raise DFlashError("--chat-template-config must be a JSON object, e.g. '{\"enable_thinking\": false}'")
    return value
