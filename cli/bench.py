"""`dflash2 bench`: prompt suites × decoding modes × block sizes, with a verdict."""

import json
from pathlib import Path
from typing import Optional

from dflash2_mlx.errors import DFlashError
from dflash2_mlx.files import atomic_write_text, check_writable

from . import inputs
from . import options as o
from . import plotting
from .stdio import write_whole
from . import ui


def bench(
    model: o.Model = "builtin",
    drafter: o.BenchDrafter = None,
    dflash_drafter: o.DFlashDrafter = None,
    draft_model: o.ArDraftModel = None,
    suite: o.Suite = "code,chat,maths",
    prompts: o.PromptsFile = None,
    max_prompts: o.MaxPrompts = 0,
    max_tokens: o.MaxTokens = 128,
    block_sizes: o.BlockSizes = None,
    tree: o.TreeSweep = None,
    recalibrate: o.Recalibrate = False,
    repeats: o.Repeats = 3,
    temp: o.Temp = 0.0,
    top_p: o.TopP = 1.0,
    top_k: o.TopK = 0,
    min_p: o.MinP = 0.0,
    seed: o.Seed = 0,
    draft_quant: o.DraftQuant = None,
    draft_window: o.DraftWindow = None,
    system_prompt: o.SystemPrompt = None,
    ignore_chat_template: o.IgnoreChatTemplate = False,
    chat_template_config: o.ChatTemplateConfig = None,
    json_file: o.JsonFile = None,
    markdown_file: o.MarkdownFile = None,
    plot: plotting.PlotDir = None,
    debug: o.Debug = False,
):
    """Benchmark plain decoding, DFlash (--dflash-drafter), DFlash 2 (--drafter) and
    mlx-lm's own speculative decoding (--ar-draft-model, an autoregressive draft) on
    built-in code/chat/maths prompts or --prompts FILE, over --block-sizes.

    Reports medians over --repeats, the best block size on this machine, and says
    plainly when speculation loses to plain decoding, and why (τ against the
    measured cost of a B-row verify relative to a 1-row step).
    """
    # The sweep's settings, checked as one request's (block sizes and trees are swept below).
    request = inputs.decode_request(max_tokens=max_tokens, temp=temp, top_p=top_p, top_k=top_k, min_p=min_p,
                                    seed=seed)
    inputs.check_drafter_flags(False, draft_quant, draft_window)
    if repeats < 1:
        raise DFlashError(f"--repeats {repeats} must be at least 1")
    sizes = _parse_sizes(block_sizes) if block_sizes else None
    for path, flag in ((json_file, "--json"), (markdown_file, "--markdown")):
        if path is not None and str(path) != "-":
            check_writable(path, flag)
    plotting.check_plot(plot, folder=True)
    trees = inputs.parse_tree_sweep(tree)
    template_kwargs = inputs.parse_template_config(chat_template_config)
    if drafter is None and (dflash_drafter or draft_model):
        pass  # the other drafter is the one benchmarked
    else:
        drafter = inputs.drafter_for(model, drafter, instead="--dflash-drafter or --ar-draft-model")
    from dflash2_mlx.tools.suites import builtin_prompts, read_prompts

    chosen = read_prompts(prompts, max_prompts) if prompts else builtin_prompts(
        [s.strip() for s in suite.split(",") if s.strip()], max_prompts)

    from dflash2_mlx.engine.pair import Pair
    from dflash2_mlx.loading.builtin import resolve_builtin
    from dflash2_mlx.loading.checkpoints import load_drafter
    from dflash2_mlx.loading.load_pair import load_pair
    from dflash2_mlx.text.prompt import build_prompt
    from dflash2_mlx.text.stats import mode_name
    from dflash2_mlx.tools.bench import markdown, run_bench
    from dflash2_mlx.tools.provenance import provenance

    from .main import command_typed  # imported by now: it runs this command

    ui.progress_note("loading models…")
    first, tokenizer = load_pair(model, drafter, draft_quant, draft_window=draft_window)
    target = first.target
    pairs = [first] if first.drafter is not None else []
    if dflash_drafter:
        from dflash2_mlx.loading.quantize import DraftQuant, quantize_drafter

        second = Pair.make(target, load_drafter(resolve_builtin(dflash_drafter, "drafter")))
        second.drafter.set_context_window(draft_window)
        if first.drafter is not None and second.kind == first.kind:
            raise DFlashError(f"--drafter and --dflash-drafter are both {mode_name(first.kind)} drafters: "
                              "benchmark them in separate runs")
        if draft_quant:
            quantize_drafter(second.drafter, DraftQuant.parse(draft_quant))
        pairs.append(second)
    for B in [B for B in sizes or [] if B != "auto"]:  # a size no drafter can draft is refused, in the pair's words
        refusals = [_refusal(p, B) for p in pairs]
        if refusals and all(refusals):
            raise refusals[0]
    if sizes is None:
        top = max((p.max_block_size for p in pairs), default=16)
        sizes = ["auto"] + ([B for B in (4, 8, 16) if B <= top] or [top])
    ar_draft = _load_ar_draft(draft_model, target) if draft_model else None
    ids = [(p, build_prompt(tokenizer, p.text, system_prompt, not ignore_chat_template, template_kwargs))
           for p in chosen]
    calibrations = [inputs.calibrate(p, request, ids[0][1], recalibrate, first=False)[1] if "auto" in sizes else None
                    for p in pairs]
    with ui.RunProgress() as progress:
        record = run_bench(target, tokenizer, ids, pairs=pairs, calibrations=calibrations, draft_model=ar_draft,
                           block_sizes=sizes, tree_rows=trees,
                           repeats=repeats, max_tokens=request.max_tokens, sampling=request.sampling,
                           on_run=progress.update)
    record["models"] = {"target": model, "drafter": drafter, "dflash_drafter": dflash_drafter,
                        "draft_model": draft_model, "draft_quant": draft_quant}
    record.update(provenance(command_typed()))
    # The results are printed even when a file cannot be written at the end
    # (disk full): the error line comes after them.
    failed = [e for e in (_write(json_file, json.dumps(record, indent=2) + "\n"), _write(markdown_file, markdown(record)),
                          _plot(plot, record)) if e is not None]
    if json_file is None or str(json_file) != "-":
        ui.print_whole(ui.bench_report(record))  # a redirected table keeps every cell
    if failed:
        raise failed[0]


def _refusal(pair, B: int):
    """The pair's BlockSizeError for `B`, or None when it can draft B."""
    from dflash2_mlx.errors import BlockSizeError

    try:
        pair.block_size(B, "--block-sizes")
    except BlockSizeError as e:
        return e
    return None


def _parse_sizes(raw: str) -> list:
    words = [x.strip().lower() for x in raw.split(",") if x.strip()]
    auto = ["auto"] if "auto" in words else []
    try:
        sizes = sorted({int(x) for x in words if x != "auto"})
    except ValueError:
        raise DFlashError(f"--block-sizes '{raw}' must be 'auto' and/or integers separated by commas, "
                          "e.g. auto,2,4,8,16") from None
    if not (auto or sizes) or (sizes and sizes[0] < 2):
        raise DFlashError(f"--block-sizes '{raw}': every block size must be 2 or more")
    return auto + sizes


def _load_ar_draft(ref: str, target):
    """An ordinary mlx-lm model as mlx-lm's speculative draft (same tokenizer)."""
    from mlx_lm.utils import load_model

    from dflash2_mlx.loading.hub import resolve
    from dflash2_mlx.loading.checkpoints import read_config

    folder = resolve(ref, "draft model")
    config = read_config(folder, "draft model")
    if "dflash_config" in config or any("DFlash" in a for a in config.get("architectures") or []):
        raise DFlashError(f"--ar-draft-model '{ref}' is a DFlash drafter: pass it as --drafter "
                          "(--ar-draft-model is an autoregressive draft model for mlx-lm's speculative decoding)")
    try:
        model, _ = load_model(folder)
    except ValueError as e:
        raise DFlashError(f"draft model '{ref}' does not load: {str(e).splitlines()[0]}") from None
    model.set_dtype(target.activation_dtype)
    vocab = config.get("vocab_size")
    if vocab is not None and vocab != target.vocab_size:
        raise DFlashError(f"draft model vocab_size {vocab} vs target vocabulary {target.vocab_size}: "
                          "mlx-lm's speculative decoding needs the same tokenizer")
    return model


def _plot(folder: Optional[Path], record: dict) -> Optional[DFlashError]:
    """Draw the plots; returns the failure instead of raising it (the table still prints)."""
    if folder is None:
        return None
    from dflash2_mlx.tools.plots import bench_plots

    try:
        bench_plots(record, folder)
    except DFlashError as e:
        return e
    return None


def _write(path: Optional[Path], text: str) -> Optional[DFlashError]:
    """Write one result file; returns the failure instead of raising it."""
    if path is None:
        return None
    if str(path) == "-":
        write_whole(text)
        return None
    try:
        atomic_write_text(path, text)
    except DFlashError as e:
        return e
    return None
