"""KFAC-Laplace marginal likelihood against laplace-torch, an independent implementation
(``pyro_invariance/infer/kfac.py``).

The oracle is laplace-torch's ``KronLaplace`` with the ``CurvlinopsGGN`` backend and
``stochastic=False``: curvlinops' ``KFACLinearOperator`` with ``FisherType.TYPE2``, i.e. the exact
expectation over labels via the loss Hessian's matrix square root (the same construction as
:func:`~pyro_invariance.infer.kfac.mlp_kfac`), not the Monte-Carlo Fisher (``stochastic=True``)
and not the empirical Fisher (``CurvlinopsEF``); convolutions use KFAC-expand (curvlinops'
default ``kfac_approx="expand"``, which laplace-torch passes through). ``AsdlGGN`` with
``stochastic=False`` (asdfghjkl's ``fisher_exact``) is a second, independent oracle and agrees to
round-off on both networks. ``BackPackGGN`` (``stochastic=False``: BackPack's KFLR) agrees on the FC
network but uses a different approximation for convolutions and is not used for them (see below).

Conventions, read from laplace-torch 0.3 / curvlinops 3.0.1 and mapped onto ours:

* **Bias.** laplace-torch builds curvlinops' operator with ``separate_weight_and_bias=True``: a
  layer's weight is the block ``B ⊗ A_x`` and its bias the separate block ``B`` (no weight–bias
  cross terms), and a "per-layer" prior precision is one δ per *parameter tensor* (``len(params)``:
  weight and bias each get their own). Ours folds the bias into A (``A = [[A_x, ā], [āᵀ, 1]]``),
  which couples weight and bias. The test therefore builds ours in laplace-torch's convention from
  our own factors: weight ``KroneckerFactors(G, A[:-1, :-1], N)`` and bias
  ``KroneckerFactors(G, A[-1:, -1:], N)`` (``A[-1, -1] = 1``), each with its own δ, passed to
  :func:`kfac_log_marginal_likelihood`. Our folded factors themselves are compared with curvlinops'
  ``separate_weight_and_bias=False`` operator, which folds the bias exactly as we do.
* **Normalisation.** With laplace-torch's ``CrossEntropyLoss(reduction="sum")`` curvlinops returns
  ``B = Σ_{n,c,t} g gᵀ`` (unnormalised) and ``A = Σ_{n,t} a aᵀ / (N T)`` (KFAC-expand divides by
  the T weight-sharing locations), so ``B = N · G_ours``, ``A = A_ours`` and ``B ⊗ A = N G ⊗ A``,
  the block in our module docstring; for a convolution this is KFC (Grosse & Martens 2016) in our
  ``conv2d_factors`` normalisation. No rescaling is needed.
* **Prior, likelihood, temperature.** ``temperature=1`` and ``sigma_noise=1`` (laplace-torch's
  Hessian factor ``1/(σ² T) = 1``; σ is unused for classification), prior mean 0, and laplace-torch's
  ``log_likelihood = −Σ_n CE`` (summed). Its evidence ``log p(D|θ) − ½(log det(H + δ) − Σ P_l log δ_l
  + Σ δ_l ‖θ_l‖²)`` adds δ in the Kronecker eigenbasis, ``log(outer(λ_B, λ_A) + δ)``, as ours does.
* **Padding.** curvlinops extracts patches from a ``Conv2d``'s input with zero padding whatever the
  module's ``padding_mode``, so it cannot see circular padding inside a ``Conv2d``; the circular case
  is compared through an explicit ``nn.CircularPad2d`` before an unpadded ``Conv2d`` (the same
  function), against ``conv2d_factors(..., padding_mode="circular")``.
* **BackPack's conv KFLR is not KFC-expand.** BackPack (1.7.1, ``hbp/convnd.py``) sums the output
  gradients over the T locations *before* the outer product, ``G_bp = Σ_nc (Σ_t g_nct)(Σ_t g_nct)ᵀ``
  (the exact GGN of the bias; "reduce"-like), and does not divide A by T, ``A_bp = Σ_nt a aᵀ / N``.
  That is a different approximation, not a rescaling of ours, so laplace-torch's evidence with
  ``BackPackGGN`` differs from ours and curvlinops' on the conv network (measured here −113.6 vs −80.6).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from pyro_invariance.infer.kfac import (
    KroneckerFactors,
    categorical_hessian_sqrt,
    conv2d_factors,
    kfac_log_marginal_likelihood,
    mlp_kfac,
)

# optional oracles: the whole module is skipped without them
KronLaplace = pytest.importorskip("laplace").KronLaplace
curvature = pytest.importorskip("laplace.curvature")
AsdlGGN, BackPackGGN, CurvlinopsGGN = curvature.AsdlGGN, curvature.BackPackGGN, curvature.CurvlinopsGGN
curvlinops = pytest.importorskip("curvlinops")

torch.set_num_threads(1)

# third-party hook warnings from asdfghjkl / BackPack inside laplace-torch's backends
pytestmark = [
    pytest.mark.filterwarnings("ignore:Using a non-full backward hook:FutureWarning"),
    pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning"),
]

N_DATA = 20
N_CLASSES = 3


def _fc_net(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, N_CLASSES)).double()


# (padding, padding_mode, stride): zero padding, circular padding, a strided convolution
CONV_CASES = [(1, "zeros", 1), (1, "circular", 1), (0, "zeros", 2)]


def _conv_net(padding: int, padding_mode: str, stride: int, seed: int = 0) -> nn.Sequential:
    """conv → tanh → flatten → linear on 2×5×5 images; circular padding as an explicit pad module."""
    torch.manual_seed(seed)
    if padding_mode == "circular":
        pad_conv = [nn.CircularPad2d(padding), nn.Conv2d(2, 3, 3, stride=stride)]
    else:
        pad_conv = [nn.Conv2d(2, 3, 3, stride=stride, padding=padding)]
    side = (5 + 2 * padding - 3) // stride + 1
    return nn.Sequential(*pad_conv, nn.Tanh(), nn.Flatten(), nn.Linear(3 * side * side, N_CLASSES)).double()


def _data(shape: tuple[int, ...], seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N_DATA, *shape, generator=g, dtype=torch.float64)
    return x, torch.randint(0, N_CLASSES, (N_DATA,), generator=g)


def _fc_factors(model: nn.Sequential, x: torch.Tensor) -> list[KroneckerFactors]:
    return mlp_kfac([m for m in model if isinstance(m, nn.Linear)], torch.tanh, x)


def _conv_factors(
    model: nn.Sequential, x: torch.Tensor, padding: int, padding_mode: str, stride: int
) -> list[KroneckerFactors]:
    """Our KFC factors of the conv layer (Hessian square-root columns backpropagated to its output by
    hand) and the head's from :func:`mlp_kfac` on the flattened features."""
    conv = next(m for m in model if isinstance(m, nn.Conv2d))
    head = model[-1]
    if padding_mode == "circular":
        y = nn.functional.conv2d(
            nn.functional.pad(x, (padding,) * 4, mode="circular"), conv.weight, conv.bias, stride=stride
        )
    else:
        y = nn.functional.conv2d(x, conv.weight, conv.bias, stride=stride, padding=padding)
    feats = torch.tanh(y).flatten(1)
    logits = head(feats)
    sqrt_h = categorical_hessian_sqrt(logits.detach())
    grads = torch.stack(
        [torch.autograd.grad(logits, y, grad_outputs=sqrt_h[:, :, c], retain_graph=True)[0] for c in range(N_CLASSES)],
        dim=1,
    )
    conv_fac = conv2d_factors(x, grads.detach(), 3, stride=stride, padding=padding, padding_mode=padding_mode)
    (head_fac,) = mlp_kfac([head], torch.tanh, feats.detach())
    return [conv_fac, head_fac]


def _separate_weight_and_bias(factors: list[KroneckerFactors]) -> list[KroneckerFactors]:
    """laplace-torch's convention: per layer a weight block G ⊗ A_x and a bias block G ⊗ [A_bb]."""
    out = []
    for f in factors:
        out += [KroneckerFactors(f.G, f.A[:-1, :-1], f.num_data), KroneckerFactors(f.G, f.A[-1:, -1:], f.num_data)]
    return out


def _ours(model: nn.Sequential, factors: list[KroneckerFactors], x, y, prior_precisions: torch.Tensor) -> torch.Tensor:
    log_lik = -nn.functional.cross_entropy(model(x), y, reduction="sum").detach()
    params = [p.detach().flatten() for p in model.parameters()]  # weight, bias, weight, bias, ...
    return kfac_log_marginal_likelihood(log_lik, params, _separate_weight_and_bias(factors), prior_precisions)


def _laplace_torch(model: nn.Sequential, x, y, prior_precisions: torch.Tensor, backend=CurvlinopsGGN) -> torch.Tensor:
    # `asdl_fisher_kwargs` is what laplace-torch forwards to the backend's kron(): curvlinops' kfac_approx
    kron_kwargs = {"kfac_approx": "expand"} if backend is CurvlinopsGGN else None
    la = KronLaplace(
        model,
        "classification",
        backend=backend,
        backend_kwargs={"stochastic": False},
        asdl_fisher_kwargs=kron_kwargs,
        temperature=1.0,
        sigma_noise=1.0,
    )
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=N_DATA)  # full batch
    la.fit(loader)
    return la.log_marginal_likelihood(prior_precision=prior_precisions)


def _per_tensor_deltas(model: nn.Module) -> torch.Tensor:
    n = len(list(model.parameters()))
    return torch.linspace(0.3, 3.0, n, dtype=torch.float64)  # all different: the ordering is checked too


@pytest.mark.parametrize("backend", [CurvlinopsGGN, AsdlGGN, BackPackGGN], ids=lambda b: b.__name__)
def test_fc_log_marginal_likelihood_equals_laplace_torch_kron(backend):
    """Oracle (b), FC: 5 → 4 → 4 → 3 tanh network, 20 points, one δ per weight and per bias."""
    model = _fc_net()
    x, y = _data((5,))
    deltas = _per_tensor_deltas(model)
    ours = _ours(model, _fc_factors(model, x), x, y, deltas)
    ref = _laplace_torch(model, x, y, deltas, backend)
    torch.testing.assert_close(ours, ref.detach(), rtol=1e-4, atol=0.0)
    torch.testing.assert_close(ours, ref.detach(), rtol=1e-10, atol=0.0)  # measured: equal to round-off


@pytest.mark.parametrize("backend", [CurvlinopsGGN, AsdlGGN], ids=lambda b: b.__name__)
@pytest.mark.parametrize(("padding", "padding_mode", "stride"), CONV_CASES)
def test_conv_log_marginal_likelihood_equals_laplace_torch_kron(padding, padding_mode, stride, backend):
    """Oracle (b), CONV: conv (KFC, KFAC-expand) + tanh + flatten + linear head, 20 images 2×5×5."""
    model = _conv_net(padding, padding_mode, stride)
    x, y = _data((2, 5, 5))
    deltas = _per_tensor_deltas(model)
    ours = _ours(model, _conv_factors(model, x, padding, padding_mode, stride), x, y, deltas)
    ref = _laplace_torch(model, x, y, deltas, backend)
    torch.testing.assert_close(ours, ref.detach(), rtol=1e-4, atol=0.0)
    torch.testing.assert_close(ours, ref.detach(), rtol=1e-10, atol=0.0)  # measured: equal to round-off


def _curvlinops_folded_factors(model: nn.Module, x, y) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """curvlinops' exact-expectation KFAC with the bias folded into A, as ours (laplace-torch's settings otherwise)."""
    linop = curvlinops.KFACLinearOperator(
        model,
        nn.CrossEntropyLoss(reduction="sum"),
        list(model.parameters()),
        [(x, y)],
        fisher_type=curvlinops.FisherType.TYPE2,
        kfac_approx="expand",
        separate_weight_and_bias=False,
        check_deterministic=False,
    )
    linop.compute_kronecker_factors()
    names = [name for name, m in model.named_modules() if name in linop._mapping]
    return [(linop._gradient_covariances[n], linop._input_covariances[n]) for n in names]


@pytest.mark.parametrize("net", ["fc", *[f"conv-{i}" for i in range(len(CONV_CASES))]])
def test_folded_factors_equal_curvlinops(net):
    """Our factors with the bias folded into A, factor by factor: curvlinops' B = N·G, A = A."""
    if net == "fc":
        model, (x, y) = _fc_net(), _data((5,))
        ours = _fc_factors(model, x)
    else:
        case = CONV_CASES[int(net.split("-")[1])]
        model, (x, y) = _conv_net(*case), _data((2, 5, 5))
        ours = _conv_factors(model, x, *case)
    theirs = _curvlinops_folded_factors(model, x, y)
    assert len(ours) == len(theirs)
    for f, (b, a) in zip(ours, theirs):
        torch.testing.assert_close(f.num_data * f.G, b, rtol=1e-10, atol=1e-13)
        torch.testing.assert_close(f.A, a, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("net", ["fc", "conv"])
def test_log_marginal_likelihood_gradient_in_log_delta_matches_finite_differences(net):
    """Oracle (c), per weight / bias tensor (laplace-torch's convention) on the networks of (b): the
    autograd gradient in log δ against a central difference, and against laplace-torch's gradient."""
    if net == "fc":
        model, (x, y) = _fc_net(2), _data((5,), seed=3)
        factors = _fc_factors(model, x)
    else:
        case = CONV_CASES[0]
        model, (x, y) = _conv_net(*case, seed=2), _data((2, 5, 5), seed=3)
        factors = _conv_factors(model, x, *case)

    def objective(log_delta):
        return _ours(model, factors, x, y, log_delta.exp())

    log_delta = _per_tensor_deltas(model).log().requires_grad_(True)
    (grad,) = torch.autograd.grad(objective(log_delta), log_delta)
    eps = 1e-5
    for i in range(len(log_delta)):
        e = torch.zeros_like(log_delta)
        e[i] = eps
        fd = (objective(log_delta.detach() + e) - objective(log_delta.detach() - e)) / (2 * eps)
        torch.testing.assert_close(grad[i], fd, rtol=1e-6, atol=1e-9)

    ld = log_delta.detach().clone().requires_grad_(True)
    (ref_grad,) = torch.autograd.grad(_laplace_torch(model, x, y, ld.exp()), ld)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-8, atol=1e-10)
