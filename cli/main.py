"""The `dflash2` command line.

Commands are imported only when they run: `dflash2 generate` should not wait
for the trainer, the benchmark tools or Rich's live views (mlx-lm alone costs
about a second of imports, and only the commands that load a model pay it,
after their arguments parsed). The full list is built for `dflash2 --help` and
when no command is named.
"""

import sys
from importlib import import_module
from typing import Annotated

import typer

from .errors import run_guarded

# Command name -> module under cli/ that defines the function of that name.
COMMANDS = ("generate", "convert", "quantize", "train", "chat", "compare", "bench", "doctor", "analyze", "serve",
            "launch")


def build_app(only=None) -> typer.Typer:
    """The Typer app with every command, or only `only` (the one about to run)."""
    app = typer.Typer(
        name="dflash2",
        help="Lossless DFlash 2 speculative decoding on MLX.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
        rich_markup_mode=None,
    )
    for name in COMMANDS if only is None else [only]:
        app.command()(getattr(import_module(f".{name}", __package__), name))

    # A callback keeps the app a group, so the command name stays an argument
    # even when only one command is registered.
    @app.callback()
    def _root(
        version: Annotated[bool, typer.Option("--version", is_eager=True, callback=_show_version,
                                              help="Print the version (and MLX's, mlx-lm's) and exit.")] = False,
    ):
        """Lossless DFlash 2 speculative decoding on MLX."""

    return app


def _show_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        def v(name):
            try:
                return version(name)
            except PackageNotFoundError:
                return "not installed"

        print(f"dflash2 {v('dflash2-mlx')} (mlx {v('mlx')}, mlx-lm {v('mlx-lm')})")
        raise typer.Exit()


def _command_in(argv) -> str | None:
    args = sys.argv[1:] if argv is None else list(argv)
    first = next((a for a in args if not a.startswith("-")), None)
    return first if first in COMMANDS else None


_typed: list[str] = []


def typed_args() -> list[str]:
    """The arguments this command was run with (main's argv, else sys.argv's)."""
    return list(_typed)


def command_typed() -> str:
    """The command line as the user typed it, for a result file's provenance."""
    from dflash2_mlx.tools.provenance import command_line

    return command_line("dflash2", _typed)


def main(argv=None) -> None:
    _typed[:] = sys.argv[1:] if argv is None else [str(a) for a in argv]
    sys.exit(run_guarded(build_app(_command_in(argv)), argv))


def __getattr__(name):
    # `app` for callers that want the whole command line (docs, completion).
    if name == "app":
        return build_app()
    raise AttributeError(name)


if __name__ == "__main__":
    main()
