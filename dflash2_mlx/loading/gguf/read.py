"""A GGUF file's metadata and tensors, read with llama.cpp's own `gguf` package (gguf-py).

gguf-py memory-maps the file and knows every GGML type; MLX's `mx.load` keeps only
Q4_0/Q4_1/Q8_0 packed and widens or refuses the rest. Tensors stay raw blocks here until
repack.py turns each one into MLX arrays, so a file is never held twice.
"""

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...errors import CheckpointError


@dataclass(frozen=True)
class Tensor:
    """One tensor of the file: its GGML type name, its shape in MLX's (row-major) order and
    its bytes as gguf-py maps them (float arrays for float types, raw blocks otherwise)."""

    name: str
    kind: str
    shape: tuple[int, ...]
    raw: np.ndarray

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1


def check_gguf_file(path: Path) -> None:
    """Refuse a path that is not a GGUF file (missing, a folder, other bytes) before any work."""
    if not path.is_file():
        raise CheckpointError(f"GGUF file '{path}' does not exist")
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise CheckpointError(f"'{path}' is not a GGUF file (it does not start with 'GGUF')")


def _field_value(field):
    """A metadata field as Python: str, number, bool, list of str, or a numpy array of numbers."""
    from gguf import GGUFValueType

    kind = field.types[0]
    if kind == GGUFValueType.ARRAY:
        if field.types[-1] == GGUFValueType.STRING:
            return field.contents()
        return np.concatenate([field.parts[i] for i in field.data]) if field.data else np.array([])
    return field.contents()


def read_gguf(path: Path) -> tuple[dict[str, Tensor], dict]:
    """(tensors by name, metadata by key) of the GGUF file at `path`."""
    path = Path(path)
    check_gguf_file(path)
    try:
        from gguf import GGUFReader
    except ImportError:
        raise CheckpointError("reading GGUF files needs the 'gguf' package: pip install gguf") from None
    try:
        reader = GGUFReader(str(path))
    except Exception as e:  # a truncated or corrupt file: gguf-py's message, on one line
        raise CheckpointError(f"GGUF '{path}' cannot be read ({str(e).splitlines()[0]}): "
                              "the file is incomplete or damaged; download it again") from None
    metadata = {key: _field_value(field) for key, field in reader.fields.items() if not key.startswith("GGUF.")}
    tensors = {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        tensors[t.name] = Tensor(t.name, t.tensor_type.name, shape, t.data)
    return tensors, metadata
