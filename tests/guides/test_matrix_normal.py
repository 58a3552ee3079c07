"""MatrixNormal / RowwiseMultivariateNormal against dense MultivariateNormal references."""

from __future__ import annotations

import pyro.distributions as dist
import pytest
import torch
from pyro.distributions.kl import kl_divergence as pyro_kl_divergence
from pyro.distributions.torch_distribution import ExpandedDistribution
from torch.distributions import MultivariateNormal, kl_divergence
from torch.distributions.kl import _dispatch_kl

from pyro_invariance.distributions import (
    MatrixNormal,
    RowwiseMultivariateNormal,
    _kl_matrix_normal_diag_normal,
    _kl_rowwise_diag_normal,
)

torch.set_num_threads(1)
F64 = torch.float64


def rand_tril(*shape: int, gen: torch.Generator) -> torch.Tensor:
    """Random well-conditioned lower-triangular factor(s) with positive diagonal, (..., n, n)."""
    *batch, n = shape
    off = 0.4 * torch.randn(*batch, n, n, generator=gen, dtype=F64).tril(-1)
    return off + torch.diag_embed(0.5 + torch.rand(*batch, n, generator=gen, dtype=F64))


def rand_pos(*shape: int, gen: torch.Generator) -> torch.Tensor:
    return 0.5 + torch.rand(*shape, generator=gen, dtype=F64)


def make_mn(kind: str, batch: tuple = (), r: int = 3, c: int = 4, seed: int = 0) -> MatrixNormal:
    """kind: 'full' (both triangular), 'rowdiag', 'coldiag', 'diag' (both diagonal)."""
    g = torch.Generator().manual_seed(seed)
    loc = torch.randn(*batch, r, c, generator=g, dtype=F64)
    kw = {}
    if kind in ("rowdiag", "diag"):
        kw["scale_row"] = rand_pos(*batch, r, gen=g)
    else:
        kw["scale_tril_row"] = rand_tril(*batch, r, gen=g)
    if kind in ("coldiag", "diag"):
        kw["scale_col"] = rand_pos(c, gen=g)  # unbatched: exercises broadcasting
    else:
        kw["scale_tril_col"] = rand_tril(c, gen=g)
    return MatrixNormal(loc, **kw)


def dense(d: MatrixNormal) -> MultivariateNormal:
    """The same law on vec_r(W) = W.reshape(-1): N(vec M, kron(U, V)), built independently."""
    r, c = d.event_shape
    U = d.row_covariance.expand(d.batch_shape + (r, r)).reshape(-1, r, r)
    V = d.col_covariance.expand(d.batch_shape + (c, c)).reshape(-1, c, c)
    cov = torch.stack([torch.kron(u, v) for u, v in zip(U, V)]).reshape(d.batch_shape + (r * c, r * c))
    return MultivariateNormal(d.mean.reshape(d.batch_shape + (-1,)), covariance_matrix=cov)


KINDS = ["full", "rowdiag", "coldiag", "diag"]
BATCHES = [(), (2,)]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("batch", BATCHES)
def test_log_prob_entropy_moments_match_dense(kind, batch):
    d = make_mn(kind, batch)
    ref = dense(d)
    assert d.batch_shape == batch and d.event_shape == (3, 4)
    x = torch.randn((5,) + batch + (3, 4), dtype=F64)
    torch.testing.assert_close(d.log_prob(x), ref.log_prob(x.reshape(5, *batch, 12)))
    torch.testing.assert_close(d.entropy(), ref.entropy())
    torch.testing.assert_close(d.mean.reshape(*batch, 12), ref.mean)
    torch.testing.assert_close(d.variance.reshape(*batch, 12), ref.variance)


@pytest.mark.parametrize("kind", KINDS)
def test_log_prob_of_own_sample_uses_noise(kind):
    d = make_mn(kind, (2,))
    w = d.rsample((3,))
    fresh = w.clone()  # not the cached sample: goes through the triangular solves
    torch.testing.assert_close(d.log_prob(w), d.log_prob(fresh))
    torch.testing.assert_close(d.log_prob(w), dense(d).log_prob(w.reshape(3, 2, 12)))


def test_own_sample_log_prob_exact_when_ill_conditioned():
    # A nearly singular factor: the noise path is exact, the solve path can be far off.
    r, c = 6, 5
    row = torch.eye(r, dtype=torch.float32) + torch.ones(r, r).tril(-1) * 30.0
    row = row * torch.logspace(0, -6, r).unsqueeze(-1)
    d = MatrixNormal(torch.zeros(r, c), scale_tril_row=row, scale_tril_col=torch.eye(c))
    torch.manual_seed(0)
    w = d.rsample()
    eps = d._noise_cache[1]
    expected = -0.5 * eps.pow(2).sum() - d._normalizer()
    assert d.log_prob(w).item() == pytest.approx(expected.item(), rel=1e-6)


def test_sample_covariance_matches_kron():
    torch.manual_seed(0)
    d = make_mn("full", (), r=3, c=4, seed=1)
    n = 200_000
    w = d.rsample((n,)).reshape(n, 12)
    cov = d.covariance_matrix()
    torch.testing.assert_close(cov, torch.kron(d.row_covariance, d.col_covariance))
    emp = torch.cov(w.T)
    # Monte-Carlo standard error of a sample covariance entry: sqrt((Σ_ii Σ_jj + Σ_ij²) / n).
    se = ((cov.diagonal()[:, None] * cov.diagonal()[None, :] + cov**2) / n).sqrt()
    assert ((emp - cov).abs() / se).max() < 5.0
    mean_se = (cov.diagonal() / n).sqrt()
    assert ((w.mean(0) - d.loc.reshape(-1)).abs() / mean_se).max() < 5.0


def _diag_normal_prior(kind: str, batch: tuple, r: int = 3, c: int = 4):
    g = torch.Generator().manual_seed(7)
    if kind == "isotropic":  # scalar scale, as in Normal(0., s).expand([r, c]).to_event(2)
        return (
            dist.Normal(torch.tensor(0.0, dtype=F64), torch.tensor(0.7, dtype=F64)).expand(batch + (r, c)).to_event(2)
        )
    if kind == "diagonal":
        loc = torch.randn(*batch, r, c, generator=g, dtype=F64)
        return dist.Normal(loc, rand_pos(*batch, r, c, gen=g)).to_event(2)
    if kind == "per-column":  # scale shape (c,), broadcast over rows
        base = dist.Normal(torch.zeros(c, dtype=F64), rand_pos(c, gen=g))
        return ExpandedDistribution(base, batch + (r, c)).to_event(2)
    if kind == "nested":
        return dist.Normal(torch.zeros(*batch, r, c, dtype=F64), rand_pos(*batch, r, c, gen=g)).to_event(1).to_event(1)
    raise AssertionError(kind)


def _dense_diag(q) -> MultivariateNormal:
    loc = q.mean.reshape(q.batch_shape + (-1,))
    std = q.variance.sqrt().reshape(q.batch_shape + (-1,))
    return MultivariateNormal(loc, scale_tril=torch.diag_embed(std))


@pytest.mark.parametrize("prior", ["isotropic", "diagonal", "per-column", "nested"])
@pytest.mark.parametrize("kind", ["full", "diag"])
@pytest.mark.parametrize("batch", BATCHES)
def test_kl_to_diagonal_normal_matches_dense(prior, kind, batch):
    p = make_mn(kind, batch)
    q = _diag_normal_prior(prior, batch)
    kl = kl_divergence(p, q)
    assert kl.shape == batch
    torch.testing.assert_close(kl, kl_divergence(dense(p), _dense_diag(q)))


def test_pyro_kl_dispatches_to_analytic_kl():
    """TraceMeanField_ELBO calls torch's kl_divergence, which pyro.distributions.kl re-exports."""
    import pyro.infer.trace_mean_field_elbo as tmf

    assert tmf.kl_divergence is pyro_kl_divergence is kl_divergence
    q = dist.Normal(0.0, 0.5).expand([3, 4]).to_event(2)  # pyro Independent of an expanded pyro Normal
    assert type(q) is dist.Independent and isinstance(q.base_dist, dist.Normal)
    assert _dispatch_kl(MatrixNormal, type(q)) is _kl_matrix_normal_diag_normal
    assert _dispatch_kl(RowwiseMultivariateNormal, type(q)) is _kl_rowwise_diag_normal
    p = make_mn("full").expand(torch.Size())
    p = MatrixNormal(p.loc.float(), p.scale_tril_row.float(), p.scale_tril_col.float())
    kl = pyro_kl_divergence(p, q)
    ref = kl_divergence(dense(p), _dense_diag(q))
    torch.testing.assert_close(kl, ref)


def test_kl_to_non_normal_is_not_implemented():
    p = make_mn("full")
    q = dist.Laplace(torch.zeros(3, 4, dtype=F64), 1.0).to_event(2)
    with pytest.raises(NotImplementedError):
        kl_divergence(p, q)


@pytest.mark.parametrize("kinds", [("full", "full"), ("diag", "full"), ("full", "rowdiag"), ("coldiag", "diag")])
@pytest.mark.parametrize("batch", BATCHES)
def test_kl_matrix_normal_matrix_normal_matches_dense(kinds, batch):
    p, q = make_mn(kinds[0], batch, seed=1), make_mn(kinds[1], batch, seed=2)
    torch.testing.assert_close(kl_divergence(p, q), kl_divergence(dense(p), dense(q)))
    assert kl_divergence(p, p).abs().max() < 1e-10


def test_rsample_is_differentiable():
    g = torch.Generator().manual_seed(0)
    loc = torch.randn(3, 4, dtype=F64, requires_grad=True)
    row = rand_tril(3, gen=g).requires_grad_()
    col = rand_pos(4, gen=g).requires_grad_()
    d = MatrixNormal(loc, scale_tril_row=row, scale_col=col)
    w = d.rsample((2,))
    loss = (w**2).sum() - d.log_prob(w).sum()
    loss.backward()
    for t in (loc, row, col):
        assert t.grad is not None and torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0


def test_expand():
    d = make_mn("full", (2,))
    e = d.expand((5, 2))
    assert e.batch_shape == (5, 2) and e.rsample().shape == (5, 2, 3, 4)
    x = torch.randn(5, 2, 3, 4, dtype=F64)
    torch.testing.assert_close(e.log_prob(x), d.log_prob(x))
    torch.testing.assert_close(e.entropy(), d.entropy().expand(5, 2))


def test_validation_errors():
    z, eye3, eye4 = torch.zeros(3, 4), torch.eye(3), torch.eye(4)
    with pytest.raises(ValueError):
        MatrixNormal(torch.zeros(4), eye3, eye4)  # loc not a matrix
    with pytest.raises(ValueError):
        MatrixNormal(z, torch.eye(4), eye4)  # row factor must be 3x3
    with pytest.raises(ValueError):
        MatrixNormal(z, eye3, torch.eye(3))  # column factor must be 4x4
    with pytest.raises(ValueError):
        MatrixNormal(z, eye3, scale_col=torch.ones(3))  # diagonal column factor must have 4 entries
    with pytest.raises(ValueError):
        MatrixNormal(z, eye3, eye4, scale_row=torch.ones(3))  # both forms of the row factor
    with pytest.raises(ValueError):
        MatrixNormal(z, None, eye4)  # no row factor
    with pytest.raises(ValueError):
        MatrixNormal(torch.zeros(2, 3, 4), torch.eye(3).expand(5, 3, 3), eye4)  # batch 2 vs 5
    with pytest.raises(ValueError):
        MatrixNormal(z, torch.ones(3, 3), eye4, validate_args=True)  # not lower triangular
    with pytest.raises(ValueError):
        MatrixNormal(z, -eye3, eye4, validate_args=True)  # negative diagonal
    with pytest.raises(ValueError):
        MatrixNormal(z, eye3, eye4, validate_args=True).log_prob(torch.zeros(4, 3))  # wrong value shape
    with pytest.raises(ValueError):
        RowwiseMultivariateNormal(z, torch.eye(3).expand(3, 3, 3))  # blocks must be 4x4
    with pytest.raises(ValueError):
        RowwiseMultivariateNormal(z, torch.eye(4).expand(2, 4, 4))  # 2 blocks for 3 rows


# ---------------------------------------------------------------------------------------------
# RowwiseMultivariateNormal (the block-Cholesky guide's distribution)
# ---------------------------------------------------------------------------------------------
def make_rowwise(batch: tuple = (), C: int = 3, H: int = 4, seed: int = 0) -> RowwiseMultivariateNormal:
    g = torch.Generator().manual_seed(seed)
    return RowwiseMultivariateNormal(torch.randn(*batch, C, H, generator=g, dtype=F64), rand_tril(*batch, C, H, gen=g))


def dense_rowwise(d: RowwiseMultivariateNormal) -> MultivariateNormal:
    covs = d.covariance_matrix.reshape(-1, *d.covariance_matrix.shape[-3:])
    cov = torch.stack([torch.block_diag(*blocks) for blocks in covs]).reshape(
        d.batch_shape + (d.event_shape.numel(),) * 2
    )
    return MultivariateNormal(d.mean.reshape(d.batch_shape + (-1,)), covariance_matrix=cov)


@pytest.mark.parametrize("batch", BATCHES)
def test_rowwise_matches_dense(batch):
    d = make_rowwise(batch)
    ref = dense_rowwise(d)
    x = torch.randn((5,) + batch + (3, 4), dtype=F64)
    torch.testing.assert_close(d.log_prob(x), ref.log_prob(x.reshape(5, *batch, 12)))
    w = d.rsample((2,))
    torch.testing.assert_close(d.log_prob(w), ref.log_prob(w.reshape(2, *batch, 12)))
    torch.testing.assert_close(d.entropy(), ref.entropy())
    torch.testing.assert_close(d.variance.reshape(*batch, 12), ref.variance)
    for prior in ("isotropic", "diagonal", "per-column"):
        q = _diag_normal_prior(prior, batch)
        torch.testing.assert_close(kl_divergence(d, q), kl_divergence(ref, _dense_diag(q)))
    other = make_rowwise(batch, seed=3)
    torch.testing.assert_close(kl_divergence(d, other), kl_divergence(ref, dense_rowwise(other)))
    e = d.expand((4,) + batch)
    assert e.rsample().shape == (4,) + batch + (3, 4)


def test_rowwise_sample_covariance():
    torch.manual_seed(1)
    d = make_rowwise((), C=2, H=3)
    n = 100_000
    w = d.rsample((n,)).reshape(n, 6)
    cov = dense_rowwise(d).covariance_matrix
    se = ((cov.diagonal()[:, None] * cov.diagonal()[None, :] + cov**2) / n).sqrt()
    assert ((torch.cov(w.T) - cov).abs() / se).max() < 5.0


@pytest.mark.plain_pyro
def test_delta_kl_keeps_log_density_inside_the_scope_only():
    """Corrected KL(Delta ‖ q) = log_density − log q(v) (Pyro 1.9 dropped log_density) inside
    ``corrected_delta_kl`` (nested too); Pyro's own rule before, between and after."""
    from pyro_invariance.distributions import corrected_delta_kl

    v, ld = torch.tensor(0.3), torch.tensor(-1.25)
    q = dist.Normal(0.0, 2.0)
    pyro_rule = -q.log_prob(v)
    torch.testing.assert_close(pyro_kl_divergence(dist.Delta(v, log_density=ld), q), pyro_rule)
    with corrected_delta_kl():
        torch.testing.assert_close(pyro_kl_divergence(dist.Delta(v, log_density=ld), q), ld - q.log_prob(v))
        with corrected_delta_kl():
            torch.testing.assert_close(pyro_kl_divergence(dist.Delta(v, log_density=ld), q), ld - q.log_prob(v))
        torch.testing.assert_close(pyro_kl_divergence(dist.Delta(v, log_density=ld), q), ld - q.log_prob(v))
    torch.testing.assert_close(pyro_kl_divergence(dist.Delta(v, log_density=ld), q), pyro_rule)
