"""Option definitions shared by every command (mlx-lm's names, with aliases)."""

from typing import Annotated, Optional

import typer

Model = Annotated[str, typer.Option("--model", help="Target: Hub repo id, local folder, or 'builtin'.")]
Drafter = Annotated[
    str,
    typer.Option("--drafter", "--draft-model",
                 help="DFlash / DFlash 2 drafter: Hub repo id (org/name[@revision]), local folder, "
                      "'builtin' (DFlash 2) or 'builtin-dflash'."),
]
Prompt = Annotated[Optional[str], typer.Option("--prompt", "-p", help="Prompt text; '-' reads stdin.")]
MaxTokens = Annotated[int, typer.Option("--max-tokens", "-m", help="Maximum tokens to generate.")]
Temp = Annotated[float, typer.Option("--temp", "--temperature", help="Sampling temperature; 0 is greedy.")]
TopP = Annotated[float, typer.Option("--top-p", help="Nucleus sampling threshold (1 = off).")]
TopK = Annotated[int, typer.Option("--top-k", help="Sample among the k most likely tokens (0 = off).")]
MinP = Annotated[float, typer.Option("--min-p", help="Drop tokens below min-p × the top probability (0 = off).")]
Seed = Annotated[Optional[int], typer.Option("--seed", help="PRNG seed for reproducible sampling.")]
BlockSize = Annotated[
    Optional[int],
    typer.Option("--block-size",
                 help="Tokens per verify block, anchor included (2..checkpoint block_size; "
                      "default: the checkpoint's). vLLM's num_speculative_tokens is this minus one."),
]
DraftQuant = Annotated[
    Optional[str],
    typer.Option("--draft-quant", help="Quantize the drafter in memory, e.g. w4a32:gs64, w8a32, w4abf16."),
]
SystemPrompt = Annotated[Optional[str], typer.Option("--system-prompt", help="System message for the chat template.")]
IgnoreChatTemplate = Annotated[
    bool, typer.Option("--ignore-chat-template", help="Feed the prompt as raw text, without the chat template."),
]
ChatTemplateConfig = Annotated[
    Optional[str],
    typer.Option("--chat-template-config", help='JSON passed to the chat template, e.g. \'{"enable_thinking": false}\'.'),
]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON object instead of streaming text.")]
AR = Annotated[bool, typer.Option("--ar", help="Plain autoregressive decoding (the baseline).")]
Debug = Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")]
