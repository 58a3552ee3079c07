"""AIS for ``log p(D | η)`` of an invariant MLP (``research.uncertain_symmetry.annealed_evidence``):
against brute-force importance sampling from the prior on a problem small enough for it, common random
numbers, the transforms' draws per chain, and the refusals."""

from __future__ import annotations

import math

import pytest
import torch

from pyro_invariance.models import InvariantMLP
from research.uncertain_symmetry.annealed_evidence import annealed_readout_evidence, readout_design
from research.uncertain_symmetry.tests.tiny_readout import tiny_readout_data as _data
from research.uncertain_symmetry.tests.tiny_readout import tiny_readout_model as _tiny


def _prior_importance(model: InvariantMLP, x: torch.Tensor, y: torch.Tensor, draws: int = 400_000) -> float:
    """log p(D) by plain importance sampling from the prior (σ_p, W): exact to ~0.01 nats here."""
    design = readout_design(model, x, chains=1)[0]  # (N, H + 1), deterministic transforms
    g = torch.Generator().manual_seed(11)
    if model.prior == "hierarchical":
        sigma = torch.exp(float(model.prior_scale_loc) + torch.randn(draws, generator=g, dtype=torch.float64))
    else:
        sigma = torch.full((draws,), float(model.prior_scale), dtype=torch.float64)
    w = sigma[:, None, None] * torch.randn(draws, design.shape[1], 3, generator=g, dtype=torch.float64)
    logits = design @ w
    ll = torch.distributions.Categorical(logits=logits).log_prob(y).sum(-1)
    return float(torch.logsumexp(ll, 0) - math.log(draws))


@pytest.mark.parametrize("prior", ["fixed", "hierarchical"])
def test_matches_prior_importance_sampling(prior: str) -> None:
    torch.manual_seed(0)
    model = _tiny(prior)
    x, y = _data()
    exact = _prior_importance(model, x, y)
    got = annealed_readout_evidence(model, x, y, chains=64, temperatures=1000, step_size=0.5, seed=1)
    # the estimate's standard error is about sd/√R (≈ 0.02 nats); 4 of them, plus the reference's own error
    assert abs(got.log_evidence - exact) < 4 * got.log_weight_sd / 8 + 0.02, (got.log_evidence, exact)
    assert got.log_weight_sd < 0.3 and got.k_hat < 0.7
    assert 0.5 < got.acceptance <= 1.0
    assert got.log_scales.shape == got.scale_profile.shape == (1000,)
    if prior == "fixed":  # the path ends at the fixed scale; its last profile point is the evidence
        assert got.log_scales[-1].item() == pytest.approx(math.log(1.5))
        assert got.scale_profile[-1].item() == pytest.approx(got.log_evidence)
        assert got.edge_share == 0.0 and got.sigma_mode == pytest.approx(1.5)
    else:
        assert got.edge_share < 0.01
        s = got.log_scales  # σ_p's posterior mode on the path: the profile times s's N(loc, 1) prior
        best = torch.argmax(got.scale_profile - 0.5 * (s - float(model.prior_scale_loc)) ** 2)
        assert got.sigma_mode == pytest.approx(math.exp(s[best].item()))


def test_the_scale_profile_is_the_fixed_scale_evidence() -> None:
    """Along the path, the profile at σ_p = 1.5 is p(D | σ_p = 1.5): the fixed-prior model's evidence."""
    torch.manual_seed(0)
    x, y = _data()
    exact = _prior_importance(_tiny("fixed"), x, y)
    got = annealed_readout_evidence(_tiny("hierarchical"), x, y, chains=64, temperatures=1000, step_size=0.5, seed=2)
    at = int(torch.argmin((got.log_scales - math.log(1.5)).abs()))
    step = float(got.log_scales[1] - got.log_scales[0])
    assert abs(float(got.log_scales[at]) - math.log(1.5)) <= step / 2
    assert got.scale_profile[at].item() == pytest.approx(exact, abs=0.1)


def test_same_seed_same_numbers_and_chains_draw_their_own_transforms() -> None:
    torch.manual_seed(0)
    x, y = _data()
    model = _tiny("hierarchical", sampling="stochastic")
    a = annealed_readout_evidence(model, x, y, chains=4, temperatures=20, seed=5)
    b = annealed_readout_evidence(model, x, y, chains=4, temperatures=20, seed=5)
    c = annealed_readout_evidence(model, x, y, chains=4, temperatures=20, seed=6)
    assert torch.equal(a.log_weights, b.log_weights)
    assert not torch.equal(a.log_weights, c.log_weights)
    stochastic = readout_design(model, x, chains=3, seed=5)
    assert not torch.equal(stochastic[0], stochastic[1])
    assert torch.equal(stochastic, readout_design(model, x, chains=3, seed=5))
    assert torch.equal(stochastic[..., -1], torch.ones(3, 8, dtype=torch.float64))  # the bias column
    fixed = readout_design(_tiny("hierarchical"), x, chains=3)
    assert torch.equal(fixed[0], fixed[2])
    with torch.no_grad():
        assert torch.allclose(fixed[0, :, :-1], _tiny("hierarchical").features(x.reshape(8, -1)).double())


def test_refusals() -> None:
    x, y = _data()
    model = _tiny("fixed")
    with pytest.raises(TypeError, match="needs an InvariantMLP"):
        annealed_readout_evidence(torch.nn.Linear(2, 2), x, y)
    latent = InvariantMLP(image_shape=(1, 4, 4), num_classes=3, hidden=3, num_transforms=2, symmetry_prior="uniform")
    with pytest.raises(ValueError, match="fixed η"):
        annealed_readout_evidence(latent, x, y)
    for bad in (True, -0.1, float("nan"), "0.3"):
        with pytest.raises(ValueError, match="step_size"):
            annealed_readout_evidence(model, x, y, step_size=bad)
    with pytest.raises(ValueError, match="curvature"):
        annealed_readout_evidence(model, x, y, curvature=0.0)
    with pytest.raises(ValueError, match="chains"):
        annealed_readout_evidence(model, x, y, chains=1)
    with pytest.raises(ValueError, match="temperatures"):
        annealed_readout_evidence(model, x, y, temperatures=1)
    with pytest.raises(ValueError):
        annealed_readout_evidence(model, x, torch.full((8,), 3))  # a label outside [0, 3)
