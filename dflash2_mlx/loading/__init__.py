"""Loading: the Hub and local folders, checkpoints, draft quantization, the pair."""
