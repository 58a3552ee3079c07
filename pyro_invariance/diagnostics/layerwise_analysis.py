"""Which layers became equivariant? Learned prior precisions, effective parameters, pathway shares.

For a fitted :class:`~pyro_invariance.models.layerwise.LayerwiseNet` and its guide (paper 004
Section 6.2, App. D; docs/methods.md §3):

* **prior precision** δ of every pathway tensor (a non-equivariant pathway with δ → ∞ is switched
  off, so the layer is strictly equivariant);
* **effective number of parameters** of a pathway tensor with ``P`` elements, Gaussian prior
  ``N(0, δ⁻¹I)`` and a Gaussian guide with covariance Σ_q (MacKay 1992; for the optimal Gaussian
  guide the Laplace expression ``Σ λ/(λ+δ)`` equals)::

      γ = P − δ·tr Σ_q                                  (0 ≤ γ ≤ P when q is at its optimum)

  summed over the tensors of a pathway (F-FC and S-FC have two);
* **relative share** of a pathway inside its block (the columns of paper 004 Table 3)::

      share_k = (γ/P)_k / Σ_k' (γ/P)_k'.

tr Σ_q is exact for guides that expose per-site distributions (mean-field, matrix-normal,
block-Cholesky: ``guide.get_distribution(site).variance``), zero for ``map`` (then γ = P: a point
estimate has no posterior volume, so the share only says which pathways exist), and a Monte-Carlo
estimate from ``num_samples`` guide draws otherwise (full-rank, low-rank). For a Laplace fit pass
its posterior, ``analyse_pathways(model, result.laplace)``
(:class:`~pyro_invariance.infer.laplace.DiagonalLaplacePosterior`): then γ = Σ h/(h+δ) exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
from pyro import poutine
from pyro.infer.autoguide import AutoDelta
from torch import Tensor

from pyro_invariance._optional import pyplot as plt
from pyro_invariance._pyro_scope import pyro_scope

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["PathwayReport", "analyse_pathways", "block_shares", "pathway_table", "plot_pathways"]

#: Display names of the pathway kinds.
KIND_LABELS = {
    "fc": "FC",
    "conv": "CONV",
    "ffc": "F-FC",
    "sfc": "S-FC",
    "sconv": "S-CONV",
    "gconv": "GCONV",
    "head": "head",
}
#: Equivariant pathway kinds (the rest break the symmetry).
EQUIVARIANT_KINDS = frozenset({"conv", "sconv", "gconv"})


@dataclass
class PathwayReport:
    """Analysis of one pathway (see module docstring).

    Attributes:
        block: block index (0..7; 8, 9 are the head layers).
        kind: pathway kind (``"fc"``, ``"conv"``, ``"ffc"``, ``"sfc"``, ``"sconv"``, ``"gconv"``, ``"head"``).
        num_params: P, elements of the pathway's weight tensors.
        precision: δ per tensor.
        trace_cov: tr Σ_q per tensor.
        gamma: effective number of parameters γ (summed over tensors).
        gamma_ratio: γ / P.
        share: relative share within the block (``nan`` for the head layers).
    """

    block: int
    kind: str
    num_params: int
    precision: list[float]
    trace_cov: list[float]
    gamma: float
    gamma_ratio: float
    share: float = float("nan")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _variance_sums(
    model: Any, guide: Any, sites: Sequence[str], x: Tensor | None, num_samples: int
) -> dict[str, float]:
    """tr Σ_q of each site (exact where the guide exposes the site's distribution)."""
    if isinstance(guide, AutoDelta):
        return {s: 0.0 for s in sites}
    out: dict[str, float] = {}
    get = getattr(guide, "get_distribution", None)
    missing = []
    for s in sites:
        try:
            d = get(s) if get is not None else None
        except (KeyError, AttributeError, NotImplementedError, RuntimeError):
            d = None
        if d is None:
            missing.append(s)
            continue
        out[s] = float(d.variance.detach().sum())
    if missing:
        if x is None:
            raise ValueError(f"guide {type(guide).__name__} exposes no per-site distributions: pass x to estimate tr Σ")
        draws: dict[str, list[Tensor]] = {s: [] for s in missing}
        with torch.no_grad(), poutine.block():
            for _ in range(num_samples):
                values = guide(x[:1])
                for s in missing:
                    draws[s].append(values[s].detach().reshape(-1))
        for s in missing:
            out[s] = float(torch.stack(draws[s]).var(dim=0).sum())
    return out


@pyro_scope()
def analyse_pathways(model: Any, guide: Any, x: Tensor | None = None, num_samples: int = 64) -> list[PathwayReport]:
    """One :class:`PathwayReport` per pathway of ``model`` (blocks, then the head layers).

    Args:
        model: a fitted ``LayerwiseNet`` (anything with ``pathways()`` and ``prior_precision()``).
        guide: its fitted guide.
        x: a few inputs ``(B, C, H, W)``; needed only for guides without per-site distributions
            (Monte-Carlo tr Σ_q) -- or to build a guide's parameters that were never called.
        num_samples: guide draws for the Monte-Carlo tr Σ_q.

    Raises:
        TypeError: ``model`` is not a layer-wise network.
    """
    if not (hasattr(model, "pathways") and hasattr(model, "prior_precision")):
        raise TypeError(f"{type(model).__name__} is not a layer-wise network (no pathways() / prior_precision())")
    pathways = model.pathways()
    sites = [s for p in pathways for s in p.sites]
    variances = _variance_sums(model, guide, sites, x, num_samples)
    shapes = model.site_shapes()
    reports: list[PathwayReport] = []
    for p in pathways:
        delta = model.prior_precision(p.block, p.kind, guide=guide).reshape(-1).tolist()
        traces = [variances[s] for s in p.sites]
        gamma = sum(math.prod(shapes[s]) - d * t for s, d, t in zip(p.sites, delta, traces))
        reports.append(PathwayReport(p.block, p.kind, p.num_params, delta, traces, gamma, gamma / p.num_params))
    for block, shares in block_shares(reports).items():
        for r in reports:
            if r.block == block and r.kind in shares:
                r.share = shares[r.kind]
    return reports


def block_shares(reports: Sequence[PathwayReport]) -> dict[int, dict[str, float]]:
    """``{block: {kind: share}}`` for blocks with pathways other than the head (γ/P clipped at 0)."""
    out: dict[int, dict[str, float]] = {}
    for r in reports:
        if r.kind == "head":
            continue
        out.setdefault(r.block, {})[r.kind] = max(r.gamma_ratio, 0.0)
    for block, ratios in out.items():
        total = sum(ratios.values())
        out[block] = {k: (v / total if total > 0 else float("nan")) for k, v in ratios.items()}
    return out


def pathway_table(reports: Sequence[PathwayReport]) -> str:
    """Markdown table: block, pathway, P, δ, γ, γ/P, share."""
    lines = ["| block | pathway | P | δ | γ | γ/P | share |", "|---:|:---|---:|---:|---:|---:|---:|"]
    for r in reports:
        delta = ", ".join(f"{d:.3g}" for d in r.precision)
        share = "" if math.isnan(r.share) else f"{100 * r.share:.0f}%"
        lines.append(
            f"| {r.block} | {KIND_LABELS.get(r.kind, r.kind)} | {r.num_params} | {delta} | {r.gamma:.1f} | "
            f"{r.gamma_ratio:.3f} | {share} |"
        )
    return "\n".join(lines)


def plot_pathways(reports: Sequence[PathwayReport], *, title: str = "", fig: Figure | None = None) -> Figure:
    """Two panels: relative share of each pathway per block (stacked bars: which layers became
    FC / CONV / GCONV) and log₁₀ δ per pathway tensor. Draws into ``fig`` (an empty figure;
    default: a new one) and returns it."""
    shares = block_shares(reports)
    blocks = sorted(shares)
    kinds = [k for k in KIND_LABELS if any(k in shares[b] for b in blocks)]
    fig = fig if fig is not None else plt.figure(figsize=(11, 3.8))
    ax1, ax2 = fig.subplots(1, 2)
    bottom = [0.0] * len(blocks)
    for kind in kinds:
        vals = [shares[b].get(kind, 0.0) if not math.isnan(shares[b].get(kind, 0.0)) else 0.0 for b in blocks]
        ax1.bar(blocks, vals, bottom=bottom, label=KIND_LABELS[kind], hatch="" if kind in EQUIVARIANT_KINDS else "//")
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax1.set_xlabel("block")
    ax1.set_ylabel("relative effective parameters")
    ax1.set_ylim(0, 1.05)
    ax1.set_xticks(blocks)
    ax1.legend(fontsize=8)
    ax1.set_title("pathway shares (γ/P normalised per block)")
    for kind in kinds + ["head"]:
        pts = [(r.block, math.log10(max(d, 1e-30))) for r in reports if r.kind == kind for d in r.precision]
        if pts:
            ax2.plot([p[0] for p in pts], [p[1] for p in pts], "o", label=KIND_LABELS[kind])
    ax2.set_xlabel("block")
    ax2.set_ylabel("log₁₀ prior precision δ")
    ax2.set_title("learned prior precisions")
    ax2.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
