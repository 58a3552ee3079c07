"""Quadratic conserved quantities, their flows, oracle symmetry groups and symmetry analysis.

Talk 000 ("Noether's theorem parameterisation"; docs/methods.md §4). A quadratic observable on phase
space ``x = (q, p) ∈ R^M``::

    C(x) = xᵀ A x / 2 + bᵀ x            (A symmetric M×M, b ∈ R^M)            (talk: C_η)

generates the Hamiltonian flow ``ẋ = J ∇C(x) = J A x + J b``, solved in closed form with the
augmented generator::

    G = [[J A, J b], [0ᵀ, 0]]  ((M+1)×(M+1)),     [Φ_C^τ(x); 1] = expm(τ G) [x; 1].

By Noether's theorem C is conserved by H iff H ∘ Φ_C^τ = H for all τ. Learned quantities are
parameterised by ``W`` (M×M) and ``b`` with ``A = W + Wᵀ`` (docs/methods.md §4).

Oracle generator sets (:func:`oracle_generators`): ``so2`` (SHO, ``A = 2I``), ``un`` (n
isotropic oscillators, the n² quadratics ``q_i p_j − q_j p_i``, ``q_i q_j + p_i p_j``,
``q_i² + p_i²``), ``se2`` (2-d n bodies: total momentum ``P_x``, ``P_y`` and angular momentum).

Analysis (:func:`analyse_generators`): SVD of the stacked, flattened generators ``(K, (M+1)²)``,
the number of significant singular values (n² for n oscillators, 3 for the 2-d 3-body system)
and the principal angles between the leading right-singular vectors and the oracle span.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

ORACLES = ("so2", "un", "se2")


def canonical_j(m: int, dtype: torch.dtype = torch.float32, device: torch.device | str | None = None) -> Tensor:
    """``J = [[0, I], [−I, 0]]`` of size ``m × m`` (m even)."""
    if m < 2 or m % 2:
        raise ValueError(f"phase-space dimension must be even and >= 2, got {m}")
    d = m // 2
    j = torch.zeros(m, m, dtype=dtype, device=device)
    j[:d, d:] = torch.eye(d, dtype=dtype, device=device)
    j[d:, :d] = -torch.eye(d, dtype=dtype, device=device)
    return j


def j_times(grad: Tensor) -> Tensor:
    """``J g`` for ``g = (g_q, g_p)`` without forming J: ``(g_p, −g_q)`` (last dim ``M`` even). The
    symmetry package's own copy of :func:`pyro_invariance.data.physics.symplectic` (``data`` and
    ``symmetry`` import nothing of each other, ARCHITECTURE.md)."""
    d = grad.shape[-1] // 2
    return torch.cat([grad[..., d:], -grad[..., :d]], dim=-1)


def quadratic_value(x: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """``C(x) = xᵀAx/2 + bᵀx``: ``x (..., M)``, ``a (M, M)``, ``b (M,)`` → ``(...)``."""
    _check_ab(a, b)
    if x.shape[-1] != a.shape[-1]:
        raise ValueError(f"x must have last dimension {a.shape[-1]}, got {tuple(x.shape)}")
    return 0.5 * torch.einsum("...i,ij,...j->...", x, a, x) + x @ b


def generator(a: Tensor, b: Tensor) -> Tensor:
    """Augmented generator ``G = [[J A, J b], [0, 0]]``: ``a (..., M, M)``, ``b (..., M)`` → ``(..., M+1, M+1)``."""
    _check_ab(a, b)
    m = a.shape[-1]
    j = canonical_j(m, a.dtype, a.device)
    top = torch.cat([j @ a, (j @ b.unsqueeze(-1))], dim=-1)  # (..., M, M+1)
    bottom = torch.zeros(*top.shape[:-2], 1, m + 1, dtype=a.dtype, device=a.device)
    return torch.cat([top, bottom], dim=-2)


def generator_from_params(w: Tensor, b: Tensor) -> Tensor:
    """Generators from unconstrained parameters ``A = W + Wᵀ``: ``w (K, M, M)``, ``b (K, M)`` → ``(K, M+1, M+1)``."""
    return generator(w + w.transpose(-1, -2), b)


def quadratic_from_generator(g: Tensor) -> tuple[Tensor, Tensor]:
    """Inverse of :func:`generator`: ``(A, b)`` from ``G (..., M+1, M+1)`` (uses ``J⁻¹ = −J``)."""
    m = g.shape[-1] - 1
    j = canonical_j(m, g.dtype, g.device)
    return -j @ g[..., :m, :m], -(j @ g[..., :m, m:]).squeeze(-1)


def flow_matrices(generators: Tensor, weights: Tensor, scale: float = torch.pi) -> Tensor:
    """``T_s = expm(scale · Σ_k w_sk G_k)``: ``generators (K, D, D)``, ``weights (S, K)`` → ``(S, D, D)``.

    One matrix exponential per sample of a random combination (docs/methods.md §4).
    """
    if generators.dim() != 3 or generators.shape[-1] != generators.shape[-2]:
        raise ValueError(f"generators must have shape (K, D, D), got {tuple(generators.shape)}")
    if weights.dim() != 2 or weights.shape[1] != generators.shape[0]:
        raise ValueError(f"weights must have shape (S, {generators.shape[0]}), got {tuple(weights.shape)}")
    return torch.linalg.matrix_exp(scale * torch.einsum("sk,kij->sij", weights, generators))


def apply_flow(x: Tensor, t: Tensor) -> Tensor:
    """``Φ(x) = [T [x; 1]]_{1:M}``: ``x (..., M)``, ``t (D, D)`` or ``(S, D, D)`` → ``(..., M)`` or ``(S, ..., M)``."""
    m = x.shape[-1]
    if t.shape[-1] != m + 1:
        raise ValueError(f"flow matrices must be ({m + 1}, {m + 1}) for states of dimension {m}, got {tuple(t.shape)}")
    lin, shift = t[..., :m, :m], t[..., :m, m]
    if t.dim() == 2:
        return x @ lin.T + shift
    flat = x.reshape(-1, m)
    out = torch.einsum("sij,nj->sni", lin, flat) + shift.unsqueeze(1)
    return out.reshape(t.shape[0], *x.shape[:-1], m)


def flow(x: Tensor, g: Tensor, tau: float | Tensor) -> Tensor:
    """``Φ_C^τ(x)`` for one generator ``g (M+1, M+1)``: ``expm(τG)[x;1]``; ``x (..., M)``."""
    return apply_flow(x, torch.linalg.matrix_exp(torch.as_tensor(tau, dtype=g.dtype) * g))


def sample_weights(
    num: int,
    k: int,
    kind: str = "cube",
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """Combination weights ``w_s`` ``(num, k)``: ``"cube"`` U[−1,1]^K, ``"ball"`` uniform in the unit
    ball, or ``"grid"`` (K = 1 only: ``num`` evenly spaced points of [−1, 1), exact quadrature of a
    full orbit for a generator whose flow has period dividing 2π)."""
    if kind == "cube":
        return 2 * torch.rand(num, k, generator=generator, dtype=dtype, device=device) - 1
    if kind == "ball":
        d = torch.randn(num, k, generator=generator, dtype=dtype, device=device)
        d = d / d.norm(dim=1, keepdim=True).clamp_min(1e-12)
        r = torch.rand(num, 1, generator=generator, dtype=dtype, device=device) ** (1.0 / k)
        return d * r
    if kind == "grid":
        if k != 1:
            raise ValueError(f"grid sampling needs exactly one generator, got {k}")
        return (-1 + 2 * torch.arange(num, dtype=dtype, device=device) / num).unsqueeze(1)
    raise ValueError(f"unknown sampling {kind!r}; use 'cube', 'ball' or 'grid'")


# ---------------------------------------------------------------------------------------------
# Oracles
# ---------------------------------------------------------------------------------------------
def oracle_quadratics(name: str, state_dim: int, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """``(A (K, M, M), b (K, M))`` of the oracle conserved quantities ``name`` for dimension ``M``.

    ``so2``: M = 2, ``C = q² + p²`` (A = 2I). ``un``: M = 2n, the n² quadratics (order: for i<j
    ``q_i p_j − q_j p_i`` then ``q_i q_j + p_i p_j``, then ``q_i² + p_i²``). ``se2``: M = 4n with
    ``q = (q_1x, q_1y, ...)``: ``P_x = Σ p_ix``, ``P_y = Σ p_iy``, ``L = Σ q_ix p_iy − q_iy p_ix``.
    """
    if name not in ORACLES:
        raise ValueError(f"unknown oracle symmetry {name!r}; use one of {ORACLES}")
    m = int(state_dim)
    if m < 2 or m % 2:
        raise ValueError(f"state dimension must be even and >= 2, got {state_dim}")
    d = m // 2
    mats: list[Tensor] = []
    vecs: list[Tensor] = []

    def quad(entries: list[tuple[int, int, float]]) -> None:
        a = torch.zeros(m, m, dtype=dtype)
        for i, j, v in entries:  # C = Σ v x_i x_j  → A = Hessian
            a[i, j] += v
            a[j, i] += v
        mats.append(a)
        vecs.append(torch.zeros(m, dtype=dtype))

    if name == "so2":
        if m != 2:
            raise ValueError(f"so2 is the SHO's symmetry and needs state dimension 2, got {m}")
        quad([(0, 0, 1.0), (1, 1, 1.0)])
    elif name == "un":
        for i in range(d):
            for j in range(i + 1, d):
                quad([(i, d + j, 1.0), (j, d + i, -1.0)])
                quad([(i, j, 1.0), (d + i, d + j, 1.0)])
        for i in range(d):
            quad([(i, i, 1.0), (d + i, d + i, 1.0)])
    else:
        if m % 4:
            raise ValueError(f"se2 needs 2-d bodies (state dimension 4n), got {m}")
        n = m // 4
        for axis in (0, 1):
            b = torch.zeros(m, dtype=dtype)
            b[d + axis :: 2] = 1.0
            mats.append(torch.zeros(m, m, dtype=dtype))
            vecs.append(b)
        quad([e for i in range(n) for e in ((2 * i, d + 2 * i + 1, 1.0), (2 * i + 1, d + 2 * i, -1.0))])
    return torch.stack(mats), torch.stack(vecs)


def oracle_generators(name: str, state_dim: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Oracle generators ``(K, M+1, M+1)`` (see :func:`oracle_quadratics`)."""
    a, b = oracle_quadratics(name, state_dim, dtype)
    return generator(a, b)


# ---------------------------------------------------------------------------------------------
# Analysis
# ---------------------------------------------------------------------------------------------
@dataclass
class SymmetryAnalysis:
    """Result of :func:`analyse_generators`.

    Attributes:
        singular_values: ``(min(K, D²),)`` descending.
        num_significant: count of singular values above ``rel_threshold · max``.
        vectors: right-singular vectors ``(r, D²)`` (rows), leading first.
        parallelness: ``|cos|`` between each singular vector and the oracle span ``(r,)`` (1 = inside it).
        principal_cosines: cosines of the principal angles between the span of the
            ``num_significant`` leading vectors and the oracle span (descending).
    """

    singular_values: Tensor
    num_significant: int
    vectors: Tensor
    parallelness: Tensor | None = None
    principal_cosines: Tensor | None = None

    def principal_angles_deg(self) -> Tensor | None:
        if self.principal_cosines is None:
            return None
        return torch.rad2deg(torch.arccos(self.principal_cosines.clamp(-1, 1)))


def num_significant(singular_values: Tensor, rel_threshold: float = 0.1) -> int:
    """Number of singular values larger than ``rel_threshold`` times the largest."""
    if singular_values.numel() == 0 or float(singular_values.max()) == 0:
        return 0
    return int((singular_values > rel_threshold * singular_values.max()).sum())


def _orthonormal_rows(v: Tensor) -> Tensor:
    q, r = torch.linalg.qr(v.T)
    keep = r.diagonal().abs() > 1e-10 * r.diagonal().abs().max().clamp_min(1e-30)
    return q[:, keep].T


def principal_cosines(u: Tensor, v: Tensor) -> Tensor:
    """Cosines of the principal angles between the row spans of ``u (p, D)`` and ``v (r, D)``."""
    qu, qv = _orthonormal_rows(u), _orthonormal_rows(v)
    return torch.linalg.svdvals(qu @ qv.T).clamp(max=1.0)


def analyse_generators(
    generators: Tensor, oracle: Tensor | None = None, rel_threshold: float = 0.1
) -> SymmetryAnalysis:
    """SVD of the stacked generators and their relation to an oracle set.

    Args:
        generators: ``(K, D, D)`` learned generators (or ``(K, D·D)`` already flat).
        oracle: optional ``(K', D, D)`` oracle generators.
        rel_threshold: significance threshold relative to the largest singular value.
    """
    flat = generators.detach().reshape(generators.shape[0], -1).double()
    _, s, vh = torch.linalg.svd(flat, full_matrices=False)
    r = num_significant(s, rel_threshold)
    out = SymmetryAnalysis(s, r, vh)
    if oracle is not None:
        o = oracle.detach().reshape(oracle.shape[0], -1).double()
        if o.shape[1] != flat.shape[1]:
            raise ValueError(f"oracle generators have size {o.shape[1]}, learned ones {flat.shape[1]}")
        qo = _orthonormal_rows(o)
        out.parallelness = (vh @ qo.T).norm(dim=1).clamp(max=1.0)
        out.principal_cosines = principal_cosines(vh[: max(r, 1)], o)
    return out


def _check_ab(a: Tensor, b: Tensor) -> None:
    if a.dim() < 2 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"A must be square (..., M, M), got {tuple(a.shape)}")
    if b.shape[-1] != a.shape[-1] or b.shape[:-1] != a.shape[:-2]:
        raise ValueError(f"b must have shape {tuple(a.shape[:-1])}, got {tuple(b.shape)}")
