"""Tests of the Kepler problem in pyro_invariance.data.physics: system, bound-orbit splits,
conserved quantities (H, L, Runge–Lenz A), registry entry, and unchanged cache keys of the others."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pytest
import torch

from pyro_invariance import DATASETS
from pyro_invariance.data import load_dataset
from pyro_invariance.data import physics as P

torch.set_num_threads(1)

SMALL = {"cache_dir": False, "train_trajectories": 6, "train_steps": 8, "test_trajectories": 6, "test_steps": 8}
QUANTITIES = ("H", "L", "A_x", "A_y")


def _in_arc(omega: torch.Tensor, lo: float, hi: float, tol: float = 1e-7) -> bool:
    """Every angle in the arc [lo, hi] (mod 2π), up to ``tol``."""
    return bool((torch.remainder(omega - lo + tol, 2 * math.pi) <= hi - lo + 2 * tol).all())


def _initial_elements(spec: P.KeplerSplitSpec, seed: int = 0) -> dict[str, torch.Tensor]:
    x0 = spec.initial_states(np.random.default_rng(seed), P.kepler())
    assert x0.shape == (spec.trajectories, 4)
    return P.kepler_elements(torch.tensor(x0))


# --------------------------------------------------------------------------------------- system
def test_kepler_system_and_conserved_quantities_formulas() -> None:
    system = P.get_system("kepler")
    assert system.state_dim == 4 and "kepler" in P.SYSTEMS
    x = torch.tensor([[1.0, 0.0, 0.0, 1.0], [0.0, 2.0, -0.5, 0.0]], dtype=torch.float64)
    c = P.kepler_conserved(x)
    assert set(c) == set(QUANTITIES) and all(v.shape == (2,) for v in c.values())
    # circular orbit of radius 1: H = 1/2 − 1 = −1/2, L = 1, A = 0
    torch.testing.assert_close(
        torch.stack([c[k][0] for k in QUANTITIES]), torch.tensor([-0.5, 1.0, 0.0, 0.0], dtype=torch.float64)
    )
    torch.testing.assert_close(system.energy(x), c["H"])
    # L = q_x p_y − q_y p_x = 0·0 − 2·(−0.5) = 1; A = (p_y L − q_x/r, −p_x L − q_y/r) = (0, 0.5 − 1)
    torch.testing.assert_close(
        torch.stack([c[k][1] for k in QUANTITIES]), torch.tensor([0.125 - 0.5, 1.0, 0.0, -0.5], dtype=torch.float64)
    )
    # each quantity Poisson-commutes with H: ∇C · J∇H = 0 at random bound-ish states
    xs = torch.tensor(P.KeplerSplitSpec(32, 1, e_range=(0.0, 0.6)).initial_states(np.random.default_rng(1), system))
    field = system.vector_field(xs)
    for k in QUANTITIES:
        xg = xs.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(P.kepler_conserved(xg)[k].sum(), xg)
        assert float((grad * field).sum(-1).abs().max()) < 1e-12, k
    assert P.kepler_conserved(torch.zeros(3, 5, 4) + 1.0)["A_y"].shape == (3, 5)


def test_initial_states_round_trip_to_orbital_elements() -> None:
    a = np.array([0.8, 1.0, 1.5, 2.5, 3.0, 1.2])
    e = np.array([0.0, 0.3, 0.5, 0.8, 0.95, 0.1])
    omega = np.array([0.0, 1.0, 3.0, 4.0, 6.0, 2.0])
    mean_anomaly = np.array([0.0, 2.0, 3.1, 6.0, 0.05, -1.0])
    x = P.kepler_initial_states(a, e, omega, mean_anomaly)
    assert x.shape == (6, 4)
    el = P.kepler_elements(torch.tensor(x))
    np.testing.assert_allclose(el["a"].numpy(), a, rtol=1e-12)
    np.testing.assert_allclose(el["e"].numpy(), e, atol=1e-12)
    np.testing.assert_allclose(el["omega"].numpy()[1:], omega[1:], atol=1e-10)  # ω of a circle: undefined
    c = P.kepler_conserved(torch.tensor(x))
    np.testing.assert_allclose(c["L"].numpy(), np.sqrt(a * (1 - e**2)), rtol=1e-12)  # counter-clockwise
    big_e = P.eccentric_anomaly(mean_anomaly, e)
    np.testing.assert_allclose(big_e - e * np.sin(big_e), np.mod(mean_anomaly, 2 * np.pi), atol=1e-13)
    np.testing.assert_allclose(np.linalg.norm(x[:, :2], axis=1), a * (1 - e * np.cos(big_e)), rtol=1e-12)


# --------------------------------------------------------------------------------------- splits
def test_reference_splits_sample_the_requested_orbits() -> None:
    specs = P.reference_splits("kepler")
    assert all(isinstance(s, P.KeplerSplitSpec) for s in specs.values())
    assert (specs["train"].trajectories, specs["train"].steps, specs["train"].noise_var) == (50, 20, 1e-3)
    assert (specs["test"].trajectories, specs["test"].steps, specs["test"].noise_var) == (50, 20, 0.0)
    ranges = {
        "train": ((0.8, 1.5), (0.0, 0.5), (0.0, math.pi)),
        "test": ((0.8, 1.5), (0.0, 0.5), (0.0, math.pi)),
        "wider": ((0.8, 2.5), (0.0, 0.8), (0.0, math.pi)),
        "moved": ((0.8, 1.5), (0.0, 0.5), (math.pi, 2 * math.pi)),
    }
    for split, ((a_lo, a_hi), (e_lo, e_hi), (w_lo, w_hi)) in ranges.items():
        spec = dataclasses.replace(specs[split], trajectories=500)
        spec.validate(split)
        el = _initial_elements(spec, seed=len(split))
        a, e, w = el["a"], el["e"], el["omega"]
        assert a.min() >= a_lo - 1e-12 and a.max() <= a_hi + 1e-12, split
        assert e.min() >= e_lo - 1e-12 and e.max() <= e_hi + 1e-12, split
        assert (a * (1 - e)).min() >= 0.3 - 1e-12, split  # perihelion: no near-collisions
        assert w.min() >= w_lo - 1e-9 and w.max() < w_hi + 1e-9, split
        # the ranges are covered, not just respected
        assert a.min() < a_lo + 0.1 and a.max() > a_hi - 0.1 and e.max() > min(e_hi, 0.7) - 0.1, split
        assert w.min() < w_lo + 0.1 and w.max() > w_hi - 0.1, split
    # wider: e is clipped to keep a(1 − e) ≥ 0.3, so small orbits are less eccentric
    el = _initial_elements(dataclasses.replace(specs["wider"], trajectories=500))
    assert float(el["e"][el["a"] < 0.9].max()) <= 1 - 0.3 / 0.9 + 1e-12 < 0.7 < float(el["e"].max())


def test_generated_trajectories_conserve_h_l_and_runge_lenz() -> None:
    d = P.make_dataset("kepler", seed=3, **SMALL)
    assert d.name == "kepler" and d.dt == 0.5 and d.state_dim == 4
    for split, traj in d.trajectories.items():
        assert traj.shape == (6, 9, 4)
        c = P.kepler_conserved(torch.tensor(traj))
        for k in QUANTITIES:
            v = c[k]
            scale = v[:, 0].abs().max()
            assert float((v - v[:, :1]).abs().max() / scale) < 1e-6, (split, k)
            assert float(v[:, 0].std()) > 1e-2, (split, k)  # differs between orbits: not trivially constant
        assert float((c["H"] - c["H"][:, :1]).abs().max()) < 1e-8, split  # energy drift
        # ω is constant along each orbit and lies in the split's arc
        w = P.kepler_elements(torch.tensor(traj))["omega"]
        lo, hi = (math.pi, 2 * math.pi) if split == "moved" else (0.0, math.pi)
        assert _in_arc(w, lo, hi), split
    # the pairs are (x_t, x_{t+dt}) of the trajectories; only the train targets are noisy
    x, y = d.split("test")
    torch.testing.assert_close(x, torch.tensor(d.trajectories["test"][:, :-1].reshape(-1, 4), dtype=torch.float32))
    torch.testing.assert_close(y, torch.tensor(d.trajectories["test"][:, 1:].reshape(-1, 4), dtype=torch.float32))
    clean = torch.tensor(d.trajectories["train"][:, 1:].reshape(-1, 4), dtype=torch.float32)
    assert 0 < float((d.y_train - clean).var()) < 3e-3 and d.noise_var == 1e-3


def test_train_and_moved_orientations_do_not_overlap() -> None:
    d = P.make_dataset("kepler", seed=0, **SMALL)
    train = P.kepler_elements(d.x_train.double())["omega"]
    moved = P.kepler_elements(d.x_moved.double())["omega"]
    tol = 1e-4  # float32 states
    assert _in_arc(train, 0.0, math.pi, tol) and _in_arc(moved, math.pi, 2 * math.pi, tol)


# --------------------------------------------------------------------------------------- registry, cache
def test_registered_kepler_dataset(tmp_path, monkeypatch) -> None:
    assert "kepler" in DATASETS
    assert DATASETS.entry("kepler").summary == "2-d Kepler problem, bound orbits; moved split = unseen orientations"
    d = DATASETS.get("kepler", data_dir=None, download=False, train_size=10, test_size=5, **SMALL)
    assert isinstance(d, P.PhysicsDataset)
    assert d.x_train.shape == (10, 4) and d.y_train.shape == (10, 4)
    for split in ("test", "wider", "moved"):
        x, y = d.split(split)
        assert x.shape == y.shape == (5, 4) and x.dtype == torch.float32
    monkeypatch.setenv("PYRO_INVARIANCE_CACHE", str(tmp_path))
    small = {k: v for k, v in SMALL.items() if k != "cache_dir"}
    a = load_dataset("kepler", data_dir=None, **small)
    files = sorted(p.name for p in (tmp_path / "physics").iterdir())
    assert len(files) == 4 and all(f.startswith("kepler-") for f in files)
    with np.load(a.cache_files["wider"]) as f:
        settings = json.loads(str(f["settings"]))
    assert settings["initial_states"] == "kepler-orbits" and settings["spec"]["a_range"] == [0.8, 2.5]
    assert settings["rtol"] == settings["atol"] == 1e-12 and settings["dt"] == 0.5
    b = load_dataset("kepler", data_dir=None, **small)  # cache hit
    assert a.cache_files == b.cache_files and np.array_equal(a.trajectories["moved"], b.trajectories["moved"])


def test_bad_kepler_settings_give_one_line_errors() -> None:
    bad = [
        (dict(a_range=(1.5, 0.8)), "a_range"),
        (dict(a_range=(0.0, 1.0)), "min_perihelion"),
        (dict(a_range=(0.2, 1.0)), "min_perihelion"),
        (dict(a_range="ab"), "a_range"),
        (dict(a_range=(1.0,)), "a_range"),
        (dict(e_range=(0.0, 1.0)), "e_range"),
        (dict(e_range=(-0.1, 0.5)), "e_range"),
        (dict(e_range=(0.6, 0.5)), "e_range"),
        (dict(omega_range=(float("nan"), 1.0)), "omega_range"),
        (dict(anomaly_range=(0.0, float("inf"))), "anomaly_range"),
        (dict(min_perihelion=0.0), "min_perihelion"),
        (dict(noise_var=-1.0), "noise_var"),
        (dict(trajectories=0), "trajectories"),
    ]
    for kwargs, match in bad:
        spec = dataclasses.replace(P.KeplerSplitSpec(4, 4), **kwargs)
        with pytest.raises(ValueError, match=match) as err:
            spec.validate("train")
        assert "\n" not in str(err.value), kwargs
    with pytest.raises(ValueError, match="e_range"):  # before any integration
        P.make_dataset("kepler", cache_dir=False, splits={"train": P.KeplerSplitSpec(2, 2, e_range=(0.0, 1.2))})
    with pytest.raises(ValueError, match="M = 4"):
        P.make_dataset("sho", cache_dir=False, splits={"train": P.KeplerSplitSpec(2, 2)})
    with pytest.raises(ValueError, match=r"shape \(\.\.\., 4\)"):
        P.kepler_conserved(torch.zeros(3, 2))
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        P.kepler_initial_states([1.0], [1.0], [0.0], [0.0])
    with pytest.raises(ValueError, match="semi-major"):
        P.kepler_initial_states([-1.0], [0.1], [0.0], [0.0])


def test_existing_systems_keep_their_data_and_cache_keys(tmp_path) -> None:
    # file names (hash of every setting) from the module before Kepler was added
    expected = {
        "sho": (
            {},
            [
                "sho-train-0370b316fe2f64078d8b",
                "sho-test-208221c9a8b80b2f0745",
                "sho-wider-dde6519fe271e5e6dce8",
                "sho-moved-7d1d422f6b87f21ebcc2",
            ],
        ),
        "nbody": (
            dict(n=3, train_trajectories=2, train_steps=2, test_trajectories=2, test_steps=2),
            [
                "nbody-train-d4744d1e2c2ff18d78c7",
                "nbody-test-946949a4c6a117420614",
                "nbody-wider-564e873c79bb122a69c2",
                "nbody-moved-1660344b00de833e8f45",
            ],
        ),
        "oscillators": (
            dict(n=2, train_trajectories=3, train_steps=2, test_trajectories=4, test_steps=3),
            [
                "oscillators-train-adef01ed257a17e0eb07",
                "oscillators-test-c67ef846faf807a56deb",
                "oscillators-wider-0db166658ce100d47fcf",
                "oscillators-moved-1d4a290939cc883e11fd",
            ],
        ),
    }
    for name, (kwargs, stems) in expected.items():
        d = P.make_dataset(name, cache_dir=tmp_path / name, **kwargs)
        assert [f"{s}.npz" for s in stems] == [d.cache_files[s].rsplit("/", 1)[-1] for s in P.SPLITS], name
    assert P.make_dataset("sho", cache_dir=tmp_path / "sho").dt == 0.2
    # the Gaussian initial states are drawn exactly as before (q first, then p, own stream per split)
    for name, system in (("sho", P.sho()), ("nbody", P.nbody(3))):
        for idx, (split, spec) in enumerate(P.reference_splits(name, 3, 2, 4).items()):
            rng = np.random.default_rng(np.random.SeedSequence([0, idx, 0]))
            q = spec.q_shift + spec.q_scale * rng.standard_normal((spec.trajectories, system.dof))
            p = spec.p_scale * rng.standard_normal((spec.trajectories, system.dof))
            rng = np.random.default_rng(np.random.SeedSequence([0, idx, 0]))
            assert np.array_equal(spec.initial_states(rng, system), np.concatenate([q, p], axis=1)), (name, split)
