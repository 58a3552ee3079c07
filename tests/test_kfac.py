"""KFAC for fully connected layers and the KFAC-Laplace log marginal likelihood (issue 12, oracle
tests (a) for FC and (c); ``pyro_invariance/infer/kfac.py``), against dense references."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pyro_invariance.infer.kfac import (
    KroneckerFactors,
    categorical_hessian_sqrt,
    kfac_log_det,
    kfac_log_marginal_likelihood,
    mlp_kfac,
)

torch.set_num_threads(1)


def _mlp(seed: int = 0):
    torch.manual_seed(seed)
    return [nn.Linear(4, 5).double(), nn.Linear(5, 3).double()]


def _exact_ggn_blocks(layers, x):
    """Σ_n J_nᵀ Λ_n J_n per layer, from full Jacobians of the logits in each layer's [W, b] (row-major,
    the bias as the last column: [W | b].flatten())."""
    blocks = []
    for i, layer in enumerate(layers):
        wb = torch.cat([layer.weight, layer.bias.unsqueeze(1)], dim=1).detach()

        def logits(flat, i=i, shape=wb.shape):
            wbi = flat.reshape(shape)
            h = x
            for j, lay in enumerate(layers):
                h = h @ wbi[:, :-1].T + wbi[:, -1] if j == i else lay(h)
                if j + 1 < len(layers):
                    h = torch.tanh(h)
            return h

        jac = torch.autograd.functional.jacobian(logits, wb.flatten())  # (N, C, P)
        p = torch.softmax(logits(wb.flatten()), dim=-1)
        lam = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
        blocks.append(torch.einsum("ncp,ncd,ndq->pq", jac, lam, jac))
    return blocks


def test_categorical_hessian_sqrt():
    logits = torch.randn(6, 4, dtype=torch.float64)
    sqrt_h = categorical_hessian_sqrt(logits)
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(sqrt_h @ sqrt_h.transpose(-1, -2), torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2))


def test_kfac_equals_the_exact_ggn_on_one_input():
    """Oracle (a) for FC: with one data point the Kronecker product is the GGN block exactly."""
    layers = _mlp()
    x = torch.randn(1, 4, dtype=torch.float64)
    factors = mlp_kfac(layers, torch.tanh, x)
    for fac, exact in zip(factors, _exact_ggn_blocks(layers, x)):
        torch.testing.assert_close(fac.block(), exact, atol=1e-10, rtol=1e-8)


def test_kfac_approximates_the_ggn_on_several_inputs():
    """With several points KFAC is the product of averages, not the average of products: close, not equal."""
    layers = _mlp(1)
    x = torch.randn(16, 4, dtype=torch.float64)
    for fac, exact in zip(mlp_kfac(layers, torch.tanh, x), _exact_ggn_blocks(layers, x)):
        rel = float((fac.block() - exact).norm().detach() / exact.norm().detach())
        assert 1e-6 < rel < 0.5, rel
        torch.testing.assert_close(fac.block().trace(), exact.trace(), rtol=0.5, atol=0.0)


def test_log_det_in_the_eigenbasis_equals_the_dense_one():
    g = torch.randn(3, 3, dtype=torch.float64)
    a = torch.randn(4, 4, dtype=torch.float64)
    fac = KroneckerFactors(g @ g.T, a @ a.T, num_data=7)
    for delta in (0.1, 2.0):
        dense = torch.logdet(fac.block() + delta * torch.eye(12, dtype=torch.float64))
        torch.testing.assert_close(kfac_log_det(fac, delta), dense)


def test_log_marginal_likelihood_gradient_in_log_delta_matches_finite_differences():
    """Oracle (c): d/d log δ of the KFAC-Laplace evidence against a central difference."""
    layers = _mlp(2)
    x = torch.randn(10, 4, dtype=torch.float64)
    y = torch.randint(0, 3, (10,))
    factors = mlp_kfac(layers, torch.tanh, x)
    params = [torch.cat([lay.weight, lay.bias.unsqueeze(1)], 1).detach().flatten() for lay in layers]
    h = layers[1](torch.tanh(layers[0](x)))
    log_lik = -nn.functional.cross_entropy(h, y, reduction="sum").detach()

    def objective(log_delta):
        return kfac_log_marginal_likelihood(log_lik, params, factors, log_delta.exp())

    log_delta = torch.tensor([0.3, -0.5], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(objective(log_delta), log_delta)
    eps = 1e-6
    for i in range(2):
        e = torch.zeros(2, dtype=torch.float64)
        e[i] = eps
        fd = (objective(log_delta.detach() + e) - objective(log_delta.detach() - e)) / (2 * eps)
        torch.testing.assert_close(grad[i], fd, rtol=1e-6, atol=1e-8)
    with pytest.raises(ValueError, match="one parameter tensor and one prior precision per layer"):
        kfac_log_marginal_likelihood(log_lik, params[:1], factors, log_delta.exp())
