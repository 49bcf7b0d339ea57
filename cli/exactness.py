"""Where exactness holds, for generate's closing lines and compare's table: read
this machine's cached verdict for the pair, probing it first when there is none
(dflash2_mlx/engine/adaptive/exactness.py; docs/terminal.md)."""

from .user_cache import cache_folder
from .closing import timed_note


def exactness(pair, tokenizer, again: bool = False):
    """Whether a verify block is bitwise one-by-one decoding on this machine: cached
    beside the calibrations, probed first (well under a second on a small pair; once
    per machine and pair) when there is none or `again`. None for plain decoding,
    which is the reference itself."""
    if pair.drafter is None:
        return None
    from dflash2_mlx.engine.adaptive.exactness import exactness_path, load_or_probe
    from dflash2_mlx.text.prompt import probe_prompt

    folder = cache_folder()
    needed = again or not exactness_path(pair, folder).exists()
    with timed_note("checking whether a verify block is bitwise one-by-one decoding here, once", needed):
        # The prompt doctor's self-test reads: one verdict per pair, whatever the prompt.
        return load_or_probe(pair, folder, probe_prompt(tokenizer), again)
