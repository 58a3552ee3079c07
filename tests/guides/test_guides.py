"""Guides: every registered guide on a tiny Bayesian logistic regression, plus structured-guide checks."""

from __future__ import annotations

import math

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import Predictive, Trace_ELBO, TraceMeanField_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroSample
from torch.distributions import MultivariateNormal, kl_divergence
from torch.distributions.kl import _dispatch_kl

import pyro_invariance as pi
from pyro_invariance import guides
from pyro_invariance.distributions import MatrixNormal, RowwiseMultivariateNormal, _kl_matrix_normal_diag_normal
from pyro_invariance.registry import GUIDES, UnknownNameError

torch.set_num_threads(1)

C, H, N = 3, 4, 48
ALL = ["mean-field", "full-rank", "low-rank", "map", "matrix-normal", "block-cholesky", "symmetry-conditional"]
WITH_SCALE = ["mean-field", "full-rank", "low-rank", "matrix-normal", "block-cholesky", "symmetry-conditional"]
SHAPES = {"linear.prior_scale": (), "linear.weight": (C, H), "linear.bias": (C,)}


@pytest.fixture(autouse=True)
def _fresh():
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    yield
    pyro.clear_param_store()


class Linear(PyroModule):
    """y = W x + b with W ~ N(0, s²) (C, H) to_event(2), s ~ LogNormal(0, 1), b ~ N(0, 1) (C,)."""

    def __init__(self, out_features: int, in_features: int) -> None:
        super().__init__()
        shape = (out_features, in_features)
        self.prior_scale = PyroSample(dist.LogNormal(0.0, 1.0))
        # written so that a leading particle/sample batch dim of prior_scale broadcasts
        self.weight = PyroSample(
            lambda self: dist.Normal(torch.zeros(shape), self.prior_scale[..., None, None]).to_event(2)
        )
        self.bias = PyroSample(dist.Normal(0.0, 1.0).expand([out_features]).to_event(1))

    def forward(self, x):
        return x @ self.weight.mT + self.bias.unsqueeze(-2)


class TinyLogistic(PyroModule):
    """Catalogue conventions: model(x, y=None, num_data=None), minibatch plate "data"."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = Linear(C, H)  # site names get a prefix: "linear.weight", ...

    def forward(self, x, y=None, num_data=None):
        logits = self.linear(x)
        with pyro.plate("data", size=num_data or x.shape[0], subsample=torch.arange(x.shape[0])):
            return pyro.sample("obs", dist.Categorical(logits=logits), obs=y)


def data(n: int = N):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, H, generator=g)
    w = torch.randn(C, H, generator=g) * 2.0
    y = torch.distributions.Categorical(logits=x @ w.T).sample()
    return x, y


def fit(model, guide, steps: int, lr: float = 0.05, elbo=None, **kw) -> list[float]:
    """The training loop's pattern: torch Adam over guide.parameters() and differentiable_loss."""
    x, y = data()
    elbo = elbo or TraceMeanField_ELBO()
    guide(x, y, **kw)
    opt = torch.optim.Adam(guide.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = elbo.differentiable_loss(model, guide, x, y, **kw)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


# ---------------------------------------------------------------------------------------------
def test_registry_names():
    assert guides.names() == sorted(ALL)
    assert all(name in GUIDES for name in ALL)
    with pytest.raises(UnknownNameError, match="known guides|Known guides"):
        guides.get("matrix-normall", TinyLogistic())
    with pytest.raises(KeyError):
        guides.get("no-such-guide", TinyLogistic())


@pytest.mark.parametrize("name", ALL)
def test_guide_samples_all_latents_and_gives_finite_elbos(name):
    model = TinyLogistic()
    guide = guides.get(name, model)
    x, y = data()
    sample = guide(x, y, num_data=10 * N)
    assert {k: tuple(v.shape) for k, v in sample.items()} == SHAPES
    assert sample["linear.prior_scale"] > 0
    tr = poutine.trace(guide).get_trace(x, y, num_data=10 * N)
    assert "data" not in tr.nodes and "obs" not in tr.nodes  # plates/observations skipped
    vectorized = dict(num_particles=3, vectorize_particles=True, max_plate_nesting=1)
    for elbo in (Trace_ELBO(), TraceMeanField_ELBO(), Trace_ELBO(**vectorized), TraceMeanField_ELBO(**vectorized)):
        loss = elbo.loss(model, guide, x, y, num_data=10 * N)
        assert math.isfinite(loss)
    med = guide.median(x, y)
    assert {k: tuple(v.shape) for k, v in med.items()} == SHAPES
    if name != "map":
        qs = guide.quantiles([0.1, 0.5, 0.9], x, y)
        assert {k: tuple(v.shape) for k, v in qs.items()} == {k: (3,) + s for k, s in SHAPES.items()}
        assert (qs["linear.weight"][0] < qs["linear.weight"][2]).all()


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("parallel", [False, True])
def test_predictive(name, parallel):
    model = TinyLogistic()
    guide = guides.get(name, model)
    x, y = data()
    guide(x, y)
    pred = Predictive(model, guide=guide, num_samples=4, parallel=parallel)(x)
    assert pred["obs"].shape == (4, N)
    assert pred["linear.weight"].reshape(4, C, H).shape == (4, C, H)
    if name != "map":  # draws differ
        w = pred["linear.weight"].reshape(4, -1)
        assert (w[0] != w[1]).any()


@pytest.mark.parametrize("name", ALL)
def test_training_improves_elbo(name):
    model = TinyLogistic()
    guide = guides.get(name, model)
    losses = fit(model, guide, steps=80, num_data=N)
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert all(math.isfinite(v) for v in losses)
    assert last < first - 5.0, (first, last)


# ---------------------------------------------------------------------------------------------
# TraceMeanField_ELBO: analytic KLs, and agreement with Trace_ELBO
# ---------------------------------------------------------------------------------------------
class PriorOnly(PyroModule):
    """No data and priors that do not depend on other latents: the mean-field ELBO is Σ KL."""

    def forward(self, *args, **kwargs):
        pyro.sample("s", dist.LogNormal(0.3, 0.5))
        pyro.sample("w", dist.Normal(0.0, 0.5).expand([C, H]).to_event(2))
        pyro.sample("b", dist.Normal(torch.zeros(C), 2.0).to_event(1))


@pytest.mark.parametrize("name", ["mean-field", "matrix-normal", "block-cholesky"])
def test_trace_mean_field_uses_analytic_kls(name):
    model = PriorOnly()
    guide = guides.get(name, model, init_scale=0.3)
    guide()
    _randomise(guide)
    losses = []
    for seed in (0, 1):
        pyro.set_rng_seed(seed)
        losses.append(TraceMeanField_ELBO().loss(model, guide))
    assert losses[0] == pytest.approx(losses[1], abs=1e-6)  # no Monte Carlo left
    prior = poutine.trace(model).get_trace()
    with torch.no_grad():
        expected = sum(
            kl_divergence(guide.get_distribution(n), prior.nodes[n]["fn"]).sum().item() for n in ("s", "w", "b")
        )
    assert losses[0] == pytest.approx(expected, rel=1e-5)
    q_w = guide.get_distribution("w")
    if name == "matrix-normal":
        assert isinstance(q_w, MatrixNormal)
        assert _dispatch_kl(type(q_w), type(prior.nodes["w"]["fn"])) is _kl_matrix_normal_diag_normal
    if name == "block-cholesky":
        assert isinstance(q_w, RowwiseMultivariateNormal)


@pytest.mark.parametrize("name", ["full-rank", "low-rank"])
def test_trace_mean_field_agrees_with_trace_elbo_on_same_draw(name):
    """Packed guides get no analytic KL; with constrained sites (LogNormal scale) TraceMeanField
    must still equal Trace_ELBO draw for draw (needs the corrected KL(Delta ‖ ·) of the package's
    calls, :func:`pyro_invariance.pyro_scope`)."""
    model = TinyLogistic()
    guide = guides.get(name, model)
    x, y = data()
    guide(x, y)
    with pi.pyro_scope():
        pyro.set_rng_seed(5)
        trace_loss = Trace_ELBO().loss(model, guide, x, y)
        pyro.set_rng_seed(5)
        tmf_loss = TraceMeanField_ELBO().loss(model, guide, x, y)
    assert tmf_loss == pytest.approx(trace_loss, rel=1e-6)


def test_mean_field_has_no_auxiliary_sites_and_is_an_autonormal():
    model = TinyLogistic()
    guide = guides.get("mean-field", model)
    assert isinstance(guide, AutoNormal)
    x, y = data()
    tr = poutine.trace(guide).get_trace(x, y)
    names = [n for n, s in tr.nodes.items() if s["type"] == "sample"]
    assert names == list(SHAPES)  # one guide site per model site, same order
    assert isinstance(tr.nodes["linear.prior_scale"]["fn"], dist.TransformedDistribution)


def test_mean_field_constrained_site_elbo_unbiased():
    """E[TraceMeanField loss] = E[Trace_ELBO loss] with a LogNormal site (Pyro's AutoNormal is off by E[u])."""

    def model():
        s = pyro.sample("s", dist.LogNormal(0.0, 1.0))
        pyro.sample("obs", dist.Normal(0.0, s), obs=torch.tensor(0.3))

    guide = guides.get("mean-field", model, init_scale=0.5)
    guide()
    with torch.no_grad():
        guide.locs.s.fill_(0.7)
    kw = dict(num_particles=4000, vectorize_particles=True, max_plate_nesting=0)
    a = Trace_ELBO(**kw).loss(model, guide)
    b = TraceMeanField_ELBO(**kw).loss(model, guide)
    assert a == pytest.approx(b, abs=0.05)  # the AutoNormal bias would be 0.7


# ---------------------------------------------------------------------------------------------
# Structured guides
# ---------------------------------------------------------------------------------------------
def _randomise(guide, seed: int = 0):
    """Move every parameter away from its initial value (unconstrained space)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in guide.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))


def test_block_cholesky_log_q_matches_dense():
    model = TinyLogistic()
    guide = guides.get("block-cholesky", model, init_scale=1.0)
    x, y = data()
    guide(x, y)
    site = guide.structured.linear.weight
    with torch.no_grad():  # init: μ = 0, L_c = I
        torch.testing.assert_close(site.loc, torch.zeros(C, H))
        torch.testing.assert_close(site.cholesky_factor(), torch.eye(H).expand(C, H, H))
    _randomise(guide)
    tr = poutine.trace(guide).get_trace(x, y)
    node = tr.nodes["linear.weight"]
    q, w = node["fn"], node["value"]
    assert isinstance(q, RowwiseMultivariateNormal)
    L = site.cholesky_factor().detach().double()
    dense = MultivariateNormal(site.loc.detach().double().reshape(-1), scale_tril=torch.block_diag(*L))
    expected = dense.log_prob(w.detach().double().reshape(-1))
    assert q.log_prob(w).item() == pytest.approx(expected.item(), rel=1e-5)  # from the noise
    assert q.log_prob(w.clone()).item() == pytest.approx(expected.item(), rel=1e-5)  # by solves
    # Trace_ELBO scores the guide with exactly this log-density.
    tr.compute_log_prob()
    assert tr.nodes["linear.weight"]["log_prob_sum"].item() == pytest.approx(expected.item(), rel=1e-5)


def test_matrix_normal_guide_log_q_matches_dense_and_fixes_scale():
    model = TinyLogistic()
    guide = guides.get("matrix-normal", model, init_scale=0.5)
    x, y = data()
    guide(x, y)
    with torch.no_grad():
        q0 = guide.get_distribution("linear.weight")
        torch.testing.assert_close(q0.covariance_matrix(), 0.25 * torch.eye(C * H))
    _randomise(guide)
    tr = poutine.trace(guide).get_trace(x, y)
    q, w = tr.nodes["linear.weight"]["fn"], tr.nodes["linear.weight"]["value"]
    assert isinstance(q, MatrixNormal)
    U, V = q.row_covariance.detach().double(), q.col_covariance.detach().double()
    assert V[0, 0].item() == pytest.approx(1.0)  # the pinned element (scale ambiguity)
    assert U[0, 0].item() != pytest.approx(0.25)  # the row factor moved and carries the scale
    dense = MultivariateNormal(q.loc.detach().double().reshape(-1), covariance_matrix=torch.kron(U, V))
    expected = dense.log_prob(w.detach().double().reshape(-1)).item()
    assert q.log_prob(w).item() == pytest.approx(expected, rel=1e-5)


def test_matrix_normal_diagonal_factors():
    model = TinyLogistic()
    x, y = data()
    # threshold 3: the row factor (size 3) stays full, the column factor (size 4) is diagonal
    guide = guides.get("matrix-normal", model, diagonal_factors=3)
    guide(x, y)
    site = guide.structured.linear.weight
    assert not site.row_diagonal and site.col_diagonal
    q = guide.get_distribution("linear.weight")
    assert q.row_factor.shape == (C, C) and q.col_factor.shape == (H,)
    free = C * H + C * (C + 1) // 2 + (H - 1) + 2 + 2 * C
    assert guides.num_guide_parameters(guide) == free
    # by site name: both factors diagonal
    guide = guides.get("matrix-normal", model, diagonal_factors=["linear.weight"])
    guide(x, y)
    assert guide.get_distribution("linear.weight").row_factor.shape == (C,)
    # by callable
    guide = guides.get("matrix-normal", model, diagonal_factors=lambda name, which, size: which == "row")
    guide(x, y)
    q = guide.get_distribution("linear.weight")
    assert q.row_factor.shape == (C,) and q.col_factor.shape == (H, H)
    assert math.isfinite(TraceMeanField_ELBO().loss(model, guide, x, y))


def test_matrix_normal_freeze_row_factor():
    model = TinyLogistic()
    guide = guides.get("matrix-normal", model, freeze_row_factor=True, init_scale=0.7)
    fit(model, guide, steps=20)
    site = guide.structured.linear.weight
    torch.testing.assert_close(site.row_factor(), torch.full((C,), 0.7))  # unchanged, not a parameter
    assert all("row" not in n for n, _ in guide.named_parameters())
    assert site.col_scale.shape == (H,)  # no pinned element when the row factor is frozen
    free = C * H + H * (H + 1) // 2 + 2 + 2 * C
    assert guides.num_guide_parameters(guide) == free


def test_num_guide_parameters():
    model = TinyLogistic()
    x, y = data()
    D = 1 + C * H + C
    expected = {
        "mean-field": 2 * D,
        "full-rank": D * (D + 3) // 2,
        "map": D,
        "matrix-normal": C * H + C * (C + 1) // 2 + H * (H + 1) // 2 - 1 + 2 * (1 + C),
        "block-cholesky": C * H + C * H + C * H * (H - 1) // 2 + 2 * (1 + C),
        "low-rank": 2 * D + 2 * D,
    }
    for name, count in expected.items():
        kw = {"rank": 2} if name == "low-rank" else {}
        guide = guides.get(name, model, **kw)
        with pytest.raises(RuntimeError):
            guides.num_guide_parameters(guide)  # not built yet
        assert guides.num_guide_parameters(guide, x, y) == count, name
    full = guides.get("full-rank", model)
    assert guides.num_guide_parameters(full, x, y, effective=False) == D + D + D * D


@pytest.mark.parametrize("name", WITH_SCALE)
@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), "big"])
def test_invalid_init_scale(name, bad):
    with pytest.raises(ValueError):
        guides.get(name, TinyLogistic(), init_scale=bad)


def test_invalid_kwargs():
    model = TinyLogistic()
    for rank in (0, -2, 1.5):
        with pytest.raises(ValueError):
            guides.get("low-rank", model, rank=rank)
    with pytest.raises(ValueError):
        guides.get("matrix-normal", model, diagonal_factors=-1)
    with pytest.raises(ValueError):
        guides.get("matrix-normal", model, diagonal_factors=[1, 2])
    guide = guides.get("matrix-normal", model, diagonal_factors=["linear.bias"])  # not a matrix site
    with pytest.raises(ValueError, match="linear.weight"):
        guide(*data())
    with pytest.raises(TypeError):
        guides.get("map", model, init_scale=1.0)  # a point estimate has no scale
    with pytest.raises(TypeError):
        guides.get("block-cholesky", model, rank=3)


def test_init_scale_default_is_pyros():
    model = TinyLogistic()
    x, y = data()
    for name in ("mean-field", "block-cholesky", "matrix-normal"):
        guide = guides.get(name, model)
        guide(x, y)
        with torch.no_grad():
            torch.testing.assert_close(guide.get_distribution("linear.weight").variance, torch.full((C, H), 0.01))
            torch.testing.assert_close(guide.get_distribution("linear.bias").variance, torch.full((C,), 0.01))


@pytest.mark.parametrize("name", ["matrix-normal", "block-cholesky", "mean-field"])
def test_state_dict_round_trip(name):
    model = TinyLogistic()
    x, y = data()
    kw = {"diagonal_factors": 3, "freeze_row_factor": True} if name == "matrix-normal" else {}
    a = guides.get(name, model, init_scale=0.5, **kw)
    a(x, y)
    _randomise(a)
    b = guides.get(name, model, init_scale=0.5, **kw)
    b(x, y)  # build the parameters, then load
    b.load_state_dict(a.state_dict())
    for k, v in a.median().items():
        torch.testing.assert_close(b.median()[k], v)
    with torch.no_grad():
        torch.testing.assert_close(
            b.get_distribution("linear.weight").variance, a.get_distribution("linear.weight").variance
        )
