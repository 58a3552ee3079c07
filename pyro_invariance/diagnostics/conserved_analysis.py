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
dependent (‖A‖² = 1 + 2HL²). The angles above keep every direction of the learned span down to
1e-6 of the largest singular value, and three generic gradients span a 3-d subspace of R⁴ that is
close to almost any direction: untrained quantities already score small angles. They cannot tell
what was learned.

:func:`analyse_discovery` is the measure that can fail. Per state ``x_n``, with the learned
gradients stacked as ``G_n = [∇C_1 … ∇C_K] (M, K)``, the flow direction ``f̂_n = J∇H / ‖J∇H‖``:

* (a) **conservation**, ``flow_share_n = ‖G_nᵀ f̂_n‖ / ‖G_n‖_F`` ∈ [0, 1]: the learned gradients'
  component along the Hamiltonian flow relative to their size (0: every C_k is conserved,
  ``{C_k, H} = ∇C_k · J∇H = 0``; about 1/√M for gradients in random directions);
* the **significant span** ``U_n (M, r_n)``: the left singular vectors of ``G_n`` whose singular
  value is at least :data:`SIGNIFICANT_RTOL` (0.1) times the largest — three copies of ∇L plus
  small noise count as one direction, not three;
* (b) **what is new**, ``new_share_n = ‖N_nᵀ U_n‖_F² / min(r_n, d_n)`` ∈ [0, 1]: the mean squared
  cosine of the principal angles between the significant span and the new directions ``N_n (M, d_n)``
  (orthonormal): the gradients of the ``new`` quantities with their components along the
  ``baseline`` gradients removed (Kepler: ∇A_x, ∇A_y beyond ∇H, ∇L — one direction, the Runge–Lenz
  / periapsis direction), or, with ``new=None``, everything orthogonal to the flow and the baseline
  gradients. For ``d_n = 1`` it is the squared cosine of the angle between that direction and the
  significant span (1: contained; 0: orthogonal);
* ``known_share[j]_n = ‖U_nᵀ ∇Q_j‖² / ‖∇Q_j‖²``: the same squared cosine for each baseline
  quantity (which known directions the span holds);
* ``rank_n = r_n`` and the singular values of ``G_n`` relative to the largest.

(c) The baseline is the same analysis of the untrained quantities (the caller's start). Exact
reference subspaces (baseline, new) keep directions down to :data:`REFERENCE_RTOL` of their largest
singular value: they are exact gradients, so only rounding is dropped. A learned span that is
conserved (small flow share) and holds a direction beyond ∇H and ∇L has ``new_share`` near 1;
three conserved copies of angular momentum have ``new_share`` near 0 whatever their number.
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

__all__ = [
    "SIGNIFICANT_RTOL",
    "REFERENCE_RTOL",
    "ConservedAnalysis",
    "DiscoveryAnalysis",
    "gradients",
    "analyse_conserved",
    "discovery_measures",
    "analyse_discovery",
    "plot_level_sets",
]

SIGNIFICANT_RTOL = 0.1
"""A learned direction counts when its singular value is at least this share of the largest."""

REFERENCE_RTOL = 1e-6
"""Numerical rank of exact reference gradients (baseline, new): only rounding is dropped."""


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


def _orthonormal(vectors: Tensor, rtol: float) -> Tensor:
    """An orthonormal basis ``(N, M, R)`` of the span of ``vectors (N, M, R)``, per state; directions
    below ``rtol`` × the largest singular value are zeroed (columns of zeros, so ranks may differ)."""
    u, s, _ = torch.linalg.svd(vectors, full_matrices=False)
    return u * (s >= rtol * s[:, :1].clamp_min(1e-300)).unsqueeze(1)


def _complement(basis: Tensor) -> Tensor:
    """An orthonormal basis ``(N, M, M)`` (zero columns padded) of what ``basis (N, M, R)`` misses."""
    eye = torch.eye(basis.shape[1], dtype=basis.dtype).expand(basis.shape[0], -1, -1)
    rest = eye - basis @ basis.transpose(1, 2)  # projector onto the orthogonal complement
    return _orthonormal(rest, 0.5)  # a projector's singular values are 0 or 1


def _beyond(known: Tensor, g: Tensor) -> Tensor:
    """An orthonormal basis ``(N, M, D)`` of what ``g (N, M, D)`` holds beyond the orthonormal
    ``known (N, M, B)``; a remainder at rounding level of ``g``'s size counts as nothing."""
    rest = g - known @ (known.transpose(1, 2) @ g)
    basis = _orthonormal(rest, REFERENCE_RTOL)
    real = rest.flatten(1).norm(dim=-1) > REFERENCE_RTOL * g.flatten(1).norm(dim=-1)
    return basis * real.to(basis.dtype)[:, None, None]


def discovery_measures(
    g_learned: Tensor,
    flow: Tensor,
    g_known: Tensor,
    g_new: Tensor | None = None,
    rtol: float = SIGNIFICANT_RTOL,
) -> dict[str, Tensor]:
    """The per-state measures of :func:`analyse_discovery` (module docstring) from gradients.

    Args:
        g_learned: learned gradients ``(N, K, M)``.
        flow: the Hamiltonian vector field ``J∇H`` at the states ``(N, M)``.
        g_known: gradients of the known (baseline) quantities ``(N, B, M)``, e.g. ∇H, ∇L.
        g_new: gradients of the quantities whose directions beyond the baseline are "new"
            ``(N, D, M)``, e.g. ∇A_x, ∇A_y; ``None``: every direction orthogonal to the flow and the
            baseline gradients.
        rtol: significance threshold of the learned singular values, relative to the largest.

    Returns:
        ``flow_share (N,)``, ``new_share (N,)``, ``rank (N,)``, ``known_share (N, B)`` and
        ``relative_singular_values (N, min(K, M))``.
    """
    f_hat = flow / flow.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    along = torch.einsum("nkm,nm->nk", g_learned, f_hat).norm(dim=-1)
    flow_share = along / g_learned.flatten(1).norm(dim=-1).clamp_min(1e-300)
    u, s, _ = torch.linalg.svd(g_learned.transpose(1, 2), full_matrices=False)  # u (N, M, min(K, M))
    rel = s / s[:, :1].clamp_min(1e-300)
    keep = rel >= rtol
    span = u * keep.unsqueeze(1)
    rank = keep.sum(-1)
    known = _orthonormal(g_known.transpose(1, 2), REFERENCE_RTOL)
    if g_new is None:
        new = _complement(torch.cat([known, f_hat.unsqueeze(-1)], dim=-1))
    else:
        new = _beyond(known, g_new.transpose(1, 2))
    d = (new.norm(dim=1) > 0.5).sum(-1)
    overlap = (new.transpose(1, 2) @ span).square().sum((1, 2))
    new_share = overlap / torch.minimum(rank, d).clamp_min(1).to(overlap.dtype)
    g_hat = g_known / g_known.norm(dim=-1, keepdim=True).clamp_min(1e-300)
    known_share = (g_hat @ span).square().sum(-1)  # (N, B)
    return {
        "flow_share": flow_share,
        "new_share": new_share,
        "rank": rank,
        "known_share": known_share,
        "relative_singular_values": rel,
    }


@dataclass
class DiscoveryAnalysis:
    """Medians over states of :func:`discovery_measures` (module docstring: (a) ``flow_share``,
    (b) ``new_share``), with the settings they were read with."""

    flow_share: float
    new_share: float
    rank: float
    known_share: dict[str, float]
    relative_singular_values: list[float]
    baseline: tuple[str, ...]
    new: tuple[str, ...] | None
    rtol: float
    num_states: int

    def summary(self) -> str:
        """One line: ``flow 0.04, new 0.07, rank 2, H 0.98, L 1.00``."""
        known = ", ".join(f"{n} {v:.2f}" for n, v in self.known_share.items())
        return f"flow {self.flow_share:.2f}, new {self.new_share:.2f}, rank {self.rank:g}, {known}"


def analyse_discovery(
    learned: Callable[[Tensor], Tensor],
    known: Callable[[Tensor], Mapping[str, Tensor]],
    states: Tensor,
    *,
    hamiltonian: str = "H",
    baseline: tuple[str, ...] = ("H", "L"),
    new: tuple[str, ...] | None = ("A_x", "A_y"),
    rtol: float = SIGNIFICANT_RTOL,
) -> DiscoveryAnalysis:
    """(a) conservation and (b) what is new (module docstring) on ``states (N, M)``, as medians.

    Args:
        learned: ``x (N, M)`` → ``(N, K)`` (e.g. ``model.conserved`` in the states' dtype).
        known: ``x (N, M)`` → ``{name: (N,)}``, holding ``hamiltonian``, ``baseline`` and ``new``
            (defaults: Kepler's :func:`~pyro_invariance.data.physics.kepler_conserved`).
        baseline: the quantities already known (their directions are not new).
        new: the quantities whose directions beyond ``baseline`` count as new; ``None``: every
            direction orthogonal to the flow and the baseline.
        rtol: significance threshold of the learned singular values (:data:`SIGNIFICANT_RTOL`).
    """
    if states.dim() != 2:
        raise ValueError(f"states must have shape (N, M), got {tuple(states.shape)}")
    names = list(known(states[:1]).keys())
    missing = [n for n in (hamiltonian, *baseline, *(new or ())) if n not in names]
    if missing:
        raise ValueError(f"known quantities {names} do not include {missing}")
    g_learned = gradients(learned, states)  # (N, K, M)
    g_all = gradients(lambda x: torch.stack(list(known(x).values()), dim=-1), states)  # (N, Q, M)
    pick = lambda which: g_all[:, [names.index(n) for n in which]]  # noqa: E731
    flow = symplectic(g_all[:, names.index(hamiltonian)])
    m = discovery_measures(g_learned, flow, pick(baseline), pick(new) if new else None, rtol)
    median = lambda t: float(t.to(states.dtype).median())  # noqa: E731
    return DiscoveryAnalysis(
        flow_share=median(m["flow_share"]),
        new_share=median(m["new_share"]),
        rank=median(m["rank"]),
        known_share={n: median(m["known_share"][:, j]) for j, n in enumerate(baseline)},
        relative_singular_values=[float(v) for v in m["relative_singular_values"].median(0).values],
        baseline=tuple(baseline),
        new=tuple(new) if new else None,
        rtol=rtol,
        num_states=int(states.shape[0]),
    )


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
