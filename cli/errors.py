"""The CLI's one error boundary: known failures become one line, exit non-zero."""

import sys
import traceback
import warnings

import typer

from dflash2_mlx.errors import DFlashError

from .stdio import INTERRUPTED, report_interrupted
from .terminate import Terminated, arrivals, report_terminated


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    print(f"warning: {message}", file=sys.stderr)


def run_guarded(app, argv=None) -> int:
    debug = "--debug" in (argv if argv is not None else sys.argv[1:])
    if not debug:
        warnings.showwarning = _one_line_warning
    sigterms = arrivals()
    try:
        code = app(args=argv, standalone_mode=False)
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:  # click's spelling of an interrupted prompt
        return report_interrupted()
    except typer.TyperException as e:  # bad flags and values: click's usage errors
        if type(e).__name__ == "NoArgsIsHelpError":  # bare `dflash2`: show the help
            print(e.format_message())
            return 0
        ctx = getattr(e, "ctx", None)
        where = f"dflash2 {ctx.info_name}" if ctx is not None and ctx.parent is not None else "dflash2"
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        _fail(f"{message} (see: {where} --help)")
        return getattr(e, "exit_code", 2)
    except KeyboardInterrupt:
        return report_interrupted()
    except Terminated:  # SIGTERM (terminate.py): unwound like Ctrl-C
        return report_terminated()
    except Exception as e:
        if arrivals() > sigterms:  # the unwinding of a SIGTERM, whatever exception it became
            return report_terminated()
        return _report_failure(e, debug)
    # Typer turns a KeyboardInterrupt that escapes a command into Exit(130) and,
    # outside standalone mode, *returns* that code; no command exits 130 itself.
    if code == INTERRUPTED:
        return report_interrupted()
    return code if isinstance(code, int) and not isinstance(code, bool) else 0


def _report_failure(e: Exception, debug: bool) -> int:
    if debug:
        traceback.print_exc()
    if isinstance(e, DFlashError):
        from .inputs import flag_message  # a request's field is told as its flag

        _fail(flag_message(e))
        return 1
    # A bug: still one line unless --debug.
    first = str(e).splitlines()[0] if str(e) else ""
    _fail(f"internal error: {type(e).__name__}: {first} (rerun with --debug for the traceback)")
    return 1


# Set in a distributed rank ("[rank 1] "), so the parent can tell whose line it is.
_prefix = ""


def set_prefix(prefix: str) -> None:
    global _prefix
    _prefix = prefix


def fail(message: str) -> None:
    """Print the one error line."""
    print(f"{_prefix}error: {message}", file=sys.stderr, flush=True)


_fail = fail
