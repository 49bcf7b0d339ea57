"""The `dflash2` console script.

Standard library only: the command modules take about a second to import, and
a Ctrl-C during that second must still end as one line and status 130, not a
traceback. Once the outcome is decided, a second Ctrl-C is ignored so shutdown
cannot print one either.
"""

import signal
import sys

from . import stdio


def main() -> None:
    stdio.reopen_closed_streams()
    try:
        from .main import main as run  # typer, rich, mlx: the slow part

        run()
        code = 0
    except SystemExit as e:
        code = e.code
    except KeyboardInterrupt:
        code = stdio.report_interrupted()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sys.exit(code)
