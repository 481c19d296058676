"""One look for every figure (seaborn), and saving as PNG + PDF atomically."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402

from moespac.analysis.paper import SETTING  # noqa: E402
from moespac.atomic import atomic_path  # noqa: E402

PAPER_COLOR = "0.35"  # the paper's numbers are grey in every figure, ours in the palette's colours
PAPER_STYLE = dict(color=PAPER_COLOR, linestyle="--", linewidth=1.2)
PAPER_SETUP = SETTING  # the paper's Sec. 4.1 setting, not ours
TIMING_NOTE = {"measured": "measured on this machine", "simulated": "simulated", "wrapped": "wrapped (as shipped)"}


def setup() -> None:
    sns.set_theme(context="paper", style="whitegrid", palette="colorblind", font_scale=1.1)
    plt.rcParams.update({"figure.dpi": 110, "savefig.bbox": "tight", "pdf.fonttype": 42})


def figure(ncols: int = 1, width: float = 4.6, height: float = 3.4, nrows: int = 1):
    """A figure of nrows x ncols panels, the axes row by row in one list."""
    setup()
    # constrained layout keeps neighbouring panels' labels, titles and outside legends apart
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False,
                             layout="constrained")
    return fig, list(axes.flat)


def save(fig, prefix) -> list[Path]:
    """PREFIX.png and PREFIX.pdf, byte-identical for the same figure (the PDF's creation date is left out)."""
    prefix = Path(prefix)
    paths = []
    for ext in ("png", "pdf"):
        path = prefix.with_suffix(f".{ext}")
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=ext, metadata={"CreationDate": None} if ext == "pdf" else None)
        paths.append(path)
    plt.close(fig)
    return paths


def placeholder(ax, message: str) -> None:
    """An empty panel that says why it is empty."""
    ax.set_axis_off()
    ax.text(0.5, 0.5, message, ha="center", va="center", wrap=True, fontsize=9, transform=ax.transAxes,
            bbox=dict(boxstyle="round", facecolor="0.95", edgecolor="0.6"))


def palette(n: int) -> list:
    """n colours of the figures' palette (ours; the paper's numbers are PAPER_COLOR)."""
    import seaborn as sns

    return sns.color_palette(n_colors=max(n, 1))


def looks(n: int) -> list[tuple]:
    """n distinct (colour, marker) pairs: the palette has 10 colours, so past them the marker tells series apart."""
    colours, markers = palette(min(n, 10)), "osD^vPX*"
    return [(colours[i % len(colours)], markers[(i // len(colours) + i) % len(markers)]) for i in range(max(n, 1))]


def footnote(fig, text: str, y: float = -0.02) -> None:
    """A note under the figure (its top at `y`, in figure fraction), wrapped to the figure's width (matplotlib's
    own wrap clips at a tight bounding box)."""
    import textwrap

    width = max(40, int(fig.get_figwidth() * 72 / (0.6 * 7)))  # characters of 7 pt type across the figure
    fig.text(0.01, y, textwrap.fill(text, width), fontsize=7, color="0.3", ha="left", va="top")


def paper_label(what: str, setup: str = PAPER_SETUP) -> str:
    """The label of every artist that draws one of the paper's numbers: whose it is and on what it was run."""
    return f"paper: {what} ({setup})"


def rate_axis(ax, label: str) -> None:
    """The one y-range rule of every tokens/s or latency axis: a linear one starts at 0, so that heights are
    proportional to the values and a 0.5 % change is drawn as 0.5 %, not as a cliff; a log one (values over
    decades) says so. Call it after plotting: it fixes the range."""
    if ax.get_yscale() == "log":
        ax.set_ylabel(f"{label}, log scale")
    else:
        ax.set_ylabel(label)
        top = ax.dataLim.y1  # the highest value drawn, plus the usual margin
        ax.set_ylim(0, 1.05 * top if top > 0 else 1)
