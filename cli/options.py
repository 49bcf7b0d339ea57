"""Option definitions shared by every command (mlx-lm's names, with aliases)."""

import gc
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from .model_source import model_folder
from .user_cache import cache_folder  # noqa: F401  (o.cache_folder, for the commands)
from .stdio import check_text


def _utf8(flag: str):
    """An option callback refusing text that is not UTF-8, when the flags are read."""
    return lambda value: check_text(value, flag)


Model = Annotated[str, typer.Option("--model", callback=model_folder, help="Target: Hub repo id, local folder, "
                                    ".gguf file, named source ('smollm2'), or 'builtin' (docs/gguf.md).")]
Drafter = Annotated[
    Optional[str],
    typer.Option("--drafter", "--draft-model",
                 help="DFlash / DFlash 2 drafter: Hub repo id (org/name[@revision]), local folder, "
                      "'builtin' (DFlash 2) or 'builtin-dflash' for the built-in target, 'smollm2' or "
                      "'smollm2-dflash' for --model smollm2 (default: the drafter shipped for the target, if any)."),
]
Prompt = Annotated[Optional[str], typer.Option("--prompt", "-p", help="Prompt text; '-' reads stdin.",
                                               callback=_utf8("--prompt"))]
MaxTokens = Annotated[int, typer.Option("--max-tokens", "-m", help="Maximum tokens to generate.")]
Temp = Annotated[float, typer.Option("--temp", "--temperature", help="Sampling temperature; 0 is greedy.")]
TopP = Annotated[float, typer.Option("--top-p", help="Nucleus sampling threshold (1 = off).")]
TopK = Annotated[int, typer.Option("--top-k", help="Sample among the k most likely tokens (0 = off).")]
MinP = Annotated[float, typer.Option("--min-p", help="Drop tokens below min-p × the top probability (0 = off).")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="PRNG seed for reproducible sampling.")]
BlockSize = Annotated[
    str,
    typer.Option("--block-size",
                 help="Tokens per verify block, anchor included: 'auto' (default) picks it every cycle from this "
                      "machine's measured costs (measured once, cached; `dflash2 doctor` shows them) and the "
                      "acceptance seen so far, decoding plainly where no block size pays; or a fixed size, "
                      "2..checkpoint block_size. vLLM's num_speculative_tokens is a fixed size minus one."),
]
Recalibrate = Annotated[
    bool, typer.Option("--recalibrate", help="Measure this machine's cycle costs for --block-size auto again "
                                            "(and the exactness probe) instead of reading the cached ones."),
]
Tree = Annotated[
    int,
    typer.Option("--tree",
                 help="Verify a tree of N rows per target pass, built from the drafter's candidates "
                      "(0 = the chain of --block-size rows; try 8 or 16). Targets with recurrent layers "
                      "fall back to the chain."),
]
DraftWindow = Annotated[
    Optional[int],
    typer.Option("--draft-window", metavar="N",
                 help="Speed and memory knob for long contexts: the drafter attends to the first few context rows "
                      "and the latest N (default: the drafter's own attention, all rows or its sliding window). "
                      "The output is unchanged: the target still verifies every token; only acceptance may drop.",
                 show_default=False),
]
DraftQuant = Annotated[
    Optional[str],
    typer.Option("--draft-quant", help="Quantize the drafter in memory, e.g. w4a32:gs64, w8a32, w4abf16."),
]
SystemPrompt = Annotated[Optional[str], typer.Option("--system-prompt", help="System message for the chat template.",
                                                     callback=_utf8("--system-prompt"))]
IgnoreChatTemplate = Annotated[
    bool, typer.Option("--ignore-chat-template", help="Feed the prompt as raw text, without the chat template."),
]
ChatTemplateConfig = Annotated[
    Optional[str],
    typer.Option("--chat-template-config", help='JSON passed to the chat template, e.g. \'{"enable_thinking": false}\'.'),
]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of streaming text.")]
JsonSchema = Annotated[Optional[Path], typer.Option(
    "--json-schema", help="Constrain the output to JSON valid under this JSON schema file (inside speculation).",
    show_default=False)]
Regex = Annotated[Optional[str], typer.Option(
    "--regex", help="Constrain the output to text matching this regular expression.", show_default=False)]
AR = Annotated[bool, typer.Option("--ar", help="Plain autoregressive decoding (the baseline).")]
Debug = Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")]

# -- chat, compare, bench, doctor --------------------------------------------------------
Color = Annotated[bool, typer.Option("--color/--no-color", help="Colour the tokens the drafter proposed and the target accepted.")]
Repeats = Annotated[int, typer.Option("--repeats", "-r", help="Measured runs per arm/configuration (medians; the order alternates).")]
NoLive = Annotated[bool, typer.Option("--no-live", help="No live replay: print the results only (automatic when stdout is not a terminal).")]
Save = Annotated[Optional[Path], typer.Option("--save", help="Also write the full JSON record to this file.")]
ReplaySpeed = Annotated[float, typer.Option("--replay-speed", help="Replay at this multiple of the recorded speed.")]
BenchDrafter = Annotated[
    Optional[str],
    typer.Option("--drafter", "--draft-model",
                 help="DFlash 2 (or DFlash) drafter to benchmark: Hub repo id, local folder or 'builtin' "
                      "(default: 'builtin' with the built-in target)."),
]
DFlashDrafter = Annotated[
    Optional[str], typer.Option("--dflash-drafter", help="A second drafter, usually DFlash (v1), to benchmark alongside."),
]
ArDraftModel = Annotated[
    Optional[str],
    typer.Option("--ar-draft-model",
                 help="An autoregressive draft model (an ordinary small LM with the target's tokenizer): adds "
                      "mlx-lm's own speculative decoding to the benchmark. DFlash drafters go in --drafter."),
]
BlockSizes = Annotated[
    Optional[str], typer.Option("--block-sizes", help="Block sizes to sweep, 'auto' and/or fixed sizes, e.g. auto,2,4,8,16 "
                                                       "(default: auto,4,8,16 up to the drafter's)."),
]
TreeSweep = Annotated[
    Optional[str],
    typer.Option("--tree", help="Tree rows to sweep beside the chain, e.g. 8,16 (0 = the chain; default: none)."),
]
Suite = Annotated[str, typer.Option("--suite", help="Built-in prompt suites, comma-separated: code, chat, maths.")]
PromptsFile = Annotated[
    Optional[Path], typer.Option("--prompts", help="Prompts file instead of the suites: one per line, or JSONL with \"prompt\" (and \"suite\")."),
]
MaxPrompts = Annotated[int, typer.Option("--max-prompts", help="Use at most this many prompts per suite (0 = all).")]
JsonFile = Annotated[Optional[Path], typer.Option("--json", help="Write the full JSON record to this file ('-' for stdout).")]
MarkdownFile = Annotated[Optional[Path], typer.Option("--markdown", help="Write the results as markdown tables to this file.")]
Context = Annotated[int, typer.Option("--context", help="Context length (prompt + answer tokens) to size the KV caches for.")]
MinAcceptance = Annotated[
    float,
    typer.Option("--min-acceptance",
                 help="Refuse the pair when fewer than this fraction of first drafted tokens are accepted in the self-test."),
]
SelfTest = Annotated[bool, typer.Option("--self-test/--no-self-test", help="Run the short greedy acceptance self-test.")]


# -- checks and values every command shares ------------------------------------------------
# The library is imported inside these functions: `dflash2 --help` and argument
# errors should not wait for MLX.


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


def sampling_params(temp: float, top_p: float, top_k: int, min_p: float, seed: Optional[int]):
    """The `SamplingParams` of the sampling flags (it validates them). The first
    step of every command that loads a model: it imports the engine."""
    import_engine()
    from dflash2_mlx.engine.sampling import SamplingParams

    return SamplingParams(temperature=temp, top_p=top_p, top_k=top_k, min_p=min_p, seed=seed)


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


def check_max_tokens(max_tokens: int) -> None:
    from dflash2_mlx.errors import DFlashError

    if max_tokens < 1:
        raise DFlashError(f"--max-tokens {max_tokens} must be at least 1")


def check_tree(rows: int) -> None:
    from dflash2_mlx.errors import DFlashError

    if rows < 0 or rows == 1:
        raise DFlashError(f"--tree {rows}: use 0 for the chain or N >= 2 rows per verify pass (e.g. 8 or 16)")


def check_draft_window(rows: Optional[int]) -> None:
    from dflash2_mlx.errors import DFlashError

    if rows is not None and rows < 1:
        raise DFlashError(f"--draft-window {rows}: keep at least 1 recent context row (e.g. 256 or 1024), "
                          "or leave it out for the drafter's own attention")


def check_prompt_fits(pair, prompt_tokens: int) -> None:
    """Refuse a prompt that fills the target's context before any work (a
    calibration or the prefill would read it all first)."""
    from dflash2_mlx.text.context import check_context

    check_context(pair.target, prompt_tokens)


def check_tree_fits(pair, rows: int) -> None:
    """Refuse --tree N past what the drafter's lattice can hold, right after loading."""
    from dflash2_mlx.engine.tree.cycle import check_tree_rows

    check_tree_rows(pair, rows, "--tree")


def parse_tree_sweep(raw: Optional[str]) -> list[int]:
    """The tree rows of `--tree 8,16` (empty when not given)."""
    from dflash2_mlx.errors import DFlashError

    if not raw:
        return []
    try:
        rows = [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        raise DFlashError(f"--tree '{raw}' must be integers separated by commas, e.g. 8,16") from None
    for n in rows:
        check_tree(n)
    return rows


def read_prompt(prompt: Optional[str]) -> str:
    """The text of --prompt ('-' reads stdin), refused unless it is UTF-8."""
    from dflash2_mlx.errors import DFlashError

    from .stdio import check_text, read_stdin

    if prompt is None:
        raise DFlashError("no prompt: pass --prompt TEXT (or --prompt - to read stdin)")
    return read_stdin() if prompt == "-" else check_text(prompt, "--prompt")


# -- prefill progress (generate, chat) -------------------------------------------------------
PREFILL_QUIET_S = 2.0  # a prefill shorter than this draws nothing


class PrefillProgress:
    """The library's `prompt_progress_callback` drawn as one muted line on stderr,
    redrawn in place once the prefill has run for PREFILL_QUIET_S, erased when
    it ends or when the `with` block around the generation exits (an error or
    Ctrl-C), so the next line starts clean. Inert (`callback` None) unless
    stderr is a terminal."""

    def __init__(self, stream=None, clock=None):
        import time

        self.stream, self.clock = stream, clock or time.monotonic
        self.started, self.drawn = None, False

    @classmethod
    def on_stderr(cls) -> "PrefillProgress":
        import os

        tty = sys.stderr is not None and sys.stderr.isatty() and os.environ.get("TERM") != "dumb"
        return cls(sys.stderr if tty else None)

    @property
    def callback(self):
        return self if self.stream is not None else None

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        if done == 0 or self.started is None:
            self.started = now
        if done >= total:
            self.clear()
            return
        if now - self.started < PREFILL_QUIET_S:
            return
        # Short, so that it never wraps (a carriage return redraws one row only).
        self.stream.write(f"\r\x1b[2mprefill {done:,} / {total:,} tokens ({100 * done // total} %)\x1b[0m\x1b[K")
        self.stream.flush()
        self.drawn = True

    def clear(self) -> None:
        if self.drawn:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self.drawn = False

    def __enter__(self) -> "PrefillProgress":
        return self

    def __exit__(self, *exc) -> None:
        self.clear()


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

# -- a target split over MLX distributed ranks (generate, chat, serve) ---------------------
Processes = Annotated[
    Optional[int],
    typer.Option("--processes", min=1,
                 help="Split the target over N ranks on this machine (tensor or pipeline parallel; mlx.launch, ring backend)."),
]
Hostfile = Annotated[
    Optional[str],
    typer.Option("--hostfile",
                 help="Split the target over the machines this mlx.launch hostfile lists (one rank each)."),
]
RankTimeout = Annotated[
    float,
    typer.Option("--rank-timeout", min=1.0,
                 help="With ranks: stop every rank when no target pass starts for this many seconds "
                      "(a machine gone silent)."),
]
TimeCollectives = Annotated[
    bool,
    typer.Option("--time-collectives/--no-time-collectives",
                 help="With ranks: time each collective for the stats (syncs at every all_sum)."),
]


def parse_block_size(raw: Optional[str]):
    """--block-size as the library takes it: "auto" or an int (range checked by the pair)."""
    from dflash2_mlx.errors import DFlashError

    if raw is None or raw.strip().lower() == "auto":
        return "auto"
    try:
        return int(raw)
    except ValueError:
        raise DFlashError(f"--block-size '{raw}' must be 'auto' or a whole number of tokens, e.g. 4") from None


def block_plan(pair, block_size, prompt_ids, max_tokens: int, recalibrate: bool = False,
               ranks: bool = False, tree: int = 0, seeded: bool = False):
    """(block size, calibration) to pass to `stream_generate` for the parsed --block-size.

    "auto" reads this machine's cached calibration, measuring it first (once per machine and pair:
    seconds for a small pair, minutes for a real model on one CPU core) when there is none. Ranks of a split
    target decode with the drafter's fixed block: auto decides from each
    rank's own clock, and ranks that decided differently would wait forever on
    each other's collectives. A tree (`tree` rows) drafts the fixed block too.
    """
    if pair.drafter is None:
        return None, None
    if block_size != "auto":
        return pair.block_size(block_size, "--block-size"), None
    if ranks:
        return pair.block_size(None), None
    from dflash2_mlx.engine.adaptive.policy import auto_decides

    if (max_tokens <= 1 or not auto_decides(pair, block_size, tree)) and not recalibrate:
        return "auto", None  # no cycle will run, or none that auto decides
    from dflash2_mlx.engine.adaptive.calibrate import calibration_path, load_or_calibrate

    from .closing import measuring_costs, note

    folder = cache_folder()
    # A seeded run skips the start-up check: a timing would tie its schedule to the clock.
    with measuring_costs(recalibrate or not calibration_path(pair, folder).exists()):
        calibration = load_or_calibrate(pair, folder, prompt_ids, recalibrate, check=not seeded)
    if calibration.rescaled is not None:
        note(f"[decode costs rescaled {calibration.rescaled:.2f}x: a plain step timed now disagreed with the "
             "cached calibration; `dflash2 doctor --recalibrate` measures them again]")
    return "auto", calibration

