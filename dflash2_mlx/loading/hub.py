"""Resolve a model reference (local folder or Hub repo id) to a local folder.

huggingface_hub reads HF_HUB_OFFLINE, HF_HOME and HF_TOKEN itself, so the
cache and offline mode are honoured without this library reading the
environment. Downloads show huggingface_hub's own progress bars.
"""

from pathlib import Path
from typing import Optional

from ..errors import CheckpointError

_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken", "*.py"]


def looks_like_path(ref: str) -> bool:
    """A reference that can only be a local path (not `org/name`)."""
    return ref.startswith(("/", ".", "~")) or ref.count("/") > 1 or "\\" in ref


def split_revision(ref: str) -> tuple[str, Optional[str]]:
    """`org/name@rev` -> (`org/name`, `rev`)."""
    if "@" in ref and not looks_like_path(ref):
        repo, revision = ref.rsplit("@", 1)
        return repo, revision or None
    return ref, None


def check_reference(ref: str, what: str) -> None:
    """Refuse `ref` if it can be neither a local folder nor a Hub repo id; the
    Hub is not contacted. Loaders run it on the target before the drafter, so a
    wrong target is reported first, not the drafter it was paired with."""
    path = Path(ref).expanduser()
    if path.is_dir():
        return
    if path.is_file() and ref.lower().endswith(".gguf"):
        raise CheckpointError(f"{what} '{ref}' is a GGUF file: convert it to a folder first (`dflash2 convert`, "
                              "or loading.sources.local_model)")
    if path.exists():
        raise CheckpointError(f"{what} '{ref}' is a file, not a model folder")
    if looks_like_path(ref):
        raise CheckpointError(f"{what} folder '{ref}' does not exist")
    if split_revision(ref)[0].count("/") != 1:
        raise CheckpointError(
            f"{what} '{ref}' is neither a folder nor a Hub repo id like org/name"
        )


def resolve(ref: str, what: str, revision: Optional[str] = None) -> Path:
    """Local folder for `ref`, downloading a Hub repo into the HF cache if needed."""
    path = Path(ref).expanduser()
    if path.is_dir():
        return path
    check_reference(ref, what)
    repo, rev = split_revision(ref)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        return Path(snapshot_download(repo, revision=revision or rev, allow_patterns=_PATTERNS))
    except LocalEntryNotFoundError:
        raise CheckpointError(
            f"{what} '{repo}' is not in the Hugging Face cache and the Hub cannot be reached: "
            "connect once to download it, or pass a local folder"
        ) from None
    except GatedRepoError:
        raise CheckpointError(
            f"{what} '{repo}' is gated: accept its licence on huggingface.co and set HF_TOKEN"
        ) from None
    except RevisionNotFoundError:
        raise CheckpointError(f"{what} '{repo}' has no revision '{revision or rev}'") from None
    except RepositoryNotFoundError:
        raise CheckpointError(
            f"{what} '{repo}' was not found on the Hub (check the spelling, or set HF_TOKEN "
            "for a private repo)"
        ) from None
