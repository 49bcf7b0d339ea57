"""User-facing errors.

Every error a user can cause (a bad path, an incompatible pair, a bad option)
is a `DFlashError` whose message is one line saying what is wrong and what to
do. The CLI prints exactly that line; anything else is a bug and keeps its
traceback.
"""


class DFlashError(Exception):
    """A known, user-fixable failure with a one-line message."""


class ConfigError(DFlashError):
    """A drafter or target config this project cannot run."""


class CheckpointError(DFlashError):
    """A checkpoint that is missing, truncated or does not match its config."""


class IncompatibleError(DFlashError):
    """A drafter that does not fit the target it was paired with."""


class UnsupportedModelError(DFlashError):
    """A target architecture the engine does not support."""


class BlockSizeError(DFlashError, ValueError):
    """A block size the pair cannot draft (also a ValueError: a bad argument)."""


class PromptTooLongError(DFlashError, ValueError):
    """A prompt that leaves no room in the target's context for an answer.

    Carries the numbers so each caller can say what to do in its own terms
    (a chat command, an HTTP field)."""

    def __init__(self, message: str, prompt_tokens: int, limit: int):
        super().__init__(message)
        self.prompt_tokens, self.limit = prompt_tokens, limit
