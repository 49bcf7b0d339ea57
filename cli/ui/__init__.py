"""All Rich code lives in this package; everything else hands it plain data.

The commands import `ui` and nothing below it; each module here has one job:

- `style`: the consoles, colours and small formatters the views share;
- `progress`: train's, bench's and analyze's progress;
- `chat_view`: what `dflash2 chat` draws;
- `replay`: compare's live side-by-side view;
- `tables`: the closing reports of compare, bench and doctor.

`generate`'s plain lines live in `cli/closing.py` (no Rich) and are re-exported
here for the other commands. Each renderer is a pure function of its data.
"""

from ..closing import (  # noqa: F401  (re-exported)
    block_label, block_lines, builtin_notice, closing_lines, measuring_costs, print_closing, stream_text, timed_note,
)
from .chat_view import (  # noqa: F401
    CHAT_COMMANDS, ChatView, acceptance_bars, chat_help, header_panel, turn_line, turn_stats,
)
from .progress import AnalyzeProgress, BarProgress, RunProgress, TrainProgress, eval_line  # noqa: F401
from .replay import compare_panes, final_panes, replay  # noqa: F401
from .style import (  # noqa: F401
    DRAFT_STYLE, MUTED, STATUS_MARK, console, err_console, gb, machine_line, make_console, positions_text,
    print_whole, progress_note, status,
)
from .tables import (  # noqa: F401
    bench_report, bench_table, compare_table, doctor_section, doctor_summary, parity_text,
)
