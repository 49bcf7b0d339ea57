"""Serving: an engine service (requests batched into shared target passes, a FIFO queue, a prompt
cache across requests) behind thin OpenAI and Anthropic protocol layers, and
the ASGI app that routes to them. `dflash2 serve` (cli/serve.py) runs it."""
