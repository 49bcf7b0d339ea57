"""A target folder checked before mlx-lm loads it.

mlx-lm trusts its input: a config without `hidden_size` fails as a TypeError
inside `ModelArgs`, a short safetensors file as "invalid data offsets", an
empty tokenizer.json as a JSONDecodeError. Each becomes one line here, naming
the file and what to do.
"""

import re
from pathlib import Path

from ..errors import CheckpointError
from .model_classes import model_classes
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
        _, args_class = model_classes(config)  # mlx-lm's own model-type lookup (with its remapping)
    except Exception:  # an unknown type is reported by the family check / mlx-lm itself
        return
    # Built the way load_model builds it (some families nest or rename keys in from_dict),
    # so a missing key is named as mlx-lm itself would miss it.
    try:
        args_class.from_dict(config)
    except TypeError as e:
        missing = re.search(r"missing \d+ required [\w -]*arguments?: (.*)$", str(e))
        if missing is None:
            return  # a wrong type or value: load_model's own failure is reported as one line
        names = re.findall(r"'(\w+)'", missing[1])
        raise CheckpointError(f"target config '{folder / 'config.json'}' lacks {' and '.join(names)}: it is not a "
                              f"complete {config.get('model_type')} config (download it again)") from None
    except Exception:
        return


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
