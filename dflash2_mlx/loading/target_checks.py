"""A target folder checked before mlx-lm loads it.

mlx-lm trusts its input: a config without `hidden_size` fails as a TypeError
inside `ModelArgs`, a short safetensors file as "invalid data offsets", an
empty tokenizer.json as a JSONDecodeError. Each becomes one line here, naming
the file and what to do.
"""

import inspect
from pathlib import Path

from ..engine.config_check import check_config_values
from ..errors import CheckpointError
from .safetensors_header import check_safetensors

# Files from which transformers can build a tokenizer when tokenizer.json is absent.
_OTHER_TOKENIZER_FILES = ("tokenizer.model", "vocab.json", "tokenizer.tiktoken", "vocab.txt")


def check_target_folder(folder: Path, config: dict) -> None:
    """Raise CheckpointError (or ConfigError) on what would make mlx-lm fail obscurely."""
    _check_args(folder, config)
    for f in sorted(folder.glob("*.safetensors")):
        check_safetensors(f, "target")
    check_tokenizer_files(folder)


def _check_args(folder: Path, config: dict) -> None:
    try:
        from mlx_lm.utils import _get_classes  # mlx-lm's own model-type lookup (with its remapping)

        _, args_class = _get_classes(config)
    except Exception:  # an unknown type is reported by the family check / mlx-lm itself
        return
    params = inspect.signature(args_class).parameters
    missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in config
               and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    if missing:
        more = f" (and {', '.join(missing[1:])})" if len(missing) > 1 else ""
        raise CheckpointError(f"target config '{folder / 'config.json'}' lacks {missing[0]}{more}: it is not a "
                              f"complete {config.get('model_type')} config (download it again)")
    check_config_values(args_class, {k: v for k, v in config.items() if k in params}, "target")


def check_tokenizer_files(folder: Path) -> None:
    path = folder / "tokenizer.json"
    if not path.exists():
        if not any((folder / name).exists() for name in _OTHER_TOKENIZER_FILES):
            raise CheckpointError(f"target folder '{folder}' has no tokenizer.json (nor another tokenizer file): "
                                  "copy the model's tokenizer files next to its weights")
        return
    try:
        with open(path, "rb") as f:
            head = f.read(4096).lstrip()  # not parsed whole here: a real one is megabytes
    except OSError as e:
        raise CheckpointError(f"target tokenizer '{path}' cannot be read ({e.strerror})") from None
    if not head:
        raise CheckpointError(f"target tokenizer '{path}' is empty: download it again")
    if not head.startswith(b"{"):
        raise CheckpointError(f"target tokenizer '{path}' is not a JSON object: download it again")
