"""The `dflash2` command line."""

import sys

import typer

from .bench import bench
from .chat import chat
from .compare import compare
from .doctor import doctor
from .errors import run_guarded
from .generate import generate
from .quantize import quantize
from .serve import serve
from .train import train
from .analyze import analyze

app = typer.Typer(
    name="dflash2",
    help="Lossless DFlash 2 speculative decoding on MLX.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
app.command()(generate)
app.command()(quantize)
app.command()(train)
app.command()(chat)
app.command()(compare)
app.command()(bench)
app.command()(doctor)
app.command()(analyze)
app.command()(serve)


@app.callback()
def _root():
    """Lossless DFlash 2 speculative decoding on MLX."""


def main(argv=None) -> None:
    sys.exit(run_guarded(app, argv))


if __name__ == "__main__":
    main()
