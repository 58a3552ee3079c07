"""Kronecker-factored (KFAC) Gauss–Newton curvature and the KFAC-Laplace log marginal likelihood.

The factors of every layer type of the layer-wise networks (paper 004, Sec. 5): FC (Martens & Grosse
2015), CONV (KFC), F-FC, S-FC, S-CONV and p4 GCONV, as pure functions of a layer's inputs and output
gradients. :mod:`pyro_invariance.infer.kfac_layers` applies them to a whole network and
:func:`pyro_invariance.infer.laplace.fit_laplace` (``curvature="kfac"``) learns δ with them.

For a layer ``y = W a`` (bias folded in by appending 1 to ``a``) inside a network with outputs
``f`` (logits) and a categorical likelihood, the generalised Gauss–Newton block of ``vec(W)``
(row-major: ``W.flatten()``) over data points n is::

    GGN_W = Σ_n (J_n)ᵀ Λ_n J_n = Σ_n Σ_c (g_nc g_ncᵀ) ⊗ (a_n a_nᵀ),

with ``Λ_n = diag(p_n) − p_n p_nᵀ = L_n L_nᵀ`` the Hessian of the negative log-likelihood in the
logits, ``L_n = diag(√p_n) − p_n √p_nᵀ`` (:func:`categorical_hessian_sqrt`), and
``g_nc = (∂f/∂y)ᵀ L_n[:, c]`` the c-th column backpropagated to the layer's output. KFAC replaces
the sum of Kronecker products by the product of sums (exact for one data point)::

    GGN_W ≈ N · G ⊗ A,    G = (1/N) Σ_nc g_nc g_ncᵀ,   A = (1/N) Σ_n a_n a_nᵀ.

The Laplace log marginal likelihood with per-layer prior precisions δ_l (paper 004, Eq. 9; the
(2π) terms of the prior and of the Gaussian integral cancel)::

    log p(D | δ) ≈ log p(D | θ*) + Σ_l [ (P_l/2) log δ_l − (δ_l/2) ‖θ*_l‖² − ½ log det(N G_l ⊗ A_l + δ_l I) ],

with ``log det(N G ⊗ A + δ I) = Σ_ij log(N λ_i^G λ_j^A + δ)`` from the eigenvalues of the two factors
(:func:`kfac_log_det`) — the way laplace-torch adds the prior in the Kronecker eigenbasis.

Convolutions (KFC, Grosse & Martens 2016, Eq. 18–19; :func:`conv2d_factors`): with the unfolded
input patches ``a_nt`` (bias 1 appended) and output gradients ``g_nct`` at locations t = 1..T::

    A = (1/(N T)) Σ_nt a_nt a_ntᵀ,     G = (1/N) Σ_nct g_nct g_nctᵀ,     GGN_W ≈ N · G ⊗ A,

exact when the output gradients at different locations are uncorrelated and the patches are
spatially homogeneous (the paper's assumptions); not exact even for one input.

The layer-wise networks' other pathways (paper 004 Sec. 5.1–5.2; one :class:`KroneckerFactors` per
weight sample site, in the site's stored parameterisation, ``N·G ⊗ A`` ≈ GGN of ``site.flatten()``):
:func:`ffc_factors` (F-FC: each of the two steps is a linear layer shared over a channel index,
KFAC-expand over that index), :func:`sfc_factors` (S-FC: F-FC's factors projected through the RBF
bases), :func:`sconv_factors` (S-CONV: KFC with the input factor projected through the basis) and
:func:`gconv_factors` (p4 GCONV: KFC over the group elements, rotations × locations).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "KroneckerFactors",
    "categorical_hessian_sqrt",
    "conv2d_factors",
    "dense_factors",
    "mlp_kfac",
    "kfac_log_det",
    "kfac_log_marginal_likelihood",
    "ffc_factors",
    "sfc_factors",
    "sconv_factors",
    "gconv_factors",
]


@dataclass
class KroneckerFactors:
    """One layer's factors: ``G (out, out)``, ``A (in + bias, in + bias)``, averaged over ``num_data`` points."""

    G: Tensor
    A: Tensor
    num_data: int

    def block(self) -> Tensor:
        """The dense approximation ``N · G ⊗ A`` of the GGN block of ``[W, b].flatten()`` (small layers only)."""
        return self.num_data * torch.kron(self.G, self.A)

    @property
    def num_params(self) -> int:
        return self.G.shape[0] * self.A.shape[0]


def categorical_hessian_sqrt(logits: Tensor) -> Tensor:
    """``L (N, C, C)`` with ``L Lᵀ = diag(p) − p pᵀ``, ``p = softmax(logits)``: ``L = diag(√p) − p √pᵀ``."""
    p = torch.softmax(logits, dim=-1)
    sp = p.sqrt()
    return torch.diag_embed(sp) - p.unsqueeze(-1) * sp.unsqueeze(-2)


def dense_factors(a: Tensor, grads: Tensor) -> KroneckerFactors:
    """FC factors from ``a (N, in)`` (bias column included) and the backpropagated columns
    ``grads (N, K, out)``: ``G = Σ_nk g gᵀ / N``, ``A = Σ_n a aᵀ / N``."""
    n = a.shape[0]
    return KroneckerFactors(torch.einsum("nko,nkp->op", grads, grads) / n, a.T @ a / n, n)


def conv2d_factors(
    inputs: Tensor,
    output_grads: Tensor,
    kernel_size: int,
    *,
    stride: int = 1,
    padding: int = 0,
    padding_mode: str = "zeros",
    bias: bool = True,
) -> KroneckerFactors:
    """KFC factors of a 2-d convolution (module docstring).

    Args:
        inputs: the layer's inputs ``(N, C_in, H, W)``.
        output_grads: backpropagated Hessian square-root columns at the layer's output
            ``(N, C, C_out, H_out, W_out)`` (C columns; see :func:`mlp_kfac` for the construction).
        padding_mode: ``"zeros"`` or ``"circular"`` (the layer-wise networks' padding: the input is
            wrapped before unfolding).
    """
    if padding_mode == "circular" and padding:
        inputs = F.pad(inputs, (padding,) * 4, mode="circular")
        padding = 0
    elif padding_mode not in ("zeros", "circular"):
        raise ValueError(f"padding_mode must be 'zeros' or 'circular', got {padding_mode!r}")
    patches = F.unfold(inputs, kernel_size, padding=padding, stride=stride)  # (N, C_in·k², T)
    if bias:
        patches = torch.cat([patches, patches.new_ones(patches.shape[0], 1, patches.shape[-1])], dim=1)
    n, _, t = patches.shape
    g = output_grads.flatten(-2)  # (N, C, C_out, T)
    if g.shape[-1] != t:
        raise ValueError(f"output_grads have {g.shape[-1]} locations, the unfolded inputs {t}")
    a_factor = torch.einsum("nit,njt->ij", patches, patches) / (n * t)
    g_factor = torch.einsum("ncot,ncpt->op", g, g) / n
    return KroneckerFactors(g_factor, a_factor, n)


def mlp_kfac(layers: Sequence[nn.Linear], activation: Callable[[Tensor], Tensor], x: Tensor) -> list[KroneckerFactors]:
    """KFAC factors of every layer of the MLP ``f = layers[-1] ∘ act ∘ … ∘ act ∘ layers[0]`` on
    inputs ``x (N, in)`` for a categorical likelihood (the exact GGN expectation over labels, no
    sampling): activations recorded in a forward pass, the C columns of ``L_n`` backpropagated to
    every layer's output by one vector–Jacobian product each."""
    acts, outs = [], []
    h = x
    for i, layer in enumerate(layers):
        a = h.detach()
        if layer.bias is not None:
            a = torch.cat([a, a.new_ones(a.shape[0], 1)], dim=-1)
        acts.append(a)
        y = layer(h)
        outs.append(y)
        h = activation(y) if i + 1 < len(layers) else y
    logits = h
    sqrt_h = categorical_hessian_sqrt(logits.detach())  # (N, C, C): column c is L[:, :, c]
    n, c = logits.shape
    grads = [torch.zeros(n, c, y.shape[-1], dtype=y.dtype, device=y.device) for y in outs]
    for col in range(c):
        vjp = torch.autograd.grad(logits, outs, grad_outputs=sqrt_h[:, :, col], retain_graph=True)
        for g, v in zip(grads, vjp):
            g[:, col] = v
    return [dense_factors(a, g) for g, a in zip(grads, acts)]


def kfac_log_det(factors: KroneckerFactors, prior_precision: Tensor | float) -> Tensor:
    """``log det(N G ⊗ A + δ I)`` from the eigenvalues of G and A (differentiable in δ)."""
    eg = torch.linalg.eigvalsh(factors.G).clamp_min(0.0)
    ea = torch.linalg.eigvalsh(factors.A).clamp_min(0.0)
    delta = torch.as_tensor(prior_precision, dtype=eg.dtype, device=eg.device)
    return torch.log(factors.num_data * torch.outer(eg, ea) + delta).sum()


def kfac_log_marginal_likelihood(
    log_likelihood: Tensor, params: Sequence[Tensor], factors: Sequence[KroneckerFactors], prior_precisions: Tensor
) -> Tensor:
    """Paper 004 Eq. 9 with the KFAC GGN (module docstring).

    Args:
        log_likelihood: ``log p(D | θ*)`` (a scalar, summed over the data).
        params: per layer the MAP parameters ``[W, b]`` flattened (any shape; only ‖θ_l‖² and P_l are used).
        factors: per layer :class:`KroneckerFactors` at θ*.
        prior_precisions: ``δ (L,)``, one per layer (differentiable: learn ``log δ`` by its gradient).
    """
    if len(params) != len(factors) or prior_precisions.shape != (len(factors),):
        raise ValueError(
            f"need one parameter tensor and one prior precision per layer: {len(params)} params, "
            f"{len(factors)} factors, prior_precisions {tuple(prior_precisions.shape)}"
        )
    total = log_likelihood
    for theta, fac, delta in zip(params, factors, prior_precisions):
        if theta.numel() != fac.num_params:
            raise ValueError(f"a layer has {theta.numel()} parameters but its factors describe {fac.num_params}")
        total = total + 0.5 * theta.numel() * torch.log(delta) - 0.5 * delta * theta.detach().pow(2).sum()
        total = total - 0.5 * kfac_log_det(fac, delta)
    return total


# ------------------------------------------------------------------------------------------------
# KFAC of the layer-wise relaxed-equivariance pathways (paper 004, Sec. 5.1–5.2 and App. A)
#
# Every function takes a pathway's input ``x (N, C, G, H, W)`` and the K backpropagated columns
# of the categorical Hessian square root at the pathway's output, ``output_grads (N, K, …)`` (K =
# number of classes; the construction of :func:`mlp_kfac`), and returns one :class:`KroneckerFactors`
# per weight *sample site*, in the site's own parameterisation: the site tensor θ as stored (He gain,
# RBF projection and the block's 1/√K ``scale`` are folded into the factors), so that
# ``N·kron(fac.G, fac.A)`` approximates the GGN block of ``site.flatten()`` (row-major). The names
# ``G`` and ``A`` are positional (first and second Kronecker factor of that ordering); which one holds
# the input statistics and which the output gradients is stated per site.


def _flat_grads(output_grads: Tensor, rows: int, columns: int) -> Tensor:
    """``output_grads (N, K, …)`` → ``(N, K, rows, columns)``, checking the element count."""
    n, k = output_grads.shape[:2]
    if output_grads[0, 0].numel() != rows * columns:
        raise ValueError(
            f"output_grads have {output_grads[0, 0].numel()} elements per column, expected {rows}·{columns}"
        )
    return output_grads.reshape(n, k, rows, columns)


def _mean_basis_variance(basis: Tensor) -> float:
    """``mean_t Σ_m B_mt²`` of an interpolation matrix ``B (M, T)`` (the sparse layers' gain normaliser)."""
    return float(basis.double().square().sum(0).mean())


def _factored_factors(
    x: Tensor,
    grads: Tensor,
    theta1: Tensor,
    theta2: Tensor,
    gain1: float,
    gain2: float,
    basis_out: Tensor | None,
    basis_in: Tensor | None,
) -> dict[str, KroneckerFactors]:
    """Shared core of :func:`ffc_factors` and :func:`sfc_factors`.

    ``x (N, C, P)``, ``grads (N, K, C', Q)``, effective ``theta1 (C', C, Q)`` and ``theta2 (C', C, P)``
    (gains, bases and block scale included); ``gain1``/``gain2``: the factors by which ∂θ_eff/∂site
    scales (times the basis where there is one).
    """
    n, c, _ = x.shape
    c_out = theta1.shape[0]
    z = torch.einsum("ncp,kcp->nkc", x, theta2)  # (N, C', C): the input of the θ₁ step
    # weight_in: shared over the input channel c; gradient at z(·, c), activation e_c ⊗ (gain·B x_c)
    dz = torch.einsum("nbkq,kcq->nbkc", grads, theta1)  # (N, K, C', C)
    g_in = torch.einsum("nbkc,nblc->kl", dz, dz) / n
    xin = x if basis_in is None else torch.einsum("ncp,mp->ncm", x, basis_in.to(x))
    a_in = torch.block_diag(*(torch.einsum("ncp,ncq->cpq", xin, xin) * (gain2**2 / (n * c))))
    # weight_out: shared over the output channel c′; activation e_c′ ⊗ (gain·z(c′, ·)), gradient B g_c′
    a_out = torch.block_diag(*(torch.einsum("nkc,nkd->kcd", z, z) * (gain1**2 / (n * c_out))))
    gq = grads if basis_out is None else torch.einsum("nbkq,mq->nbkm", grads, basis_out.to(grads))
    g_out = torch.einsum("nbkq,nbkr->qr", gq, gq) / n
    return {"weight_out": KroneckerFactors(a_out, g_out, n), "weight_in": KroneckerFactors(g_in, a_in, n)}


def ffc_factors(
    inputs: Tensor, output_grads: Tensor, weight_out: Tensor, weight_in: Tensor, *, scale: float = 1.0
) -> dict[str, KroneckerFactors]:
    """KFAC of the factored fully-connected pathway F-FC (paper 004 Eq. 5, Sec. 5.1 and App. C.1).

    The layer (:class:`~pyro_invariance.symmetry.equivariant_layers.FactoredFullyConnected`) is
    ``y(c′, q) = Σ_c θ₁(c′, c, q) z(c′, c)``, ``z(c′, c) = Σ_p x(c, p) θ₂(c′, c, p)`` with the effective
    ``θ₁ = s·√(2/C)·weight_out`` and ``θ₂ = weight_in/√P`` (C = CG input channels, C′ = C′G′ output
    channels, P = HW input and Q = H′W′ output positions, s = ``scale``, the block's 1/√K). Sec. 5.1
    writes each step as a linear layer with an extra sum, ``J_θᵀ = Σ_c a_c ⊗ g_c``, and KFAC then
    exchanges sums and products: ``H_θ ≈ 1/(N·S) [Σ_{n,c} a a ᵀ] ⊗ [Σ_{n,c} g Λ gᵀ]`` with S the
    size of the shared index — KFAC-expand, the KFC treatment of weight sharing (Grosse & Martens
    2016; :func:`conv2d_factors`). The appendix itself is not in our copy of the paper; the sizes of
    the sites fix how the two steps are linear layers (and the authors' ``FLinear2d`` builds them
    the same way, as linear layers on block-diagonal inputs):

    * ``weight_in`` θ₂ ``(C′, C·P)``: the linear map ``(C·P) → C′`` applied, for each input channel c,
      to ``a_nc = e_c ⊗ x_n(c, ·)/√P`` (the input masked to channel c), giving ``z_n(·, c)``; shared
      over c (S = C). With the gradients at z, ``g_nkc(c′) = ∂f_k/∂z_n(c′, c) = Σ_q θ₁(c′, c, q) g_nk(c′, q)``
      (``g_nk`` = ``output_grads[n, k]``)::

          G (C′, C′)    = (1/N) Σ_{n,k,c} g_nkc g_nkcᵀ
          A (CP, CP)    = 1/(N·C) Σ_{n,c} a_nc a_ncᵀ
                          — block-diagonal: A[(c,p),(c,p′)] = Σ_n x_n(c,p) x_n(c,p′) / (N·C·P)

      ordering ``site.flatten()`` = (c′, c, p) ↔ ``kron(G[c′], A[(c, p)])``.
    * ``weight_out`` θ₁ ``(C′, C·Q)``: for each output channel c′ the map ``z_n(c′, ·) ↦ y_n(c′, ·)``,
      i.e. a linear map ``(C′·C) → Q`` applied to ``a_nc′ = e_c′ ⊗ s√(2/C)·z_n(c′, ·)``; shared over c′
      (S = C′). The site's row-major order (c′, c, q) puts the *input* index first::

          G (C′C, C′C)  = 1/(N·C′) Σ_{n,c′} a_nc′ a_nc′ᵀ   — block-diagonal in c′ (input statistics)
          A (Q, Q)      = (1/N) Σ_{n,k,c′} g_nk(c′, ·) g_nk(c′, ·)ᵀ     (output gradients)

      ``site.flatten()`` = (c′, c, q) ↔ ``kron(G[(c′, c)], A[q])``: here ``.G`` holds the input and
      ``.A`` the gradient factor.

    Approximation: the exact block is ``Σ_n Σ_k (Σ_c g ⊗ a)(Σ_c g ⊗ a)ᵀ``; its blocks between
    different shared indices (c ≠ c̃ for θ₂, c′ ≠ c̃′ for θ₁) are dropped (the KFAC factors are
    block-diagonal there) and the remaining sums of products replaced by products of sums. Exact for
    one data point when the shared index has size one (one input channel for θ₂, one output channel
    for θ₁): then the step is a plain linear layer. The two sites get independent blocks (no θ₁–θ₂
    cross terms), as every KFAC block-diagonal. The block-diagonal factors are stored dense
    (``(CP)²`` for θ₂'s A): their eigendecomposition could be done per block for large layers.

    Args:
        inputs: the pathway's input ``(N, C, G, H, W)`` (any shape with ``C·G·H·W`` elements per example).
        output_grads: ``(N, K, C′, G′, H′, W′)`` (or any ``(N, K, …)`` with ``C′G′·H′W′`` per column).
        weight_out, weight_in: the sample sites θ₁ ``(C′G′, CG·H′W′)`` and θ₂ ``(C′G′, CG·HW)``.
        scale: the factor the block multiplies the pathway by (``1/√K`` inside a
            :class:`~pyro_invariance.symmetry.equivariant_layers.RelaxedBlock`), when ``output_grads``
            are taken at the block's sum rather than at the pathway's own output.
    Returns:
        ``{"weight_out": …, "weight_in": …}``.
    """
    n, c_out = inputs.shape[0], weight_out.shape[0]
    q = output_grads[0, 0].numel() // c_out
    c = weight_out.shape[1] // q
    p = weight_in.shape[1] // c
    if weight_out.shape != (c_out, c * q) or weight_in.shape != (c_out, c * p) or inputs[0].numel() != c * p:
        raise ValueError(
            f"inconsistent F-FC shapes: weight_out {tuple(weight_out.shape)}, weight_in "
            f"{tuple(weight_in.shape)}, inputs {tuple(inputs.shape)}, output_grads {tuple(output_grads.shape)}"
        )
    gain1, gain2 = math.sqrt(2.0 / c) * scale, 1.0 / math.sqrt(p)
    theta1 = weight_out.reshape(c_out, c, q) * gain1
    theta2 = weight_in.reshape(c_out, c, p) * gain2
    x = inputs.reshape(n, c, p)
    return _factored_factors(x, _flat_grads(output_grads, c_out, q), theta1, theta2, gain1, gain2, None, None)


def sfc_factors(
    inputs: Tensor,
    output_grads: Tensor,
    weight_out: Tensor,
    weight_in: Tensor,
    basis_out: Tensor,
    basis_in: Tensor,
    *,
    scale: float = 1.0,
    gain_out: float | None = None,
    gain_in: float | None = None,
) -> dict[str, KroneckerFactors]:
    """KFAC of the sparse factored pathway S-FC (paper 004 Eq. 7, Sec. 5.2 and App. C.2).

    S-FC is F-FC (:func:`ffc_factors`) with spatial factors interpolated from anchor values:
    ``θ₁ = s·γ₁·u₁ B_out``, ``θ₂ = γ₂·u₂ B_in`` (``B (M, T) = (K_ZZ + σ²I)⁻¹K_ZT``; gains
    ``γ₁ = √(2/(C·v̄_out))``, ``γ₂ = √(1/(P·v̄_in))``, ``v̄ = mean_t Σ_m B_mt²``, as
    :class:`~pyro_invariance.symmetry.equivariant_layers.SparseFullyConnected`). Sec. 5.2: by the
    chain rule ``∂f/∂u_m = Σ_t ∂f/∂θ(t)·B_mt``, so the F-FC factors are projected through the basis
    on their spatial dimension — the input factor of θ₂ (P → M_in), the gradient factor of θ₁
    (Q → M_out). The projection is exact (linear reparameterisation), so the approximation is F-FC's:

    * ``weight_in`` u₂ ``(C′, C·M_in)``: ``G (C′, C′)`` as F-FC's; ``A (C·M_in, C·M_in)`` block-diagonal,
      ``A[(c,m),(c,m′)] = γ₂²/(N·C) Σ_n (B_in x_n(c, ·))_m (B_in x_n(c, ·))_m′``; order (c′, c, m) ↔ ``kron(G, A)``.
    * ``weight_out`` u₁ ``(C′, C·M_out)``: ``G (C′C, C′C)`` the input factor of F-FC with γ₁;
      ``A (M_out, M_out) = (1/N) Σ_{n,k,c′} (B_out g_nk(c′, ·))(B_out g_nk(c′, ·))ᵀ``;
      order (c′, c, m) ↔ ``kron(G, A)``.

    Args:
        inputs, output_grads, scale: as :func:`ffc_factors`.
        weight_out, weight_in: the anchor-value sites u₁ ``(C′G′, CG·M_out)``, u₂ ``(C′G′, CG·M_in)``.
        basis_out, basis_in: ``B_out (M_out, H′W′)``, ``B_in (M_in, HW)`` (the layer's buffers).
        gain_out, gain_in: γ₁, γ₂; by default computed from the bases as the layer does (pass the
            layer's ``scale_out``/``scale_in`` when the bases were rounded, e.g. float32 buffers).
    Returns:
        ``{"weight_out": …, "weight_in": …}``.
    """
    n, c_out = inputs.shape[0], weight_out.shape[0]
    (m_out, q), (m_in, p) = basis_out.shape, basis_in.shape
    c = weight_out.shape[1] // m_out
    if weight_out.shape != (c_out, c * m_out) or weight_in.shape != (c_out, c * m_in) or inputs[0].numel() != c * p:
        raise ValueError(
            f"inconsistent S-FC shapes: weight_out {tuple(weight_out.shape)}, weight_in "
            f"{tuple(weight_in.shape)}, bases {tuple(basis_out.shape)} / {tuple(basis_in.shape)}, "
            f"inputs {tuple(inputs.shape)}"
        )
    if gain_out is None:
        gain_out = math.sqrt(2.0 / (c * _mean_basis_variance(basis_out)))
    if gain_in is None:
        gain_in = math.sqrt(1.0 / (p * _mean_basis_variance(basis_in)))
    gain1 = gain_out * scale
    theta1 = weight_out.reshape(c_out, c, m_out) @ basis_out.to(weight_out) * gain1
    theta2 = weight_in.reshape(c_out, c, m_in) @ basis_in.to(weight_in) * gain_in
    x = inputs.reshape(n, c, p)
    grads = _flat_grads(output_grads, c_out, q)
    return _factored_factors(x, grads, theta1, theta2, gain1, gain_in, basis_out, basis_in)


def sconv_factors(
    inputs: Tensor, output_grads: Tensor, basis: Tensor, *, scale: float = 1.0, gain: float | None = None
) -> dict[str, KroneckerFactors]:
    """KFC of the sparse 3×3 convolution S-CONV (paper 004 Eq. 6, Sec. 5.2 and App. C.2).

    Filters ``w(c′, c, t) = s·γ·Σ_m u(c′, c, m) B_mt`` over the 9 offsets t (row-major), circular
    padding, no bias (:class:`~pyro_invariance.symmetry.equivariant_layers.SparseConvolution`;
    ``γ = √(2/(C·9·v̄))``). KFC of the convolution (:func:`conv2d_factors`, Grosse & Martens 2016
    Eq. 18–19) with its input factor projected through the basis on the offset dimension (the chain
    rule of Sec. 5.2), with the unfolded patches ``a_nt (C·9)`` at the T = HW locations::

        G (C′, C′)        = (1/N) Σ_{n,k,t} g_nkt g_nktᵀ
        A (C·M, C·M)      = (sγ)²/(N·T) Σ_{n,t} â_nt â_ntᵀ,   â_nt(c, m) = Σ_t′ B_mt′ a_nt(c, t′)

    ordering ``site.flatten()`` = (c′, c, m) ↔ ``kron(G[c′], A[(c, m)])``. Not exact even for one input
    (KFC's uncorrelated-locations assumption) unless there is one location (a 1×1 map), where it is
    a linear layer on the projected patch.

    Args:
        inputs: ``(N, C, G, H, W)`` or ``(N, CG, H, W)``.
        output_grads: at the pathway's stride-1 output, ``(N, K, C′, G′, H, W)`` or ``(N, K, C′G′, H, W)``
            (at stride 2, scattered back through the polyphase selection: zero off the chosen component).
        basis: ``B (M, 9)`` (the layer's ``basis`` buffer).
        scale: the block's factor ``1/√K`` (see :func:`ffc_factors`).
        gain: γ; by default from the basis as the layer computes it (pass the layer's ``scale`` when
            the basis was rounded).
    Returns:
        ``{"weight": …}``.
    """
    n, (h, w) = inputs.shape[0], inputs.shape[-2:]
    x = inputs.reshape(n, -1, h, w)
    c = x.shape[1]
    m, taps = basis.shape
    k = math.isqrt(taps)
    if gain is None:
        gain = math.sqrt(2.0 / (c * taps * _mean_basis_variance(basis)))
    grads = output_grads.reshape(n, output_grads.shape[1], -1, h, w)
    fac = conv2d_factors(x, grads, k, padding=k // 2, padding_mode="circular", bias=False)
    proj = basis.to(fac.A) * (gain * scale)
    a = torch.einsum("mt,ctds,ls->cmdl", proj, fac.A.reshape(c, taps, c, taps), proj).reshape(c * m, c * m)
    return {"weight": KroneckerFactors(fac.G, a, n)}


def gconv_factors(inputs: Tensor, output_grads: Tensor, *, scale: float = 1.0) -> dict[str, KroneckerFactors]:
    """KFC of the p4 group convolution GCONV (paper 004 App. A; Cohen & Welling 2016), lifting or group.

    The layer (:class:`~pyro_invariance.symmetry.equivariant_layers.GroupConvolution`) convolves
    with the filter bank ``ψ_r = rot90(roll(ψ, r, group axis), r)`` for the 4 output rotations r
    (lifting: ``ψ_r = rot90(ψ, r)``), ``ψ = s·√(2/(C·g_in·9))·weight``, so that
    ``y_n(c′, r, t) = ψ(c′, ·) · a_nrt`` with the *rotated patch*
    ``a_nrt(c, s, ·) = rot90(patch_nt(c, s + r mod 4, ·), −r)`` (lifting: ``rot90(patch_nt(c, ·), −r)``).
    The weights are thus shared over the T = HW locations *and* the 4 rotations: a group
    convolution is a convolution over the group p4 = rotations ⋉ translations. We apply KFC with the
    group elements (r, t) as its locations (our choice — the paper derives KFAC for CONV, F-FC and
    the sparse layers only; its GCONV is a convolution over the group, App. A)::

        G (C′, C′)               = (1/N) Σ_{n,k,r,t} g_nkrt g_nkrtᵀ
        A (C·g_in·9, C·g_in·9)   = (sγ)²/(N·4T) Σ_{n,r,t} a_nrt a_nrtᵀ

    ordering ``site.flatten()`` = (c′, c, [s,] kh, kw) ↔ ``kron(G[c′], A[(c, s, kh, kw)])``. Exact for
    one data point only when the gradient reaches a single group element (r, t) and all rotated
    patches coincide (e.g. an input constant over space and group).

    Args:
        inputs: ``(N, C, g_in, H, W)`` with ``g_in`` 1 (lifting) or 4; a 4-D input is lifted (g_in = 1).
        output_grads: ``(N, K, C′, 4, H, W)`` at the pathway's stride-1 output.
        scale: the block's factor ``1/√K`` (see :func:`ffc_factors`).
    Returns:
        ``{"weight": …}``.
    """
    x = inputs if inputs.dim() == 5 else inputs.unsqueeze(2)
    n, c, g_in, h, w = x.shape
    if g_in not in (1, 4):
        raise ValueError(f"GCONV input group axis must be 1 or 4, got {g_in}")
    k = 3
    t = h * w
    patches = F.unfold(F.pad(x.reshape(n, c * g_in, h, w), (k // 2,) * 4, mode="circular"), k)
    patches = patches.reshape(n, c, g_in, k, k, t)
    rotated = torch.stack(
        [torch.rot90(patches.roll(-r, dims=2) if g_in > 1 else patches, -r, dims=(3, 4)) for r in range(4)], dim=1
    ).reshape(n, 4, c * g_in * k * k, t)
    gain = math.sqrt(2.0 / (c * g_in * k * k)) * scale
    a_factor = torch.einsum("nrit,nrjt->ij", rotated, rotated) * (gain**2 / (n * 4 * t))
    grads = output_grads.reshape(n, output_grads.shape[1], -1, 4, t)
    g_factor = torch.einsum("nkcrt,nkdrt->cd", grads, grads) / n
    return {"weight": KroneckerFactors(g_factor, a_factor, n)}
