"""Gradient-span analysis of learned conserved quantities
(``pyro_invariance/diagnostics/conserved_analysis.py``) against exact Kepler quantities."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # noqa: E402  (tests only; the library never selects a backend)

import pytest
import torch

from pyro_invariance.data import physics as P
from pyro_invariance.diagnostics.conserved_analysis import (
    SIGNIFICANT_RTOL,
    analyse_conserved,
    analyse_discovery,
    discovery_measures,
    gradients,
    plot_level_sets,
)

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def states():
    a = torch.tensor([1.0, 1.2, 0.9, 1.4], dtype=torch.float64)
    e = torch.tensor([0.1, 0.3, 0.45, 0.2], dtype=torch.float64)
    omega = torch.tensor([0.3, 1.5, 2.5, 4.0], dtype=torch.float64)
    anomaly = torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64)
    x = P.kepler_initial_states(a.numpy(), e.numpy(), omega.numpy(), anomaly.numpy())
    return torch.as_tensor(x, dtype=torch.float64)


@pytest.fixture(scope="module")
def orbit_states():
    """40 bound states spread over a, e, ω and the anomaly (as the ``kepler`` data)."""
    g = torch.Generator().manual_seed(0)
    u = torch.rand(4, 40, generator=g, dtype=torch.float64)
    a, e, omega, anomaly = 0.8 + 0.7 * u[0], 0.05 + 0.45 * u[1], 2 * torch.pi * u[2], 2 * torch.pi * u[3]
    x = P.kepler_initial_states(a.numpy(), e.numpy(), omega.numpy(), anomaly.numpy())
    return torch.as_tensor(x, dtype=torch.float64)


def _exact(names):
    return lambda z: torch.stack([P.kepler_conserved(z)[n] for n in names], dim=-1)


def test_gradients_against_a_closed_form(states):
    g = gradients(_exact(["L"]), states)  # ∇L = (p_y, −p_x, −q_y, q_x)
    q, p = states[:, :2], states[:, 2:]
    expected = torch.stack([p[:, 1], -p[:, 0], -q[:, 1], q[:, 0]], dim=-1)
    torch.testing.assert_close(g[:, 0], expected)


def test_the_exact_quantities_are_found_and_conserved(states):
    a = analyse_conserved(_exact(["L", "A_x", "A_y"]), P.kepler_conserved, states)
    assert max(a.known_angle.values()) < 1e-5 and max(a.learned_angle) < 1e-5
    assert [m[0] for m in a.match] == ["L", "A_x", "A_y"] and min(m[1] for m in a.match) > 1 - 1e-9
    assert max(a.conservation) < 1e-12
    assert len(a.table()) == 4 + 3


def test_a_non_conserved_quantity_is_flagged(states):
    """q_x is not conserved: its bracket with H is far from 0 and ∇L is not in its span."""
    a = analyse_conserved(lambda z: z[:, :1], P.kepler_conserved, states)
    assert a.conservation[0] > 0.1 and a.known_angle["L"] > 20


def test_level_sets_figure_and_errors(states):
    import matplotlib.pyplot as plt

    fig = plot_level_sets(_exact(["L"]), P.kepler_conserved, states[0], points=21)
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 1 + 4
    plt.close("all")
    with pytest.raises(ValueError, match="shape"):
        analyse_conserved(_exact(["L"]), P.kepler_conserved, states[0])
    with pytest.raises(ValueError, match="Hamiltonian"):
        analyse_conserved(_exact(["L"]), P.kepler_conserved, states, hamiltonian="E")


def test_exact_angular_momentum_and_runge_lenz_are_new_and_conserved(orbit_states):
    """∇L, ∇A_x, ∇A_y span every conserved direction: (a) 0, (b) 1, rank 3, ∇H and ∇L inside."""
    d = analyse_discovery(_exact(["L", "A_x", "A_y"]), P.kepler_conserved, orbit_states)
    assert d.flow_share < 1e-12 and d.new_share > 1 - 1e-9 and d.rank == 3
    assert min(d.known_share.values()) > 1 - 1e-9 and d.rtol == SIGNIFICANT_RTOL
    # an orthogonal mixing of the quantities keeps the singular values, so nothing changes
    rotation = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64))[0]
    mixed = analyse_discovery(lambda z: _exact(["L", "A_x", "A_y"])(z) @ rotation, P.kepler_conserved, orbit_states)
    assert abs(mixed.new_share - d.new_share) < 1e-9 and mixed.rank == 3


def test_angular_momentum_three_times_is_not_new(orbit_states):
    """Three copies of L (plus noise below the threshold) are one direction with no Runge–Lenz share;
    the old angle measure, by contrast, keeps the noise directions."""
    torch.manual_seed(0)
    w = 0.01 * torch.randn(4, 3, dtype=torch.float64)
    copies = lambda z: _exact(["L"])(z).expand(-1, 3) * torch.tensor([1.0, -2.0, 0.5], dtype=z.dtype) + z @ w  # noqa: E731
    d = analyse_discovery(copies, P.kepler_conserved, orbit_states)
    assert d.rank == 1 and d.new_share < 0.01 and d.flow_share < 0.02
    assert d.known_share["L"] > 0.99
    assert analyse_conserved(copies, P.kepler_conserved, orbit_states).known_angle["A_x"] < 20


def test_h_and_l_are_not_new(orbit_states):
    d = analyse_discovery(_exact(["H", "L"]), P.kepler_conserved, orbit_states)
    assert d.new_share < 1e-9 and d.flow_share < 1e-12


def test_random_fields_are_not_conserved(orbit_states):
    """Gradients of a random network: a large flow share (about 1/√M = 0.5 in 4-d)."""
    torch.manual_seed(1)
    net = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.Tanh(), torch.nn.Linear(32, 3)).double()
    d = analyse_discovery(net, P.kepler_conserved, orbit_states)
    assert d.flow_share > 0.25 and d.rank >= 2


def test_new_directions_default_to_the_complement(orbit_states):
    """With ``new=None`` the new directions are everything orthogonal to J∇H, ∇H and ∇L — in 4-d
    Kepler that is the Runge–Lenz direction, so both readings agree."""
    torch.manual_seed(2)
    w = torch.randn(4, 3, dtype=torch.float64)
    field = lambda z: _exact(["L", "A_x", "A_y"])(z) + 0.3 * torch.sin(z @ w)  # noqa: E731
    a = analyse_discovery(field, P.kepler_conserved, orbit_states)
    b = analyse_discovery(field, P.kepler_conserved, orbit_states, new=None)
    assert abs(a.new_share - b.new_share) < 1e-9 and abs(a.flow_share - b.flow_share) < 1e-12


def test_discovery_measures_on_hand_made_gradients():
    """Shapes and closed-form values in R⁴: flow along e₀, known e₁, new e₂ (and e₃ beyond)."""
    e = torch.eye(4, dtype=torch.float64)
    flow, known, new = e[0].expand(2, 4), e[1].expand(2, 1, 4), e[2].expand(2, 1, 4)
    # state 0: gradients e₀ + e₂ and e₁ — flow share 1/√3, span {e₀+e₂, e₁}: cos² with e₂ is 1/2
    # state 1: gradients e₂ and 0.05 e₃ — the second is below the threshold: rank 1, new share 1
    g = torch.stack([torch.stack([e[0] + e[2], e[1]]), torch.stack([e[2], 0.05 * e[3]])])
    m = discovery_measures(g, flow, known, new)
    assert {k: tuple(v.shape) for k, v in m.items()} == {
        "flow_share": (2,),
        "new_share": (2,),
        "rank": (2,),
        "known_share": (2, 1),
        "relative_singular_values": (2, 2),
    }
    torch.testing.assert_close(m["flow_share"], torch.tensor([3**-0.5, 0.0], dtype=torch.float64))
    torch.testing.assert_close(m["new_share"], torch.tensor([0.5, 1.0], dtype=torch.float64))
    assert m["rank"].tolist() == [2, 1]
    torch.testing.assert_close(m["known_share"][:, 0], torch.tensor([1.0, 0.0], dtype=torch.float64))
    # a direction the baseline already holds is never new
    assert discovery_measures(g, flow, known, known)["new_share"].abs().max() < 1e-12


def test_discovery_errors(orbit_states):
    with pytest.raises(ValueError, match="shape"):
        analyse_discovery(_exact(["L"]), P.kepler_conserved, orbit_states[0])
    with pytest.raises(ValueError, match="do not include"):
        analyse_discovery(_exact(["L"]), P.kepler_conserved, orbit_states, new=("B",))
