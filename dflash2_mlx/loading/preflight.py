"""Checks that need no rank: run by the command that is about to start ranks."""

from pathlib import Path

from ..engine.target.adapter import check_supported
from .builtin import resolve_builtin
from .checkpoints import read_config
from .hub import check_reference
from .model_classes import model_classes
from .sharded import check_shardable


def check_local_target_splits(ref: str, ranks: int) -> None:
    """Before any rank starts: refuse a target on this disk (a folder or
    `builtin`) that `ranks` ranks cannot split. Hub references are left to the
    ranks (checking them here could mean a download)."""
    check_reference(resolve_builtin(ref, "target"), "target")  # a missing folder: one line here, not one per rank
    folder = Path(resolve_builtin(ref, "target")).expanduser()
    if not (folder / "config.json").is_file():
        return
    config = read_config(folder, "target")
    model_type = config.get("model_type")
    if model_type is None:
        return  # the ranks' loader says what is wrong
    check_supported(model_type)
    model_cls, args_cls = model_classes(config)
    # Parameters are lazy until evaluated: building the model reads and computes nothing.
    check_shardable(model_cls(args_cls.from_dict(config)), model_type, ranks)
