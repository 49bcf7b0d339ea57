"""`dflash2 compare`: plain decoding and DFlash 2 on the same prompt, honestly."""

import json

from dflash2_mlx.errors import DFlashError
from dflash2_mlx.files import atomic_write_text, check_writable

from . import inputs
from . import options as o
from .exactness import exactness
from . import plotting
from .stdio import write_whole
from . import ui


def compare(
    model: o.Model = "builtin",
    drafter: o.Drafter = None,
    prompt: o.Prompt = None,
    max_tokens: o.MaxTokens = 128,
    temp: o.Temp = 0.0,
    top_p: o.TopP = 1.0,
    top_k: o.TopK = 0,
    min_p: o.MinP = 0.0,
    seed: o.Seed = 0,
    block_size: o.BlockSize = "auto",
    recalibrate: o.Recalibrate = False,
    tree: o.Tree = 0,
    draft_quant: o.DraftQuant = None,
    draft_window: o.DraftWindow = None,
    system_prompt: o.SystemPrompt = None,
    ignore_chat_template: o.IgnoreChatTemplate = False,
    chat_template_config: o.ChatTemplateConfig = None,
    repeats: o.Repeats = 2,
    json_output: o.Json = False,
    save: o.Save = None,
    plot: plotting.PlotFile = None,
    no_live: o.NoLive = False,
    replay_speed: o.ReplaySpeed = 1.0,
    debug: o.Debug = False,
):
    """Race plain autoregressive decoding against DFlash / DFlash 2, fairly.

    Both arms get the same prompt token ids, seed and settings and are warmed up;
    they run one after the other (never at the same time), alternating order over
    --repeats. The panes then replay both runs on one timeline at their recorded
    speeds. Ends with decode and end-to-end speeds, speedup, τ, acceptance by
    position, target passes, peak memory, a parity verdict (the first token where
    the outputs differ, if any) and whether a verify block is bitwise one-by-one
    decoding on this machine. Without --prompt, a built-in code prompt is used.
    """
    request = inputs.decode_request(max_tokens=max_tokens, temp=temp, top_p=top_p, top_k=top_k, min_p=min_p,
                                    seed=seed, block_size=block_size, tree=tree)
    inputs.check_drafter_flags(False, draft_quant, draft_window)
    if repeats < 1:
        raise DFlashError(f"--repeats {repeats} must be at least 1")
    if replay_speed <= 0:
        raise DFlashError(f"--replay-speed {replay_speed} must be positive")
    template_kwargs = inputs.parse_template_config(chat_template_config)
    if save is not None:
        check_writable(save, "--save")
    plotting.check_plot(plot)
    drafter = inputs.drafter_for(model, drafter, instead="run `dflash2 generate --ar` for plain decoding alone")
    if prompt is None:
        from dflash2_mlx.tools.suites import SUITES

        text = SUITES["code"][0]
    else:
        text = inputs.read_prompt(prompt)

    from dflash2_mlx.engine.plan import fit
    from dflash2_mlx.loading.load_pair import load_pair
    from dflash2_mlx.text.context import check_context
    from dflash2_mlx.text.prompt import build_prompt
    from dflash2_mlx.text.stats import mode_name
    from dflash2_mlx.tools.compare import compare as run_compare
    from dflash2_mlx.tools.provenance import provenance

    from .main import command_typed  # imported by now: it runs this command

    pair, tokenizer = load_pair(model, drafter, draft_quant, draft_window=draft_window)
    ids = build_prompt(tokenizer, text, system_prompt, not ignore_chat_template, template_kwargs)
    check_context(pair.target, len(ids))
    fit(pair, request)  # a block size or tree this drafter cannot draft, before any work
    request, calibration = inputs.calibrate(pair, request, ids, recalibrate)  # auto reads (or measures) the costs
    exact = exactness(pair, tokenizer, recalibrate)
    quiet = json_output

    def on_arm(phase, arm, repeat):
        if not quiet:
            name = mode_name("ar" if arm == "ar" else pair.kind)
            what = "warming up" if phase == "warmup" else f"measuring (repeat {repeat + 1}/{repeats})"
            ui.status(f"{what}: {name}")

    result = run_compare(pair, tokenizer, ids, request, calibration=calibration, repeats=repeats, on_arm=on_arm,
                         exactness=exact)
    record = result.to_dict()
    record["prompt"] = text
    record.update(provenance(command_typed()))
    failed = None  # a --save that fails at the end (disk full) still shows the results first
    if save is not None:
        try:
            atomic_write_text(save, json.dumps(record, indent=2) + "\n")
        except DFlashError as e:
            failed = e
    if plot is not None:
        from dflash2_mlx.tools.plots import compare_plot

        try:
            compare_plot(record, plot)
        except DFlashError as e:
            failed = failed or e
    if json_output:
        write_whole(json.dumps(record) + "\n")
    else:
        if not no_live and ui.console.is_terminal:
            ui.replay(result, speed=replay_speed)
        else:  # the end of the replay, drawn once
            ui.console.print(ui.final_panes(result, replayed=False))
        ui.console.print(ui.compare_table(result))
        if save is not None and failed is None:
            ui.status(f"saved the full record to {save}")
    if failed is not None:
        raise failed
