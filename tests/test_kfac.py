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


def _conv_net(seed: int = 0):
    torch.manual_seed(seed)
    conv = nn.Conv2d(2, 3, 3, padding=1, padding_mode="circular").double()
    head = nn.Linear(3 * 4 * 4, 4).double()
    return conv, head


def _conv_grads(conv, head, x):
    """The layer's output and the Hessian square-root columns backpropagated to it, ``(N, C, C_out, H, W)``."""
    y = conv(x)
    logits = head(torch.tanh(y).flatten(1))
    sqrt_h = categorical_hessian_sqrt(logits.detach())
    cols = [torch.autograd.grad(logits, y, grad_outputs=sqrt_h[:, :, c], retain_graph=True)[0] for c in range(4)]
    return torch.stack(cols, dim=1)


def test_conv_factors_equal_their_definition_by_brute_force():
    """KFC factors against loops over examples, locations and kernel offsets (circular padding)."""
    from pyro_invariance.infer.kfac import conv2d_factors

    conv, head = _conv_net()
    x = torch.randn(3, 2, 4, 4, dtype=torch.float64)
    grads = _conv_grads(conv, head, x)
    fac = conv2d_factors(x, grads, 3, padding=1, padding_mode="circular")
    n, cin, h, w = x.shape
    a_sum = torch.zeros(cin * 9 + 1, cin * 9 + 1, dtype=torch.float64)
    g_sum = torch.zeros(3, 3, dtype=torch.float64)
    for i in range(n):
        for r in range(h):
            for c in range(w):
                patch = torch.stack([x[i, ch, (r + dr) % h, (c + dc) % w]
                                     for ch in range(cin) for dr in (-1, 0, 1) for dc in (-1, 0, 1)])  # fmt: skip
                a = torch.cat([patch, torch.ones(1, dtype=torch.float64)])
                a_sum += torch.outer(a, a)
                for col in range(4):
                    g = grads[i, col, :, r, c]
                    g_sum += torch.outer(g, g)
    torch.testing.assert_close(fac.A, a_sum / (n * h * w))
    torch.testing.assert_close(fac.G, g_sum / n)
    assert fac.num_params == 3 * (2 * 9 + 1)


def test_conv_kfc_against_the_exact_ggn_block_is_reported_not_exact():
    """KFC is an approximation for convolutions even on one input: the relative (Frobenius) error of
    N·G⊗A against the exact GGN block of [W | b] (from Jacobians) is reported, not small (issue 12 asks
    for it to be reported per layer type)."""
    from pyro_invariance.infer.kfac import conv2d_factors

    conv, head = _conv_net(1)
    x = torch.randn(1, 2, 4, 4, dtype=torch.float64)
    fac = conv2d_factors(x, _conv_grads(conv, head, x), 3, padding=1, padding_mode="circular")
    w0 = torch.cat([conv.weight.flatten(1), conv.bias.unsqueeze(1)], dim=1).detach()

    def logits(flat):
        wb = flat.reshape(w0.shape)
        y = nn.functional.conv2d(nn.functional.pad(x, (1,) * 4, mode="circular"), wb[:, :-1].reshape(conv.weight.shape),
                                 wb[:, -1])  # fmt: skip
        return head(torch.tanh(y).flatten(1))

    jac = torch.autograd.functional.jacobian(logits, w0.flatten())
    p = torch.softmax(logits(w0.flatten()), -1)
    exact = torch.einsum("ncp,ncd,ndq->pq", jac, torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2), jac)
    rel = float((fac.block() - exact).norm().detach() / exact.norm().detach())
    assert 0.01 < rel < 2.0, rel  # measured 0.956 here: a dense head correlates the locations' gradients


def test_conv_kfc_is_exact_with_one_location():
    """A 1×1 convolution of a 1×1 image is a fully connected layer: with one input KFC is exact."""
    from pyro_invariance.infer.kfac import conv2d_factors

    torch.manual_seed(3)
    conv, head = nn.Conv2d(2, 3, 1).double(), nn.Linear(3, 4).double()
    x = torch.randn(1, 2, 1, 1, dtype=torch.float64)
    y = conv(x)
    logits = head(torch.tanh(y).flatten(1))
    sqrt_h = categorical_hessian_sqrt(logits.detach())
    grads = torch.stack([torch.autograd.grad(logits, y, grad_outputs=sqrt_h[:, :, c], retain_graph=True)[0]
                         for c in range(4)], dim=1)  # fmt: skip
    fac = conv2d_factors(x, grads, 1)
    w0 = torch.cat([conv.weight.flatten(1), conv.bias.unsqueeze(1)], dim=1).detach()

    def f(flat):
        wb = flat.reshape(w0.shape)
        return head(torch.tanh(x.flatten(1) @ wb[:, :-1].T + wb[:, -1]))

    jac = torch.autograd.functional.jacobian(f, w0.flatten())
    p = torch.softmax(f(w0.flatten()), -1)
    exact = torch.einsum("ncp,ncd,ndq->pq", jac, torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2), jac)
    torch.testing.assert_close(fac.block().detach(), exact, atol=1e-10, rtol=1e-8)
