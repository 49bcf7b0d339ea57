"""What the commands make of their flags: the engine's `DecodeRequest` (its rules are
the library's; a broken one is reported with its flag), the drafter to load, the
prompt, the calibration --block-size auto reads. The library is imported inside
these functions: `dflash2 --help` and argument errors should not wait for MLX."""

import gc
import sys
from typing import Optional


# A request field's flag, for its error line (`RequestError.field`).
FLAGS = {"max_tokens": "--max-tokens", "block_size": "--block-size", "tree_rows": "--tree",
         "temperature": "--temp", "top_p": "--top-p", "top_k": "--top-k", "min_p": "--min-p", "seed": "--seed"}


def flag_message(error) -> str:
    """A `RequestError`'s line with the flag the user typed in place of the field's name."""
    text, field = str(error), getattr(error, "field", None)
    flag = FLAGS.get(field)
    return flag + text[len(field):] if flag and text.startswith(field) else text


def import_engine() -> None:
    """Import the engine, and with it MLX, mlx-lm and transformers, with Python's
    cyclic GC paused, then freeze what the imports made.

    They make about 10^5 objects that live as long as the process, and every
    automatic collection on the way walks them all again: pausing it saved about
    30 ms of the one-second import on the project's Linux machine (medians of 8
    alternated runs). Frozen, they are skipped by later collections too, between
    the tokens of a decode. The cyclic garbage the imports leave (under a
    thousand objects) is frozen with them rather than collected for 40 ms.
    """
    if "mlx_lm" in sys.modules:  # already paid (tests, a second call)
        return
    gc.disable()
    try:
        import dflash2_mlx.engine.decode.loop  # noqa: F401  (mlx, mlx_lm, transformers)
        import dflash2_mlx.loading.load_pair  # noqa: F401
        import dflash2_mlx.text.generate  # noqa: F401
    finally:
        gc.enable()
        gc.freeze()


def drafter_for(model: str, drafter: Optional[str], ar: bool = False, instead: str = "--ar for plain decoding"):
    """The drafter to load (None with --ar). A shipped drafter is the default only for
    the target it was trained for (the built-in target, a named source such as
    `smollm2`): paired with any other it would only fail the compatibility checks,
    blaming a drafter the user never chose."""
    from dflash2_mlx.errors import DFlashError

    if ar:
        return None
    if drafter is not None:
        return drafter
    if model == "builtin":
        return "builtin"
    from dflash2_mlx.loading.sources import shipped_drafter

    shipped = shipped_drafter(getattr(model, "given", ""))  # `--model smollm2`: its own drafter
    if shipped:
        return shipped
    from dflash2_mlx.loading.hub import check_reference

    check_reference(model, "target")  # a --model that is not there is the first thing to fix
    name = getattr(model, "given", model)  # a .gguf or named source as typed, not its cached folder
    raise DFlashError(f"no drafter given for --model {name}: pass --drafter (a DFlash or DFlash 2 drafter "
                      f"trained for this target) or {instead}")


def decode_request(*, max_tokens: int, temp: float, top_p: float, top_k: int, min_p: float, seed: Optional[int],
                   block_size: Optional[str] = "auto", tree: int = 0, grammar=None, ar: bool = False):
    """The `DecodeRequest` of a command's flags, checked before any model loads (the first
    step of every command that loads one: it imports the engine). With --ar the
    drafter's settings do nothing, and say so."""
    import_engine()
    from dflash2_mlx.engine.request import DecodeRequest
    from dflash2_mlx.engine.sampling import SamplingParams

    sampling = SamplingParams(temperature=temp, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed)
    request = DecodeRequest(max_tokens=max_tokens, sampling=sampling, block_size=block_size, tree_rows=tree,
                            grammar=grammar)
    if ar and (request.block_size != "auto" or request.tree_rows):
        import warnings

        warnings.warn("--block-size and --tree do nothing with --ar (no drafter is used)")
    return request


def check_drafter_flags(ar: bool, draft_quant: Optional[str], draft_window: Optional[int]) -> None:
    """The drafter's load settings: the window's rule is the drafter's own (checked before
    any model loads); with --ar they do nothing, and say so."""
    from dflash2_mlx.engine.drafter.context_caches import check_draft_window
    from dflash2_mlx.errors import DFlashError

    try:
        check_draft_window(draft_window)
    except DFlashError as e:
        raise DFlashError(str(e).replace("draft window", "--draft-window", 1)) from None
    if ar and (draft_quant or draft_window):
        import warnings

        warnings.warn("--draft-quant and --draft-window do nothing with --ar (no drafter is used)")


def calibrate(pair, request, prompt_ids, recalibrate: bool = False, ranks: bool = False, first: bool = True):
    """(request, calibration) for --block-size auto: this machine's costs for the pair, read
    from the user cache or measured there once (`engine.plan.calibration_for`), with the
    note the terminal shows while it measures. `first`: a first estimate (seconds) will do
    when nothing is cached, so the first answer does not wait minutes for a full one."""
    from dflash2_mlx.engine.plan import calibration_for

    from .closing import measuring_costs, note
    from .user_cache import cache_folder

    settled = calibration_for(pair, request, cache_folder(), prompt_ids, recalibrate=recalibrate, ranks=ranks,
                              first=first, measuring=lambda: measuring_costs(True))
    if settled.note is not None:
        note(f"[{settled.note}]")
    return settled.request, settled.calibration


def parse_tree_sweep(raw: Optional[str]) -> list[int]:
    """The tree rows of `--tree 8,16` (empty when not given), each checked as a request's."""
    from dflash2_mlx.engine.request import RequestError, tree_rows_value
    from dflash2_mlx.errors import DFlashError

    if not raw:
        return []
    try:
        rows = [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise DFlashError(f"--tree '{raw}' must be integers separated by commas, e.g. 8,16") from None
    try:
        return [tree_rows_value(n) for n in rows]
    except RequestError as e:
        raise DFlashError(flag_message(e)) from None


def read_prompt(prompt: Optional[str]) -> str:
    """The text of --prompt ('-' reads stdin), refused unless it is UTF-8."""
    from dflash2_mlx.errors import DFlashError

    from .stdio import check_text, read_stdin

    if prompt is None:
        raise DFlashError("no prompt: pass --prompt TEXT (or --prompt - to read stdin)")
    return read_stdin() if prompt == "-" else check_text(prompt, "--prompt")


def parse_template_config(raw: Optional[str]) -> dict:
    """--chat-template-config as keyword arguments for the chat template."""
    import json

    from dflash2_mlx.errors import DFlashError

    from .stdio import check_text

    if not raw:
        return {}
    try:
        value = json.loads(check_text(raw, "--chat-template-config"))
    except json.JSONDecodeError as e:
        raise DFlashError(f"--chat-template-config is not valid JSON ({e.msg}): e.g. '{{\"enable_thinking\": false}}'") from None
    if not isinstance(value, dict):
        raise DFlashError("--chat-template-config must be a JSON object, e.g. '{\"enable_thinking\": false}'")
    return value
