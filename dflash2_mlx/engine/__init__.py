"""The engine: token ids in, token ids out (target adapter, drafter, selector, decode loops)."""
