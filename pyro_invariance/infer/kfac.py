"""Kronecker-factored (KFAC) Gauss–Newton curvature and the KFAC-Laplace log marginal likelihood.

Issue 12, first part: the generic core for fully connected layers (Martens & Grosse 2015), on
which the layer-wise networks' CONV / F-FC / S-FC / GCONV factors (paper 004, Sec. 5 and App. C)
are to be built. Not yet used by :func:`pyro_invariance.infer.laplace.fit_laplace` (diagonal GGN).

For a layer ``y = W a`` (bias folded in by appending 1 to ``a``) inside a network with outputs
``f`` (logits) and a categorical likelihood, the generalised Gauss–Newton block of ``vec(W)``
(row-major: ``W.flatten()``) over data points n is

    GGN_W = Σ_n (J_n)ᵀ Λ_n J_n = Σ_n Σ_c (g_nc g_ncᵀ) ⊗ (a_n a_nᵀ),

with ``Λ_n = diag(p_n) − p_n p_nᵀ = L_n L_nᵀ`` the Hessian of the negative log-likelihood in the
logits, ``L_n = diag(√p_n) − p_n √p_nᵀ`` (:func:`categorical_hessian_sqrt`), and
``g_nc = (∂f/∂y)ᵀ L_n[:, c]`` the c-th column backpropagated to the layer's output. KFAC replaces
the sum of Kronecker products by the product of sums (exact for one data point):

    GGN_W ≈ N · G ⊗ A,    G = (1/N) Σ_nc g_nc g_ncᵀ,   A = (1/N) Σ_n a_n a_nᵀ.

The Laplace log marginal likelihood with per-layer prior precisions δ_l (paper 004, Eq. 9; the
(2π) terms of the prior and of the Gaussian integral cancel):

    log p(D | δ) ≈ log p(D | θ*) + Σ_l [ (P_l/2) log δ_l − (δ_l/2) ‖θ*_l‖² − ½ log det(N G_l ⊗ A_l + δ_l I) ],

with ``log det(N G ⊗ A + δ I) = Σ_ij log(N λ_i^G λ_j^A + δ)`` from the eigenvalues of the two factors
(:func:`kfac_log_det`) — the way laplace-torch adds the prior in the Kronecker eigenbasis.

Convolutions (KFC, Grosse & Martens 2016, Eq. 18–19; :func:`conv2d_factors`): with the unfolded
input patches ``a_nt`` (bias 1 appended) and output gradients ``g_nct`` at locations t = 1..T,

    A = (1/(N T)) Σ_nt a_nt a_ntᵀ,     G = (1/N) Σ_nct g_nct g_nctᵀ,     GGN_W ≈ N · G ⊗ A,

exact when the output gradients at different locations are uncorrelated and the patches are
spatially homogeneous (the paper's assumptions); not exact even for one input.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["KroneckerFactors", "categorical_hessian_sqrt", "conv2d_factors", "mlp_kfac", "kfac_log_det",
           "kfac_log_marginal_likelihood"]


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


def conv2d_factors(inputs: Tensor, output_grads: Tensor, kernel_size: int, *, stride: int = 1, padding: int = 0,
                   padding_mode: str = "zeros", bias: bool = True) -> KroneckerFactors:  # fmt: skip
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
    return [KroneckerFactors(torch.einsum("nco,ncp->op", g, g) / n, a.T @ a / n, n) for g, a in zip(grads, acts)]


def kfac_log_det(factors: KroneckerFactors, prior_precision: Tensor | float) -> Tensor:
    """``log det(N G ⊗ A + δ I)`` from the eigenvalues of G and A (differentiable in δ)."""
    eg = torch.linalg.eigvalsh(factors.G).clamp_min(0.0)
    ea = torch.linalg.eigvalsh(factors.A).clamp_min(0.0)
    delta = torch.as_tensor(prior_precision, dtype=eg.dtype, device=eg.device)
    return torch.log(factors.num_data * torch.outer(eg, ea) + delta).sum()


def kfac_log_marginal_likelihood(log_likelihood: Tensor, params: Sequence[Tensor], factors: Sequence[KroneckerFactors],
                                 prior_precisions: Tensor) -> Tensor:  # fmt: skip
    """Paper 004 Eq. 9 with the KFAC GGN (module docstring).

    Args:
        log_likelihood: ``log p(D | θ*)`` (a scalar, summed over the data).
        params: per layer the MAP parameters ``[W, b]`` flattened (any shape; only ‖θ_l‖² and P_l are used).
        factors: per layer :class:`KroneckerFactors` at θ*.
        prior_precisions: ``δ (L,)``, one per layer (differentiable: learn ``log δ`` by its gradient).
    """
    if len(params) != len(factors) or prior_precisions.shape != (len(factors),):
        raise ValueError(f"need one parameter tensor and one prior precision per layer: {len(params)} params, "
                         f"{len(factors)} factors, prior_precisions {tuple(prior_precisions.shape)}")  # fmt: skip
    total = log_likelihood
    for theta, fac, delta in zip(params, factors, prior_precisions):
        if theta.numel() != fac.num_params:
            raise ValueError(f"a layer has {theta.numel()} parameters but its factors describe {fac.num_params}")
        total = total + 0.5 * theta.numel() * torch.log(delta) - 0.5 * delta * theta.detach().pow(2).sum()
        total = total - 0.5 * kfac_log_det(fac, delta)
    return total
