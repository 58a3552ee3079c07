"""Gradient-span analysis of learned conserved quantities
(``pyro_invariance/diagnostics/conserved_analysis.py``) against exact Kepler quantities."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")  # noqa: E402  (tests only; the library never selects a backend)

import pytest
import torch

from pyro_invariance.data import physics as P
from pyro_invariance.diagnostics.conserved_analysis import analyse_conserved, gradients, plot_level_sets

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def states():
    a = torch.tensor([1.0, 1.2, 0.9, 1.4], dtype=torch.float64)
    e = torch.tensor([0.1, 0.3, 0.45, 0.2], dtype=torch.float64)
    omega = torch.tensor([0.3, 1.5, 2.5, 4.0], dtype=torch.float64)
    anomaly = torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64)
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
