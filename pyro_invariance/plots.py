"""Plots users expect from a symmetry-learning run (matplotlib, saved to files)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_eta_history(histories: Mapping[str, Mapping[str, Any]], path: str | Path, title: str = "") -> Path:
    """η (radians / normalised units) and ELBO/N over training for one or more runs.

    ``histories`` maps a run label to a ``FitResult.history``.
    """
    fig, (ax_eta, ax_elbo) = plt.subplots(1, 2, figsize=(10, 3.6))
    for label, hist in histories.items():
        for name, values in hist.get("eta", {}).items():
            ax_eta.plot(hist["step"], values, label=f"{label}: η_{name}")
        ax_elbo.plot(hist["step"], _smooth(hist["elbo"]), label=label)
    ax_eta.axhline(math.pi, color="grey", ls=":", lw=1)
    ax_eta.set(xlabel="step", ylabel="η", title="symmetry parameters")
    ax_elbo.set(xlabel="step", ylabel="ELBO / N (smoothed)", title="bound")
    for ax in (ax_eta, ax_elbo):
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def plot_filter_bank(model: Any, path: str | Path, rows: Sequence[int] = (0, 1, 2, 3), num: int = 7) -> Path:
    """First-layer rows warped over ε ∈ [-1, 1] (paper 003, Fig. 3); needs ``model.filter_bank``."""
    bank = model.filter_bank(rows, num=num)  # (R, num, C, h, w)
    fig, axes = plt.subplots(len(rows), num, figsize=(1.2 * num, 1.2 * len(rows)), squeeze=False)
    for r in range(len(rows)):
        limit = float(bank[r].abs().max()) or 1.0
        for j in range(num):
            img = bank[r, j]
            img = img[0] if img.shape[0] == 1 else img.permute(1, 2, 0)
            axes[r][j].imshow(img.cpu().numpy(), cmap="RdBu_r", vmin=-limit, vmax=limit)
            axes[r][j].axis("off")
    eta = {k: round(float(v), 2) for k, v in model.symmetry_parameters().items()}
    fig.suptitle(f"filter bank, η = {eta}")
    fig.tight_layout()
    return _save(fig, path)


def _smooth(values: Sequence[float], window: int = 25) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def _save(fig: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
