"""One look for every figure (seaborn), and saving as PNG + PDF atomically."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, never a window

import matplotlib.pyplot as plt  # noqa: E402
import seaborn as sns  # noqa: E402

from moespac.atomic import atomic_path  # noqa: E402

PAPER_STYLE = dict(color="0.35", linestyle="--", linewidth=1.2)
TIMING_NOTE = {"measured": "measured on this machine", "simulated": "simulated", "wrapped": "wrapped (as shipped)"}


def setup() -> None:
    sns.set_theme(context="paper", style="whitegrid", palette="colorblind", font_scale=1.1)
    plt.rcParams.update({"figure.dpi": 110, "savefig.bbox": "tight", "pdf.fonttype": 42})


def figure(ncols: int = 1, width: float = 4.6, height: float = 3.4):
    setup()
    fig, axes = plt.subplots(1, ncols, figsize=(width * ncols, height), squeeze=False)
    return fig, list(axes[0])


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


def footnote(fig, text: str) -> None:
    fig.text(0.01, -0.02, text, fontsize=7, color="0.3", ha="left", va="top", wrap=True)
