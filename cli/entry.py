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
        from .main import main as run  # typer, rich, mlx: the slow part

        run()
        code = 0
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt:
        code = stdio.report_interrupted()
    except terminate.Terminated:
        code = terminate.report_terminated()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    sys.exit(code)
