"""Disk writes on their own thread, so the model's worker never waits for a file.

MLX evaluation is not thread safe and its streams belong to the thread that
made them (`mx.save_safetensors` evaluates its arrays internally; mlx-swift
holds its eval lock around it for that reason, ml-explore/mlx-swift#378). So
the worker evaluates a block and copies its arrays out as plain bytes
(`encode`) before handing it over, and this thread touches no MLX at all: it
writes the safetensors layout itself (`write_safetensors`: an 8-byte header
length, a JSON header with each tensor's dtype, shape and byte range and the
string metadata, then the bytes), which `mx.load` and mlx-lm read as any
other safetensors file.

The queue is bounded in bytes: when the disk falls behind, `submit` waits
(the memory held for writes stays bounded) rather than dropping blocks.
"""

import json
import threading
from collections import deque
from dataclasses import dataclass
from typing import Callable

import mlx.core as mx

# safetensors' dtype names for the MLX dtypes a cache holds.
DTYPES = {mx.bool_: "BOOL", mx.uint8: "U8", mx.uint16: "U16", mx.uint32: "U32", mx.uint64: "U64",
          mx.int8: "I8", mx.int16: "I16", mx.int32: "I32", mx.int64: "I64", mx.float16: "F16",
          mx.bfloat16: "BF16", mx.float32: "F32", mx.float64: "F64"}

DEFAULT_QUEUE_BYTES = 1 << 30


@dataclass(frozen=True)
class Tensor:
    """An evaluated array as bytes (row-major), safe to use on any thread."""

    dtype: str
    shape: tuple
    data: bytes


def encode(arrays: dict) -> dict[str, Tensor]:
    """The arrays as `Tensor`s; runs on the thread that owns them (it evaluates)."""
    mx.eval(list(arrays.values()))
    return {name: Tensor(DTYPES[a.dtype], tuple(a.shape), memoryview(a).tobytes()) for name, a in arrays.items()}


def write_safetensors(file, tensors: dict[str, Tensor], metadata: dict[str, str]) -> None:
    """Write `tensors` in the safetensors layout to the open binary `file`."""
    header, offset = {"__metadata__": metadata}, 0
    for name in sorted(tensors):
        t = tensors[name]
        header[name] = {"dtype": t.dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(t.data)]}
        offset += len(t.data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned, as the format asks
    file.write(len(raw).to_bytes(8, "little"))
    file.write(raw)
    for name in sorted(tensors):
        file.write(tensors[name].data)


class DiskWriter:
    """One background thread running `write(job)` for each submitted job, in order.

    `write` must not raise (it reports its own failures); anything it raises
    anyway is handed to `on_error` as one line, and the thread goes on."""

    def __init__(self, write: Callable[[object], None], on_error: Callable[[str], None],
                 max_bytes: int = DEFAULT_QUEUE_BYTES):
        self._write, self._on_error, self.max_bytes = write, on_error, max_bytes
        self._jobs: deque = deque()
        self._queued_bytes = 0
        self._busy = False
        self._closed = False
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="dflash2-cache-writer", daemon=True)
        self._thread.start()

    def submit(self, job, nbytes: int) -> None:
        """Queue `job`; waits while the queue holds `max_bytes` (at least one job always fits)."""
        with self._cv:
            while self._jobs and self._queued_bytes + nbytes > self.max_bytes and not self._closed:
                self._cv.wait()
            self._jobs.append((job, nbytes))
            self._queued_bytes += nbytes
            self._cv.notify_all()

    def flush(self) -> None:
        """Wait until every submitted job is written."""
        with self._cv:
            while (self._jobs or self._busy) and self._thread.is_alive():
                self._cv.wait()

    def close(self) -> None:
        """Write what is queued, then end the thread."""
        self.flush()
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._jobs and not self._closed:
                    self._cv.wait()
                if not self._jobs:
                    return
                job, nbytes = self._jobs.popleft()
                self._busy = True
            try:
                self._write(job)
            except Exception as e:  # a bug must not end the thread: later blocks still get written
                self._on_error(f"prompt cache: a disk write failed ({type(e).__name__}: {e}); the block stays in memory only")
            finally:
                with self._cv:
                    self._busy = False
                    self._queued_bytes -= nbytes
                    self._cv.notify_all()
