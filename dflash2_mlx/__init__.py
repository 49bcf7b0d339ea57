"""dflash2-mlx: lossless DFlash and DFlash 2 speculative decoding on MLX.

    from dflash2_mlx import DecodeRequest, load_pair, stream_generate

    pair, tokenizer = load_pair("builtin", "builtin")
    for response in stream_generate(pair, tokenizer, "def fib(n):", DecodeRequest(max_tokens=64)):
        print(response.text, end="")

The public names below are imported on first use, so `import dflash2_mlx`
(and the CLI's start-up) does not pay for MLX and mlx-lm until they are needed.
"""

__version__ = "0.1.0"

# name -> module (under this package) that defines it
_PUBLIC = {
    "load_pair": "loading.load_pair",
    "Pair": "engine.pair",
    "stream_generate": "text.generate",
    "GenerationResponse": "text.generate",
    "GenerationStats": "text.stats",
    "SamplingParams": "engine.sampling",
    "DecodeCache": "engine.decode.loop",
    "ChatSession": "text.chat_session",
    "PromptCache": "text.prompt_cache",
    "CacheSettings": "text.prompt_cache",
    "generate_step": "engine.decode.loop",
    "DecodeRequest": "engine.request",
    "DecodePlan": "engine.plan",
    "plan": "engine.plan",
    "calibration_for": "engine.plan",
    "DFlashError": "errors",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name):
    if name in _PUBLIC:
        from importlib import import_module

        value = getattr(import_module(f".{_PUBLIC[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
