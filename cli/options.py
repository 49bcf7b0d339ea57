"""Option definitions shared by every command (mlx-lm's names, with aliases); what the
commands do with the values is in inputs.py."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from .model_source import model_folder
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
