"""Continuous batching with speculation: several sequences share each target pass (docs/batching.md)."""
