"""`dflash2 doctor`: check the install, the memory, the pair and its acceptance."""

import json
from typing import Annotated

import typer

from dflash2_mlx.errors import DFlashError

from . import options as o
from . import ui
from .stdio import write_whole
from .user_cache import cache_folder


def doctor(
    model: o.Model = "builtin",
    drafter: o.Drafter = None,
    draft_quant: o.DraftQuant = None,
    block_size: o.BlockSize = "auto",
    recalibrate: o.Recalibrate = False,
    context: o.Context = 8192,
    min_acceptance: o.MinAcceptance = 0.2,
    self_test: o.SelfTest = True,
    max_tokens: o.MaxTokens = 48,
    json_output: Annotated[bool, typer.Option("--json", help=(
        "Print one JSON object on stdout instead of the tables: every section's checks, `ok` and the "
        "problems found; the exit code and the error line on stderr are as without it."))] = False,
    debug: o.Debug = False,
):
    """Check MLX and its kernels, estimate memory before loading (target and drafter
    weights, KV caches for --context tokens), flag quantization pitfalls, run every
    target/drafter compatibility check, a short greedy acceptance self-test (with
    whether a verify block is bitwise one-by-one decoding on this machine, or equal
    up to the backend's kernel rounding), and the decode costs --block-size auto
    decides with (both measured once per machine and pair, cached; --recalibrate
    measures them again).

    Exits non-zero, saying why, when anything fails, including a pair whose
    first drafted token is accepted less often than --min-acceptance.
    """
    from dflash2_mlx.tools.doctor import problems, run_doctor
    from dflash2_mlx.loading.quantize import DraftQuant

    if draft_quant:
        DraftQuant.parse(draft_quant)  # a bad spelling is a flag error, before any output

    if context < 1:
        raise DFlashError(f"--context {context} must be at least 1")
    if not 0 <= min_acceptance <= 1:
        raise DFlashError(f"--min-acceptance {min_acceptance} must be between 0 and 1")
    if max_tokens < 2:
        raise DFlashError(f"--max-tokens {max_tokens} must be at least 2 for the self-test")
    from dflash2_mlx.engine.request import DecodeRequest

    block_size = DecodeRequest(block_size=block_size).block_size  # "auto" or a size, read as a request's
    if drafter is None:  # a shipped drafter fits only its own target (the built-in one, a named source)
        from dflash2_mlx.loading.sources import shipped_drafter

        drafter = "builtin" if model == "builtin" else shipped_drafter(getattr(model, "given", ""))
    sections = []
    for section in run_doctor(model, drafter, draft_quant=draft_quant,
                              block_size=None if block_size == "auto" else block_size, context=context,
                              min_acceptance=min_acceptance, run_self_test=self_test, max_tokens=max_tokens,
                              calibration_folder=cache_folder(), recalibrate=recalibrate):
        sections.append(section)
        if not json_output:
            ui.console.print(ui.doctor_section(section))
            ui.console.print()
    found = problems(sections)
    if json_output:
        record = {"kind": "dflash2-doctor", "ok": not found, "problems": found,
                  "sections": [s.to_dict() for s in sections]}
        write_whole(json.dumps(record) + "\n")
    else:
        ui.console.print(ui.doctor_summary(found))
    if found:
        more = f" (and {len(found) - 1} more above)" if len(found) > 1 else ""
        raise DFlashError(f"doctor refuses this setup: {found[0]}{more}")
