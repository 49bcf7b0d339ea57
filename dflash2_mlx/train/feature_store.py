"""The frozen target's features of every training sequence, computed once and kept on disk.

The target does not train, so the features of a sequence never change: later
epochs, a resumed run and a second drafter over the same sequences (the DFlash
baseline beside DFlash 2) read them back instead of running the target again.
On a CPU the target's forward is most of a training step. Features are stored
as float16 in a NumPy memory map with one "done" byte per sequence, so ranks
fill their own rows of one store and a killed run keeps every finished row.
"""

import hashlib
import os
from pathlib import Path

import mlx.core as mx
import numpy as np

from ..errors import DFlashError
from .forward import target_features


def store_key(target_identity: str, layer_ids, sequences: np.ndarray) -> str:
    """What the features are a function of: the target's weights, the layers read and the tokens."""
    h = hashlib.sha256(f"{target_identity}|{list(layer_ids)}|{sequences.shape}".encode())
    h.update(np.ascontiguousarray(sequences).tobytes())
    return h.hexdigest()[:20]


def _open_or_create(path: Path, dtype, shape) -> np.memmap:
    """Open `path` as a memory map, creating it once even when ranks race: each
    writes its own temporary file and only the first link to the name wins."""
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=shape).flush()
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    data = np.lib.format.open_memmap(path, mode="r+")
    if data.shape != tuple(shape) or data.dtype != dtype:
        raise DFlashError(f"feature store '{path}' holds {data.shape} {data.dtype}, not {tuple(shape)}: delete it")
    return data


class FeatureStore:
    def __init__(self, folder, target, layer_ids, sequences: np.ndarray, target_identity: str, name: str):
        folder = Path(folder).expanduser()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise DFlashError(f"cannot write feature store '{folder}' ({e.strerror}): choose another --feature-store") from None
        key = store_key(target_identity, layer_ids, sequences)
        N, T = sequences.shape
        self.target, self.layer_ids, self.sequences = target, list(layer_ids), sequences
        self.data = _open_or_create(folder / f"{name}-{key}.npy", np.float16, (N, T, len(layer_ids) * target.hidden_size))
        self.done = _open_or_create(folder / f"{name}-{key}.done.npy", np.uint8, (N,))

    def features(self, rows: np.ndarray) -> mx.array:
        """[len(rows), T, F] float32 features of these sequence rows, computing the missing ones."""
        missing = np.array([r for r in rows if not self.done[r]], dtype=np.int64)
        if len(missing):
            feats = target_features(self.target, mx.array(self.sequences[missing]), self.layer_ids)
            self.data[missing] = np.array(feats.astype(mx.float16))
            self.data.flush()  # rows first, then the bytes that say they are there
            self.done[missing] = 1
            self.done.flush()
        return mx.array(self.data[rows]).astype(mx.float32)

    @property
    def filled(self) -> int:
        return int(self.done.sum())
