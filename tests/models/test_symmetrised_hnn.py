"""Tests of the SymmetrisedHNN catalogue entry, its prior update and the HNN metrics."""

from __future__ import annotations

import math

import pyro
import pytest
import torch

from pyro_invariance import fit, guides
from pyro_invariance.data import physics
from pyro_invariance.diagnostics.hnn_metrics import evaluate_hnn, symmetry_analysis
from pyro_invariance.infer.prior_update import PriorUpdatingGuide, update_prior_variance
from pyro_invariance.models.symmetrised_hnn import SymmetrisedHNN
from pyro_invariance.registry import MODELS, UnknownNameError
from pyro_invariance.symmetry.conserved import flow_matrices, oracle_generators

torch.set_num_threads(1)


def _weights(model: SymmetrisedHNN, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    sizes = (model.state_dim,) + model.hidden + (1,)
    return [torch.randn(sizes[i + 1], sizes[i], generator=gen, dtype=torch.float64) for i in range(len(sizes) - 1)]


def test_registered_and_builds() -> None:
    m = MODELS.get("symmetrised-hnn", state_dim=6, symmetry="un", hidden=(8,))
    assert isinstance(m, SymmetrisedHNN) and m.num_generators == 9
    out = m(torch.randn(5, 6), torch.randn(5, 6))
    assert out.shape == (5, 6)


def test_vector_field_and_euler_step_match_finite_differences() -> None:
    m = SymmetrisedHNN(
        4, (16, 16), symmetry="quadratic", num_generators=2, eta_init_std=0.3, euler_steps=3, dt=0.3
    ).double()
    w = _weights(m)
    flows = m.sample_flows()
    x = torch.randn(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    eps = 1e-6
    grad = torch.zeros_like(x)
    for i in range(4):
        e = torch.zeros(4, dtype=torch.float64)
        e[i] = eps
        grad[:, i] = (m.hamiltonian(x + e, w, flows) - m.hamiltonian(x - e, w, flows)) / (2 * eps)
    v = m.vector_field(x, w, flows, create_graph=False)
    assert torch.allclose(v, torch.cat([grad[:, 2:], -grad[:, :2]], 1), atol=1e-6)
    # E explicit-Euler sub-steps of size dt/E with the same flows
    xe = x.clone()
    for _ in range(3):
        xe = xe + 0.1 * m.vector_field(xe, w, flows, create_graph=False)
    with torch.no_grad():
        assert torch.allclose(m.step(x, w, flows), xe, atol=1e-12)


def test_hnn_vector_field_on_known_quadratic_h() -> None:
    # one linear hidden layer of width 1 with α irrelevant: use f(x) = ELU(w·x) with w·x > 0 → linear H
    m = SymmetrisedHNN(2, (1,), symmetry="none").double()
    with torch.no_grad():
        m.bias_0.fill_(10.0)  # ELU in its linear part: f(x) = (c w0·x/√2 + 10) · w1
    w = [torch.tensor([[1.0, 2.0]], dtype=torch.float64), torch.tensor([[3.0]], dtype=torch.float64)]
    x = torch.zeros(1, 2, dtype=torch.float64)
    v = m.vector_field(x, w, None, create_graph=False)
    g = torch.tensor([1.0, 2.0], dtype=torch.float64) * 3.0 / math.sqrt(2)
    assert torch.allclose(v, torch.stack([g[1], -g[0]]).unsqueeze(0))


def test_oracle_symmetrisation_over_full_orbit_is_invariant() -> None:
    m = SymmetrisedHNN(2, (32, 32), symmetry="so2", sampling="grid", num_transforms=256).double()
    w = _weights(m, 2)
    flows = m.sample_flows()
    x = torch.randn(8, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    h = m.hamiltonian(x, w, flows)
    g = oracle_generators("so2", 2, torch.float64)
    # exact for group elements on the grid, close for any rotation
    on_grid = flow_matrices(g, torch.tensor([[2.0 / 256 * 5]], dtype=torch.float64))[0]
    rx = x @ on_grid[:2, :2].T
    assert torch.allclose(m.hamiltonian(rx, w, flows), h, atol=1e-10)
    for w_any in (0.123, -0.77):
        t = flow_matrices(g, torch.tensor([[w_any]], dtype=torch.float64))[0]
        assert torch.allclose(
            m.hamiltonian(x @ t[:2, :2].T, w, flows), h, atol=2e-3 * float(h.detach().abs().max())
        )  # ELU(α=2) has a kink: O(1/S²)
    # without symmetrisation the MLP is not invariant (the check can fail)
    plain = m.observable(x, w)
    assert (m.observable(rx, w) - plain).abs().max() > 1e-2


def test_learned_generators_get_eta_learning_rate_names() -> None:
    m = SymmetrisedHNN(2, (8,), symmetry="quadratic")
    names = [n for n, _ in m.named_parameters()]
    assert "eta_W" in names and "eta_b" in names
    assert set(m.symmetry_summary()) == {"G0"}
    assert SymmetrisedHNN(2, (8,), symmetry="so2").symmetry_summary() == {}


def test_other_guides_are_swappable() -> None:
    data = (torch.randn(12, 2), torch.randn(12, 2))
    for name, kwargs in (("mean-field", {}), ("matrix-normal", {"freeze_row_factor": True}), ("map", {})):
        pyro.set_rng_seed(0)
        m = SymmetrisedHNN(2, (8,), num_transforms=4, euler_steps=2)
        r = fit(m, guides.get(name, m, **kwargs), data, steps=3, batch_size=None, progress=False)
        assert len(r.history["elbo"]) == 3 and math.isfinite(r.history["elbo"][-1])


def test_closed_form_prior_update() -> None:
    m = SymmetrisedHNN(2, (8,), prior="closed-form", prior_scale=1.0, num_transforms=4, euler_steps=2)
    g = guides.get("matrix-normal", m, init_scale=0.5)
    x, y = torch.randn(10, 2), torch.randn(10, 2)
    g(x, y)
    v = update_prior_variance(m, g, damping=1.0)
    # v* = (tr Σ + ‖m‖²)/D with m = 0 and Σ = 0.25 I  →  0.25
    assert torch.allclose(v, torch.full((2,), 0.25))
    with torch.no_grad():
        g.structured.weight_0.loc.fill_(1.0)
    v = update_prior_variance(m, g, damping=0.5)
    # λ ← λ/2 + ½ D/E‖W‖² with λ = 4, E‖W‖²/D = 1.25
    assert torch.allclose(v[0], torch.tensor(1 / (2 + 0.5 / 1.25)))
    wrapped = PriorUpdatingGuide(guides.get("matrix-normal", m), m)
    r = fit(m, wrapped, (x, y), steps=3, batch_size=None, progress=False)
    assert math.isfinite(r.history["elbo"][-1]) and not torch.equal(m.prior_var, v)
    with pytest.raises(ValueError, match="closed-form"):
        update_prior_variance(SymmetrisedHNN(2, (8,)), g)
    # no update during the warm-up
    m.prior_var.fill_(1.0)
    fit(
        m,
        PriorUpdatingGuide(guides.get("matrix-normal", m), m, warmup=5),
        (x, y),
        steps=3,
        batch_size=None,
        progress=False,
    )
    assert torch.equal(m.prior_var, torch.ones(2))


def test_hierarchical_prior_runs() -> None:
    m = SymmetrisedHNN(2, (8,), prior="hierarchical", num_transforms=4, euler_steps=2)
    r = fit(
        m,
        guides.get("matrix-normal", m, init_scale=0.1),
        (torch.randn(6, 2), torch.randn(6, 2)),
        steps=2,
        batch_size=None,
        progress=False,
    )
    assert math.isfinite(r.history["elbo"][-1])


def test_bad_input() -> None:
    m = SymmetrisedHNN(2, (8,))
    with pytest.raises(ValueError, match=r"shape \(B, 2\)"):
        m(torch.randn(3, 4))
    with pytest.raises(ValueError, match=r"y must have shape"):
        m(torch.randn(3, 2), torch.randn(3))
    # values are checked once at the data boundary (prepare_inputs, called by fit / evaluate)
    with pytest.raises(ValueError, match="non-finite"):
        m.prepare_inputs(torch.tensor([[0.0, float("nan")]]), None)
    with pytest.raises(ValueError, match="y contains 1 non-finite"):
        m.prepare_inputs(torch.zeros(1, 2), torch.tensor([[0.0, float("inf")]]))
    with pytest.raises(ValueError, match=r"y must have shape \(B, 2\)"):
        m.prepare_inputs(torch.zeros(3, 2), torch.zeros(3))
    with pytest.raises(ValueError, match="unknown symmetry"):
        SymmetrisedHNN(2, symmetry="so3")
    with pytest.raises(ValueError, match="state dimension 2"):
        SymmetrisedHNN(4, symmetry="so2")
    with pytest.raises(ValueError, match="even"):
        SymmetrisedHNN(3)
    with pytest.raises(UnknownNameError):
        MODELS.get("symmetrised-hnm")


def _train_sho(symmetry: str, data: physics.PhysicsDataset, steps: int = 400, seed: int = 0):
    pyro.set_rng_seed(seed)
    m = SymmetrisedHNN(2, (32, 32), symmetry=symmetry, num_transforms=8, euler_steps=4, init_seed=seed)
    g = guides.get("matrix-normal", m, init_scale=0.01)
    fit(m, g, data, steps=steps, batch_size=None, lr=0.05, eta_lr=0.05, progress=False, seed=seed)
    pyro.set_rng_seed(seed + 100)
    return m, evaluate_hnn(m, g, data, num_samples=8, num_particles=4, rollout_steps=0)


def test_learning_sho_learned_beats_hnn_and_finds_so2(tmp_path) -> None:
    data = physics.make_dataset("sho", test_trajectories=20, cache_dir=tmp_path)
    _, hnn = _train_sho("none", data)
    model, learned = _train_sho("quadratic", data)
    assert learned["neg_elbo"] < hnn["neg_elbo"]
    assert learned["test_mse"] < hnn["test_mse"]
    a = symmetry_analysis(model, system="sho")
    assert a.parallelness[0] > 0.9


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_learning_sho_slow_with_oracle(seed: int, tmp_path) -> None:
    data = physics.make_dataset("sho", test_trajectories=50, cache_dir=tmp_path, seed=seed)
    _, hnn = _train_sho("none", data, 800, seed)
    model, learned = _train_sho("quadratic", data, 800, seed)
    _, oracle = _train_sho("so2", data, 800, seed)
    assert learned["neg_elbo"] < hnn["neg_elbo"] and learned["test_mse"] < hnn["test_mse"]
    assert oracle["test_mse"] < hnn["test_mse"]
    assert symmetry_analysis(model, system="sho").parallelness[0] > 0.9


def test_metrics_and_plots(tmp_path) -> None:
    data = physics.make_dataset(
        "sho", train_trajectories=3, train_steps=2, test_trajectories=2, test_steps=3, cache_dir=tmp_path
    )
    m = SymmetrisedHNN(2, (8,), num_transforms=4, euler_steps=2)
    g = guides.get("matrix-normal", m, init_scale=0.1)
    fit(m, g, data, steps=2, batch_size=None, progress=False)
    out = evaluate_hnn(m, g, data, num_samples=2, num_particles=2)
    assert set(out) == {"train_mse", "nll", "kl", "neg_elbo", "test_mse", "wider_mse", "moved_mse", "energy_drift"}
    assert all(math.isfinite(v) for v in out.values()) and out["kl"] > 0
    assert abs(out["neg_elbo"] - out["nll"] - out["kl"]) < 1e-9
    import matplotlib.pyplot as plt

    from pyro_invariance.diagnostics.hnn_metrics import energy_drift, plot_generators, plot_symmetry_analysis

    # the true trajectories conserve energy; a scaled copy does not
    traj = torch.tensor(data.trajectories["test"])
    assert energy_drift(data.system, traj) < 1e-8
    assert energy_drift(data.system, traj * torch.linspace(1, 2, traj.shape[1]).view(1, -1, 1)) > 0.1
    a = symmetry_analysis(m, system="sho")
    fig = plot_symmetry_analysis(a, target=1)
    assert len(fig.axes) == 2 and len(fig.axes[0].patches) == len(a.singular_values)
    fig = plot_generators([m.generators()[0], a.vectors[0].reshape(3, 3)], ["learned", "v0"])
    assert [ax.get_title() for ax in fig.axes] == ["learned", "v0"]
    plt.close("all")
    with pytest.raises(ValueError, match="no generators"):
        symmetry_analysis(SymmetrisedHNN(2, (8,), symmetry="none"))


def test_closed_form_prior_update_as_fit_callback_resumes_bit_for_bit(tmp_path) -> None:
    """The talk's update after every step, through ``fit(callbacks=...)``; prior_var is a buffer,
    so a checkpointed run resumes exactly."""
    x, y = torch.randn(12, 2, generator=torch.Generator().manual_seed(0)), torch.randn(12, 2)
    calls = []

    def update(step, model, guide):
        calls.append(step)
        update_prior_variance(model, guide, damping=0.5)

    def run(**kw):
        m = SymmetrisedHNN(2, (8,), prior="closed-form", num_transforms=4, euler_steps=2)
        g = guides.get("matrix-normal", m, init_scale=0.5)
        fit(m, g, (x, y), steps=6, batch_size=None, progress=False, callbacks=[update], **kw)
        return m

    full = run()
    assert calls == [1, 2, 3, 4, 5, 6] and not torch.equal(full.prior_var, torch.ones(2))
    run(checkpoint_path=tmp_path / "c.pt", until_step=4)
    resumed = run(checkpoint_path=tmp_path / "c.pt", resume=True)
    assert torch.equal(resumed.prior_var, full.prior_var)
    for (name, a), (_, b) in zip(full.state_dict().items(), resumed.state_dict().items()):
        assert torch.equal(a, b), name
