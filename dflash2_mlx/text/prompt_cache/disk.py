"""The disk tier: one safetensors file per block, least recently used out first.

The format is mlx-lm's prompt-cache format (`mx.save_safetensors` with the
tensors by name and the rest as string metadata) with a header that makes a
file checkable on its own: the format version, the block's key, the pair's
fingerprint, the block's token ids and a sha256 of every tensor's bytes. A
file is written to a temporary name and renamed, so a reader never sees half
a file; a file that fails any check (corrupt, truncated, another pair's or
another block's) is skipped with one warning and deleted, so it is never read
as a hit. Temporary files of writers that died (kill -9) are removed at start.

`prepare` runs on the thread that owns the arrays (it evaluates them and
copies their bytes out); `write` touches no MLX and runs on the writer thread
(writer.py). One lock keeps the index of files and the byte count right while
the writer adds and evicts files and the worker reads, touches and drops them;
a file is read under it, so eviction never deletes one while it is read.
"""

import hashlib
import json
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import mlx.core as mx

from .keys import FORMAT_VERSION
from .layers import flatten, unflatten
from .writer import Tensor, encode, write_safetensors

SUFFIX = ".safetensors"
TMP_PREFIX = ".tmp-"


def checksum(data: dict) -> str:
    """sha256 over the tensors' names and bytes (bytes, or arrays with the buffer protocol)."""
    h = hashlib.sha256()
    for name in sorted(data):
        h.update(name.encode())
        h.update(memoryview(data[name]).tobytes())
    return h.hexdigest()


@dataclass(frozen=True)
class Write:
    """One block ready to write: its bytes and its header (checksum added by `write`)."""

    key: str
    tensors: dict  # name -> Tensor
    meta: dict
    nbytes: int


class DiskTier:
    """Blocks on disk under `folder`, bounded by `max_bytes` (LRU by file time)."""

    def __init__(self, folder, max_bytes: int, fingerprint: str, warn: Callable[[str], None]):
        self.folder = Path(folder).expanduser()
        self.max_bytes, self.fingerprint, self.warn = max_bytes, fingerprint, warn
        self.folder.mkdir(parents=True, exist_ok=True)
        self.hits = self.writes = self.skipped = 0
        self._sizes: dict[str, int] = {}  # key -> bytes, oldest use first
        self.nbytes = 0  # a count, not a sum: /metrics reads it from another thread
        self._too_big_warned = False
        self._failed: set = set()  # write errors already said (one line each)
        self._lock = threading.RLock()
        self._scan()

    def _scan(self) -> None:
        found = []
        for path in self.folder.iterdir():
            if path.name.startswith(TMP_PREFIX):
                _remove_if_orphaned(path)
            elif path.name.endswith(SUFFIX) and path.is_file():
                st = path.stat()
                found.append((st.st_mtime, path.name[: -len(SUFFIX)], st.st_size))
        for _, key, size in sorted(found):
            self._sizes[key] = size
        self.nbytes = sum(self._sizes.values())

    def __contains__(self, key: str) -> bool:
        with self._lock:
            return key in self._sizes

    def _path(self, key: str) -> Path:
        return self.folder / f"{key}{SUFFIX}"

    def load(self, key: str, tokens) -> Optional[list[dict]]:
        """The block's layer parts, or None (missing, or skipped with one warning)."""
        with self._lock:  # the writer's eviction waits: the file stays while it is read
            if key not in self._sizes:
                return None
            path = self._path(key)
            try:
                arrays, meta = mx.load(str(path), return_metadata=True)
                why = self._check(key, tokens, arrays, meta)  # reads every byte (mx.load is lazy)
                parts = None if why else unflatten(arrays, json.loads(meta["layout"]))
                if parts is None and not why:
                    why = "its layout does not match its tensors"
            except Exception as e:  # a truncated or garbled file: mlx raises many kinds
                why = f"it cannot be read ({type(e).__name__})"
            if why:
                self._drop(key, f"prompt cache: skipped '{path}': {why}; it was deleted and will be rebuilt")
                return None
            self.hits += 1
            self._touch(key)
            return parts

    def _check(self, key: str, tokens, arrays: dict, meta: dict) -> str:
        if meta.get("format") != str(FORMAT_VERSION):
            return "it is not this block's file (another format)"
        # Before the key: another pair's file (weights, dtype) says so, whatever its name.
        if meta.get("fingerprint") != self.fingerprint:
            return "it was written for another model, dtype or setting"
        if meta.get("key") != key:
            return "it is not this block's file (another key)"
        if meta.get("tokens") != json.dumps(list(tokens)):
            return "its tokens differ from the block's"
        if meta.get("checksum") != checksum(arrays):
            return "its checksum does not match (corrupt)"
        return ""

    def prepare(self, key: str, tokens, parts: list[dict]) -> Optional[Write]:
        """The block as bytes for `write`, or None when it is on disk already or
        cannot fit the budget (said once). Runs on the thread that owns `parts`."""
        if key in self or self.max_bytes <= 0:
            return None
        arrays, layout = flatten(parts)
        size = sum(a.nbytes for a in arrays.values())
        if size > self.max_bytes:
            if not self._too_big_warned:
                self._too_big_warned = True
                self.warn(f"prompt cache: a block of {size} bytes does not fit the disk budget of "
                          f"{self.max_bytes} bytes; nothing is written to disk (raise --cache-disk-bytes)")
            return None
        meta = {"format": str(FORMAT_VERSION), "key": key, "fingerprint": self.fingerprint,
                "tokens": json.dumps(list(tokens)), "layout": json.dumps(layout)}
        return Write(key, encode(arrays), meta, size)

    def write(self, job: Write) -> Optional[str]:
        """Write one block atomically, then evict the oldest down to the bound.
        Any thread (no MLX here); returns the warning line of a failed write,
        said once per kind of failure (a full disk, a folder gone)."""
        tensors: dict[str, Tensor] = job.tensors
        meta = {**job.meta, "checksum": checksum({name: t.data for name, t in tensors.items()})}
        tmp = self.folder / f"{TMP_PREFIX}{os.getpid()}-{job.key}{SUFFIX}"
        try:
            with open(tmp, "wb") as f:
                write_safetensors(f, tensors, meta)
            with self._lock:
                os.replace(tmp, self._path(job.key))
                size = self._path(job.key).stat().st_size
                self.nbytes += size - self._sizes.pop(job.key, 0)
                self._sizes[job.key] = size
                self.writes += 1
                self._evict()
        except OSError as e:
            _unlink(tmp)
            if e.errno in self._failed:
                return None
            self._failed.add(e.errno)
            return f"prompt cache: cannot write to '{self.folder}' ({e.strerror}); blocks stay in memory only"
        return None

    def save(self, key: str, tokens, parts: list[dict]) -> None:
        """`prepare` and `write` on the calling thread."""
        job = self.prepare(key, tokens, parts)
        line = self.write(job) if job is not None else None
        if line:
            self.warn(line)

    def _evict(self) -> None:  # under the lock
        """Delete the least recently used files (never the newest) down to the bound."""
        while len(self._sizes) > 1 and self.nbytes > self.max_bytes:
            oldest = next(iter(self._sizes))
            self._path(oldest).unlink(missing_ok=True)
            self.nbytes -= self._sizes.pop(oldest)

    def _touch(self, key: str) -> None:  # under the lock
        self._sizes[key] = self._sizes.pop(key)
        try:
            os.utime(self._path(key))  # the order survives a restart
        except OSError:
            pass

    def _drop(self, key: str, line: str) -> None:  # under the lock
        self.skipped += 1
        self.nbytes -= self._sizes.pop(key, 0)
        self._path(key).unlink(missing_ok=True)
        self.warn(line)


def _remove_if_orphaned(path: Path) -> None:
    """Remove a temporary file whose writer is gone (its pid is in the name)."""
    try:
        pid = int(path.name[len(TMP_PREFIX):].split("-", 1)[0])
        os.kill(pid, 0)
        if pid != os.getpid():
            return  # another live process is writing it
    except (ValueError, ProcessLookupError):
        pass
    except PermissionError:
        return
    path.unlink(missing_ok=True)


def _unlink(path: Path) -> None:
    """Remove `path` if it can be (the folder itself may be what failed)."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass
