"""GGUF files (llama.cpp, Ollama, LM Studio) as targets: converted once to an mlx-lm folder.

MLX reads GGUF itself (`mx.load`); this package maps a llama, qwen2 or qwen3
file's metadata to mlx-lm's config keys (config.py), its tensor names to
mlx-lm's and llama's rope layout back (weights.py), its vocabulary to a
tokenizers tokenizer (tokenizer.py), and writes and caches the folder
(convert.py). docs/gguf.md says what is supported and how it was checked.
"""
