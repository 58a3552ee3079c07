"""Which known conserved quantities did a model learn? Gradient spans on held-out states.

A learned conserved quantity ``C_k`` (``symmetry="neural"``:
:class:`~pyro_invariance.symmetry.ode_flow.NeuralConserved`) is a function, not a generator matrix,
so it is compared with the known quantities ``Q_j`` (Kepler: H, L and the Runge–Lenz A_x, A_y;
:func:`pyro_invariance.data.physics.kepler_conserved`) through
their gradients at states ``x_n``: the learned span ``S_n = span{∇C_k(x_n)}`` and the known
gradients ``∇Q_j(x_n)``. Reported, as medians over the states:

* ``known_angle[j]``: the angle between ``∇Q_j(x_n)`` and ``S_n`` (0°: the learned quantities can
  express Q_j's symmetry direction at x_n; 90°: orthogonal);
* ``learned_angle[k]``: the angle between ``∇C_k(x_n)`` and the span of the known gradients;
* ``match[k]``: the known quantity whose gradient is most parallel to ``∇C_k`` (largest absolute
  cosine), with that absolute cosine;
* ``conservation[k]``: ``|{C_k, H}| / (‖∇C_k‖ ‖∇H‖)`` = ``|∇C_kᵀ J ∇H|`` normalised — 0 when C_k
  is conserved by the true dynamics (Noether: then its flow is a symmetry of H).

Note (2-d Kepler): every conserved quantity's gradient is orthogonal to ``J∇H`` at each state, so
the known gradients span (at most) a 3-dimensional subspace of R⁴ — H, L and A are functionally
dependent (‖A‖² = 1 + 2HL²). A small ``known_angle`` for L and A therefore means the learned
quantities are conserved *and* independent enough to span that subspace.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from pyro_invariance._optional import pyplot as plt
from pyro_invariance.data.physics import symplectic

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["ConservedAnalysis", "gradients", "analyse_conserved", "plot_level_sets"]


def gradients(fn: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """``∇_x fn(x)_k`` for every output k: ``x (N, M)``, ``fn(x) (N, K)`` → ``(N, K, M)``."""
    with torch.enable_grad():
        xg = x.detach().requires_grad_(True)
        out = fn(xg)
        rows = [
            torch.autograd.grad(out[:, k].sum(), xg, retain_graph=k + 1 < out.shape[1])[0] for k in range(out.shape[1])
        ]
    return torch.stack(rows, dim=1).detach()


def _angle_to_span(v: Tensor, basis: Tensor, rtol: float = 1e-6) -> Tensor:
    """Angle (degrees) between each ``v (N, M)`` and the column span of ``basis (N, M, R)``."""
    u, s, _ = torch.linalg.svd(basis, full_matrices=False)
    keep = (s > rtol * s[:, :1]).unsqueeze(1)  # drop directions that are numerically absent
    u = u * keep
    proj = torch.einsum("nmr,nm->nr", u, v).norm(dim=-1)
    cos = (proj / v.norm(dim=-1).clamp_min(1e-30)).clamp(0.0, 1.0)
    return torch.rad2deg(torch.arccos(cos))


@dataclass
class ConservedAnalysis:
    """Medians over states of the angles above (degrees) and of the normalised Poisson bracket."""

    known_names: list[str]
    known_angle: dict[str, float]
    learned_angle: list[float]
    match: list[tuple[str, float]]
    conservation: list[float]
    num_states: int
    extra: dict[str, object] = field(default_factory=dict)

    def table(self) -> list[list[str]]:
        """Rows ``[quantity, median angle, note]`` for a report."""
        rows = [[f"∇{n} to the learned span", f"{a:.1f}°", ""] for n, a in self.known_angle.items()]
        for k, (a, (name, cos), c) in enumerate(zip(self.learned_angle, self.match, self.conservation)):
            rows.append(
                [
                    f"∇C{k} to the known span",
                    f"{a:.1f}°",
                    f"most parallel to ∇{name} (abs. cosine {cos:.2f}); |{{C{k}, H}}| normalised {c:.3f}",
                ]
            )
        return rows


def analyse_conserved(
    learned: Callable[[Tensor], Tensor],
    known: Callable[[Tensor], Mapping[str, Tensor]],
    states: Tensor,
    hamiltonian: str = "H",
) -> ConservedAnalysis:
    """The analysis of the module docstring on ``states (N, M)`` (float64 recommended).

    Args:
        learned: ``x (N, M)`` → ``(N, K)`` (e.g. ``model.conserved``, converted to the states' dtype).
        known: ``x (N, M)`` → ``{name: (N,)}`` (e.g. :func:`~pyro_invariance.data.physics.kepler_conserved`).
        hamiltonian: the name of the true H among ``known`` (for the conservation column).
    """
    if states.dim() != 2:
        raise ValueError(f"states must have shape (N, M), got {tuple(states.shape)}")
    names = list(known(states[:1]).keys())
    if hamiltonian not in names:
        raise ValueError(f"known quantities {names} do not include the Hamiltonian {hamiltonian!r}")
    g_learned = gradients(learned, states)  # (N, K, M)
    g_known = gradients(lambda x: torch.stack(list(known(x).values()), dim=-1), states)  # (N, Q, M)
    learned_basis = g_learned.transpose(1, 2)  # (N, M, K)
    known_basis = g_known.transpose(1, 2)
    known_angle = {n: float(_angle_to_span(g_known[:, j], learned_basis).median()) for j, n in enumerate(names)}
    learned_angle, match, conservation = [], [], []
    flow_h = symplectic(g_known[:, names.index(hamiltonian)])  # J∇H (N, M)
    for k in range(g_learned.shape[1]):
        gk = g_learned[:, k]
        learned_angle.append(float(_angle_to_span(gk, known_basis).median()))
        cos = (
            (
                torch.einsum("nm,nqm->nq", gk, g_known).abs()
                / (gk.norm(dim=-1, keepdim=True) * g_known.norm(dim=-1)).clamp_min(1e-30)
            )
            .median(0)
            .values
        )
        j = int(cos.argmax())
        match.append((names[j], float(cos[j])))
        bracket = (gk * flow_h).sum(-1).abs() / (gk.norm(dim=-1) * flow_h.norm(dim=-1)).clamp_min(1e-30)
        conservation.append(float(bracket.median()))
    return ConservedAnalysis(names, known_angle, learned_angle, match, conservation, int(states.shape[0]))


def plot_level_sets(
    learned: Callable[[Tensor], Tensor],
    known: Callable[[Tensor], Mapping[str, Tensor]],
    state: Tensor,
    *,
    plane: tuple[int, int] = (0, 1),
    extent: float = 1.5,
    points: int = 81,
    fig: Figure | None = None,
) -> Figure:
    """Level sets of each learned and known quantity on a 2-d slice of phase space through ``state``
    (coordinates ``plane`` varied over ±``extent`` around it, the others held), one panel each,
    learned first. Draws into ``fig`` (an empty figure; default: a new one) and returns it."""
    i, j = plane
    grid = torch.linspace(-extent, extent, points, dtype=state.dtype)
    gi, gj = torch.meshgrid(grid + state[i], grid + state[j], indexing="ij")
    xs = state.expand(points * points, -1).clone()
    xs[:, i], xs[:, j] = gi.reshape(-1), gj.reshape(-1)
    with torch.no_grad():
        lv = learned(xs).reshape(points, points, -1)
        kv = {n: v.reshape(points, points) for n, v in known(xs).items()}
    panels = [(f"learned C{k}", lv[..., k]) for k in range(lv.shape[-1])] + [(n, v) for n, v in kv.items()]
    cols = min(4, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig = fig if fig is not None else plt.figure(figsize=(3 * cols, 3 * rows))
    axes = list(fig.subplots(rows, cols, squeeze=False).ravel())
    for extra in axes[len(panels) :]:
        extra.set_visible(False)
    for a, (title, values) in zip(axes, panels):
        v = values.detach().numpy()
        finite = v[np.isfinite(v)]
        levels = sorted(set(np.quantile(finite, np.linspace(0.05, 0.95, 12)).tolist())) if finite.size else []
        a.contour(gi.numpy(), gj.numpy(), v, levels=levels if len(levels) > 1 else 10, linewidths=0.8)
        a.plot([float(state[i])], [float(state[j])], "k.", ms=4)
        a.set_title(title, fontsize=9)
        a.set_xlabel(f"x[{i}]")
        a.set_ylabel(f"x[{j}]")
    fig.tight_layout()
    return fig
