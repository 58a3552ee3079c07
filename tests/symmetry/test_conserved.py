"""Tests of pyro_invariance.symmetry.conserved: generators, flows, oracles and the SVD analysis."""

from __future__ import annotations

import math

import pytest
import torch

from pyro_invariance.data import physics as P
from pyro_invariance.symmetry import conserved as C

torch.set_num_threads(1)
DT = torch.float64


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_quadratic_is_conserved_along_its_own_flow() -> None:
    m = 6
    w = torch.randn(m, m, dtype=DT, generator=_gen(0))
    a, b = w + w.T, torch.randn(m, dtype=DT, generator=_gen(1))
    g = C.generator(a, b)
    x = torch.randn(10, m, dtype=DT, generator=_gen(2))
    for tau in (0.1, 0.7, -1.3):
        xt = C.flow(x, g, tau)
        assert torch.allclose(C.quadratic_value(xt, a, b), C.quadratic_value(x, a, b), rtol=1e-9, atol=1e-9)


def test_flow_matches_ode_of_j_grad_c() -> None:
    # d/dτ Φ^τ(x) at τ = 0 equals J∇C(x) = J(Ax + b)
    m = 4
    w = torch.randn(m, m, dtype=DT, generator=_gen(3))
    a, b = w + w.T, torch.randn(m, dtype=DT, generator=_gen(4))
    g = C.generator(a, b)
    x = torch.randn(5, m, dtype=DT, generator=_gen(5))
    eps = 1e-6
    fd = (C.flow(x, g, eps) - C.flow(x, g, -eps)) / (2 * eps)
    assert torch.allclose(fd, (x @ a + b) @ C.canonical_j(m, DT).T, atol=1e-7)
    a2, b2 = C.quadratic_from_generator(g)
    assert torch.allclose(a2, a) and torch.allclose(b2, b)


@pytest.mark.parametrize(
    "oracle,system",
    [("so2", P.sho()), ("un", P.oscillators(3)), ("se2", P.nbody(3))],
)
def test_oracle_generators_leave_true_h_invariant(oracle: str, system: P.HamiltonianSystem) -> None:
    g = C.oracle_generators(oracle, system.state_dim, DT)
    x = torch.randn(20, system.state_dim, dtype=DT, generator=_gen(6))
    h = system.energy(x)
    for k in range(g.shape[0]):
        for tau in (0.3, -2.1):
            assert torch.allclose(system.energy(C.flow(x, g[k], tau)), h, atol=1e-10)
    # random combinations (one exponential per sample) too
    t = C.flow_matrices(g, C.sample_weights(7, g.shape[0], "cube", _gen(7), DT))
    assert torch.allclose(system.energy(C.apply_flow(x, t)), h.expand(7, -1), atol=1e-10)


def test_non_symmetry_changes_h() -> None:
    # a translation of q is no symmetry of the SHO: the test above can fail
    g = C.generator(torch.zeros(2, 2, dtype=DT), torch.tensor([0.0, 1.0], dtype=DT))
    x = torch.randn(5, 2, dtype=DT, generator=_gen(8))
    assert (P.sho().energy(C.flow(x, g, 0.5)) - P.sho().energy(x)).abs().max() > 1e-2


def test_un_oracle_singular_values() -> None:
    a = C.analyse_generators(C.oracle_generators("un", 6, DT))
    expected = torch.tensor([math.sqrt(8)] * 3 + [2.0] * 6, dtype=DT)
    assert torch.allclose(a.singular_values, expected, atol=1e-10)
    assert a.num_significant == 9
    assert C.oracle_generators("se2", 12).shape == (3, 13, 13)
    assert C.analyse_generators(C.oracle_generators("se2", 12, DT)).num_significant == 3


def test_analysis_recovers_span_of_noisy_mixtures() -> None:
    oracle = C.oracle_generators("un", 4, DT)  # 4 generators
    mix = torch.randn(10, 4, dtype=DT, generator=_gen(9))
    learned = torch.einsum("kj,jab->kab", mix, oracle) + 1e-3 * torch.randn(10, 5, 5, dtype=DT, generator=_gen(10))
    a = C.analyse_generators(learned, oracle)
    assert a.num_significant == 4
    assert a.parallelness[:4].min() > 0.99 and a.parallelness[4:].max() < 0.5
    assert a.principal_cosines.min() > 0.99
    assert a.principal_angles_deg().max() < 5
    # an unrelated set is not parallel
    other = torch.randn(3, 5, 5, dtype=DT, generator=_gen(11))
    assert C.analyse_generators(other, oracle).principal_cosines.min() < 0.9


def test_ball_and_cube_weights() -> None:
    w = C.sample_weights(2000, 3, "ball", _gen(12))
    assert w.norm(dim=1).max() <= 1 and w.shape == (2000, 3)
    c = C.sample_weights(2000, 3, "cube", _gen(13))
    assert c.abs().max() <= 1 and c.norm(dim=1).max() > 1
    g = C.sample_weights(4, 1, "grid")
    assert torch.allclose(g.squeeze(1), torch.tensor([-1.0, -0.5, 0.0, 0.5]))


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="unknown oracle"):
        C.oracle_generators("so3", 6)
    with pytest.raises(ValueError, match="state dimension 2"):
        C.oracle_generators("so2", 4)
    with pytest.raises(ValueError, match="4n"):
        C.oracle_generators("se2", 6)
    with pytest.raises(ValueError, match="even"):
        C.canonical_j(3)
    with pytest.raises(ValueError, match="last dimension"):
        C.quadratic_value(torch.zeros(3), torch.eye(2), torch.zeros(2))
    with pytest.raises(ValueError, match="flow matrices"):
        C.apply_flow(torch.zeros(2, 4), torch.eye(3))
    with pytest.raises(ValueError, match="unknown sampling"):
        C.sample_weights(3, 1, "sphere")
