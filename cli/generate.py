"""`dflash2 generate`: one completion, streamed or as one JSON object."""

import json
from pathlib import Path
from typing import Optional

from . import closing, distributed
from . import inputs
from . import options as o
from .exactness import exactness
from .stdio import write_whole


def generate(
    model: o.Model = "builtin",
    drafter: o.Drafter = None,
    prompt: o.Prompt = None,
    max_tokens: o.MaxTokens = 256,
    temp: o.Temp = 0.0,
    top_p: o.TopP = 1.0,
    top_k: o.TopK = 0,
    min_p: o.MinP = 0.0,
    seed: o.Seed = None,
    block_size: o.BlockSize = "auto",
    recalibrate: o.Recalibrate = False,
    tree: o.Tree = 0,
    draft_quant: o.DraftQuant = None,
    draft_window: o.DraftWindow = None,
    system_prompt: o.SystemPrompt = None,
    ignore_chat_template: o.IgnoreChatTemplate = False,
    chat_template_config: o.ChatTemplateConfig = None,
    ar: o.AR = False,
    json_output: o.Json = False,
    json_schema: o.JsonSchema = None,
    regex: o.Regex = None,
    processes: o.Processes = None,
    hostfile: o.Hostfile = None,
    rank_timeout: o.RankTimeout = 300.0,
    time_collectives: o.TimeCollectives = True,
    debug: o.Debug = False,
):
    """Generate a completion with DFlash / DFlash 2 speculative decoding (or --ar).

    With --processes N or --hostfile FILE the target is split over N ranks
    (tensor or pipeline parallel), the drafter copied to each; rank 0 prints.
    """
    # Everything checkable without loading a model is checked first.
    request = inputs.decode_request(max_tokens=max_tokens, temp=temp, top_p=top_p, top_k=top_k, min_p=min_p,
                                    seed=seed, block_size=block_size, tree=tree, ar=ar,
                                    grammar=read_grammar(json_schema, regex))
    inputs.check_drafter_flags(ar, draft_quant, draft_window)
    template_kwargs = inputs.parse_template_config(chat_template_config)
    drafter = inputs.drafter_for(model, drafter, ar)
    text = inputs.read_prompt(prompt)
    if distributed.wants_ranks(processes, hostfile):
        # stdin is read here: the ranks' own stdin never ends under mlx.launch.
        return distributed.relaunch(model, processes, hostfile, prompt=text)
    rank = distributed.start_rank(rank_timeout) if distributed.in_rank() else None

    from dflash2_mlx.engine.plan import fit
    from dflash2_mlx.loading.load_pair import load_pair
    from dflash2_mlx.text.context import check_context
    from dflash2_mlx.text.generate import stream_generate
    from dflash2_mlx.text.prompt import build_prompt

    from .progress import PrefillProgress

    pair, tokenizer = load_pair(model, drafter, draft_quant, group=rank.group if rank else None,
                                time_collectives=time_collectives, draft_window=draft_window)
    if rank is not None:
        rank.watch(pair.target)
    if model == "builtin" and not json_output:
        closing.note(closing.builtin_notice(pair.target))
    ids = build_prompt(tokenizer, text, system_prompt, not ignore_chat_template, template_kwargs)
    check_context(pair.target, len(ids))  # before a calibration or the prefill reads it
    fit(pair, request)  # a block or tree this drafter cannot draft: before a calibration
    request, calibration = inputs.calibrate(pair, request, ids, recalibrate, ranks=rank is not None)
    # Ranks skip the probe: a verdict cached on one host and not another would split their passes.
    exact = exactness(pair, tokenizer, recalibrate) if rank is None else None
    progress = PrefillProgress.on_stderr()
    responses = stream_generate(pair, tokenizer, ids, request, calibration=calibration,
                                prompt_progress_callback=progress.callback)
    tokens, from_draft, pieces, last = [], [], [], None
    with progress:  # its line erased before the text, or an error line, follows
        for r in responses:
            tokens.append(r.token)
            from_draft.append(r.from_draft)
            pieces.append(r.text)
            if not json_output:
                closing.stream_text(r.text)
            last = r
    if json_output:
        record = {
            "text": "".join(pieces), "prompt_token_ids": ids, "token_ids": tokens,
            "from_draft": from_draft, "stats": last.stats.to_dict(),
        }
        if exact is not None:
            record["stats"]["exactness"] = exact.report(request.sampling.greedy)
        write_whole(json.dumps(record) + "\n")  # a Ctrl-C leaves all of it or nothing
    else:
        closing.print_closing(last.stats, exact.line(request.sampling.greedy) if exact is not None else None)


def read_grammar(json_schema: Optional[Path], regex: Optional[str]):
    """The `Grammar` of --json-schema FILE or --regex (None for neither), compiled now, before a
    model loads, so a bad schema is one line at once."""
    from dflash2_mlx.errors import DFlashError

    if json_schema is None and regex is None:
        return None
    if json_schema is not None and regex is not None:
        raise DFlashError("--json-schema and --regex both constrain the output: pass one of them")
    from dflash2_mlx.engine.grammar import Grammar

    if regex is not None:
        grammar = Grammar.regex(regex)
    else:
        try:
            text = json_schema.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DFlashError(f"cannot read --json-schema {json_schema}: {getattr(e, 'strerror', None) or e}") from None
        grammar = Grammar.json_schema(text)
    grammar.compiled()
    return grammar
