"""Tests of pyro_invariance.data.physics: systems defined by H, integration, splits, seeds, cache."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pyro_invariance.data import physics as P
from pyro_invariance.registry import DATASETS

torch.set_num_threads(1)


def test_vector_field_is_j_grad_h_for_sho() -> None:
    x = torch.tensor([[1.0, 2.0], [-0.5, 0.3]], dtype=torch.float64)
    v = P.sho().vector_field(x)
    # H = (q² + p²)/2: q̇ = p, ṗ = −q
    assert torch.allclose(v, torch.stack([x[:, 1], -x[:, 0]], 1))


def test_nbody_vector_field_matches_finite_differences() -> None:
    s = P.nbody(3)
    x = torch.randn(4, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    eps = 1e-6
    grad = torch.zeros_like(x)
    for i in range(12):
        e = torch.zeros(12, dtype=torch.float64)
        e[i] = eps
        grad[:, i] = (s.energy(x + e) - s.energy(x - e)) / (2 * eps)
    assert torch.allclose(s.vector_field(x), P.symplectic(grad), atol=1e-7)


def test_sho_trajectory_matches_analytic_solution() -> None:
    x0 = np.array([[1.0, 0.0], [0.3, -0.7]])
    traj = P.integrate(P.sho(), x0, dt=0.2, steps=10)
    t = 0.2 * np.arange(11)
    q = x0[:, :1] * np.cos(t) + x0[:, 1:] * np.sin(t)
    p = -x0[:, :1] * np.sin(t) + x0[:, 1:] * np.cos(t)
    assert traj.shape == (2, 11, 2) and traj.dtype == np.float64
    assert np.abs(traj[..., 0] - q).max() < 1e-8 and np.abs(traj[..., 1] - p).max() < 1e-8


def test_nbody_energy_and_momentum_conserved() -> None:
    s = P.nbody(3)
    rng = np.random.default_rng(1)
    x0 = np.concatenate([rng.standard_normal((3, 6)), 0.5 * rng.standard_normal((3, 6))], 1)
    traj = torch.tensor(P.integrate(s, x0, dt=1.0, steps=10))
    h = s.energy(traj)
    assert (h - h[:, :1]).abs().max() < 1e-7
    mom = traj[..., 6:].reshape(3, 11, 3, 2).sum(2)
    assert (mom - mom[:, :1]).abs().max() < 1e-7


def test_reference_splits_shapes_and_scales(tmp_path) -> None:
    d = P.make_dataset("sho", cache_dir=tmp_path, test_trajectories=50)
    assert d.x_train.shape == (28, 2) and d.y_train.shape == (28, 2)
    assert d.x_test.shape == (1000, 2) and d.x_wider.shape == (1000, 2) and d.x_moved.shape == (1000, 2)
    assert d.x_train.dtype == torch.float32
    # wider has q scale 3, moved has q shifted by +1; p scale 0.2 in all test splits
    q0 = {s: torch.tensor(d.trajectories[s][:, 0, 0]) for s in ("test", "wider", "moved")}
    assert q0["wider"].std() > 2 * q0["test"].std()
    assert abs(float(q0["moved"].mean()) - 1.0) < 0.4 and abs(float(q0["test"].mean())) < 0.4
    assert abs(float(torch.tensor(d.trajectories["test"][:, 0, 1]).std()) - 0.2) < 0.07
    # targets: next states; training targets carry noise of variance 1e-3, test targets none
    clean_y = torch.tensor(d.trajectories["train"][:, 1:].reshape(-1, 2), dtype=torch.float32)
    assert 0 < float(((d.y_train - clean_y) ** 2).mean()) < 5e-3
    assert torch.equal(d.y_test, torch.tensor(d.trajectories["test"][:, 1:].reshape(-1, 2), dtype=torch.float32))


def test_splits_use_independent_seeds(tmp_path) -> None:
    d = P.make_dataset("sho", cache_dir=False, train_trajectories=5, test_trajectories=5)
    firsts = [d.trajectories[s][:, 0] for s in P.SPLITS]
    # no split reuses another's normal draws (compare the standardised q draws)
    z = [(f[:, 0] - sh) / sc for f, sh, sc in zip(firsts, (0, 0, 0, 1), (1, 1, 3, 1))]
    for i in range(4):
        for j in range(i + 1, 4):
            assert not np.allclose(z[i], z[j])
    assert not np.allclose(
        d.trajectories["test"][:, 0],
        P.make_dataset("sho", seed=1, cache_dir=False, test_trajectories=5).trajectories["test"][:, 0],
    )


def test_cache_is_keyed_by_every_setting(tmp_path) -> None:
    a = P.make_dataset("sho", cache_dir=tmp_path, test_trajectories=5)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) == 4 and all(f.startswith("sho-") for f in files)
    b = P.make_dataset("sho", cache_dir=tmp_path, test_trajectories=5)  # cache hit: same files
    assert sorted(p.name for p in tmp_path.iterdir()) == files
    assert np.array_equal(a.trajectories["train"], b.trajectories["train"])
    P.make_dataset("sho", cache_dir=tmp_path, test_trajectories=5, dt=0.1)
    P.make_dataset("sho", cache_dir=tmp_path, test_trajectories=5, seed=3)
    P.make_dataset("oscillators", n=2, cache_dir=tmp_path, train_trajectories=3, train_steps=2, test_trajectories=5)
    assert len(list(tmp_path.iterdir())) == 16
    assert P.cache_key({"a": 1, "b": 2}) == P.cache_key({"b": 2, "a": 1}) != P.cache_key({"a": 1, "b": 3})


def test_registered_datasets() -> None:
    for name in ("sho", "oscillators", "oscillators-3", "nbody", "nbody-3", "kepler"):
        assert name in DATASETS
    d = DATASETS.get(
        "oscillators-3", train_trajectories=4, train_steps=3, test_trajectories=3, test_steps=2, cache_dir=False
    )
    assert d.x_train.shape == (12, 6) and d.x_test.shape == (6, 6) and d.dt == 0.2
    n = DATASETS.get("nbody-3", train_trajectories=2, train_steps=2, test_trajectories=2, test_steps=2, cache_dir=False)
    assert n.x_train.shape == (4, 12) and n.dt == 1.0


def test_custom_system_needs_only_h() -> None:
    quartic = P.HamiltonianSystem("quartic", 1, lambda x: x[..., 1] ** 2 / 2 + x[..., 0] ** 4 / 4)
    d = P.make_dataset(quartic, cache_dir=False, train_trajectories=3, train_steps=3, test_trajectories=2, test_steps=2)
    h = quartic.energy(torch.tensor(d.trajectories["train"]))
    assert (h - h[:, :1]).abs().max() < 1e-8


def test_bad_input_gives_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown Hamiltonian system"):
        P.make_dataset("pendulum")
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 2\)"):
        P.sho().energy(torch.zeros(3, 4))
    with pytest.raises(ValueError, match=r"shape \(T, 6\)"):
        P.integrate(P.oscillators(3), np.zeros((2, 4)), 0.1, 2)
    nan_h = P.HamiltonianSystem("bad", 1, lambda x: x[..., 0] ** 2 * math.nan)
    with pytest.raises(ValueError, match="non-finite"):
        P.integrate(nan_h, np.ones((2, 2)), 0.1, 2)
    blowup = P.HamiltonianSystem("blowup", 1, lambda x: x[..., 1] ** 2 / 2 - x[..., 0] ** 4)
    with pytest.raises(ValueError, match="non-finite"):
        P.integrate(blowup, np.array([[3.0, 3.0]]), 1.0, 5)
    with pytest.raises(ValueError, match="dt"):
        P.make_dataset("sho", dt=-1.0, cache_dir=False)
    with pytest.raises(ValueError, match="unknown split"):
        P.make_dataset("sho", cache_dir=False, test_trajectories=2).split("validation")
