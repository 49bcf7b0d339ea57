"""The `dflash2` console script.

Standard library only: the command modules take about a second to import, and
a Ctrl-C during that second must still end as one line and status 130, not a
traceback. SIGTERM is the same, as `error: terminated` and status 143
(terminate.py). Once the outcome is decided, a second signal is ignored so
shutdown cannot print one either.
"""

import signal
import sys

from . import stdio, terminate


def main() -> None:
    terminate.install()
    stdio.reopen_closed_streams()
    try:
        code = _run()
    # A signal that lands after the command's own outcome, while it is reported and
    # before signals are ignored, is still one line, not a traceback.
    except KeyboardInterrupt:
        code = stdio.report_interrupted()
    except terminate.Terminated:
        code = terminate.report_terminated()
    _ignore_signals()
    sys.exit(code)


def _run():
    try:
        from .main import main as run  # typer, rich, mlx: the slow part

        run()
        code = 0
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt:
        code = stdio.report_interrupted()
    except terminate.Terminated:
        code = terminate.report_terminated()
    _ignore_signals()
    return code


def _ignore_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
