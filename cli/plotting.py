"""The --plot flags of bench, analyze and compare, and their check before the work."""

from pathlib import Path
from typing import Annotated, Optional

import typer

PlotDir = Annotated[
    Optional[Path],
    typer.Option("--plot", help="Also draw the plots into this folder (PNG and SVG, with the plotted data as JSON beside "
                                "each); needs matplotlib: pip install 'dflash2-mlx[plots]'."),
]
PlotFile = Annotated[
    Optional[Path],
    typer.Option("--plot", help="Also draw both arms' tokens against time to this file (.png and .svg, with the "
                                "plotted data as .json beside it); needs matplotlib: pip install 'dflash2-mlx[plots]'."),
]


def check_plot(path, folder: bool = False) -> None:
    """Before the work: matplotlib is there and the plot's place is writable (one line if not)."""
    if path is None:
        return
    from dflash2_mlx.files import check_writable
    from dflash2_mlx.tools.plots import require

    require()
    check_writable(Path(path) / "probe.png" if folder else Path(path), "--plot")
