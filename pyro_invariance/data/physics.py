"""Hamiltonian trajectory data for Noether's razor (talk 000; docs/methods.md §4).

A system is defined by its Hamiltonian alone: :class:`HamiltonianSystem` holds ``H(x)`` (a torch
function of states ``x = (q, p)`` of shape ``(..., M)``, ``M = 2·dof``); the vector field
``ẋ = J ∇H(x)`` with ``J = [[0, I], [−I, 0]]`` is obtained by autograd, so adding a system is
writing ``H``. Built-in systems (:data:`SYSTEMS`, :func:`get_system`):

===============  ======================================================================  ==========
name             H(q, p)                                                                 state dim
===============  ======================================================================  ==========
``sho``          (q² + p²)/2                                                             2
``oscillators``  Σ_i (q_i² + p_i²)/2, n uncoupled isotropic oscillators (``n``)          2n
``nbody``        Σ_i ‖p_i‖²/2 − Σ_{i<j} 1/√(‖q_i − q_j‖² + 1), 2-d, unit masses (``n``)  4n
``kepler``       ‖p‖²/2 − 1/‖q‖, 2-d Kepler problem, unit mass and GM = 1                4
===============  ======================================================================  ==========

State layout: ``x = (q, p)``; for the 2-d n-body system ``q = (q_1x, q_1y, q_2x, q_2y, ...)`` and
``p`` likewise; for Kepler ``x = (q_x, q_y, p_x, p_y)``. The Kepler problem's conserved quantities
(:func:`kepler_conserved`): ``H``, the angular momentum ``L = q_x p_y − q_y p_x`` and the
Runge–Lenz vector ``A = p × L − q/‖q‖ = (p_y L − q_x/‖q‖, −p_x L − q_y/‖q‖)`` (its "hidden"
symmetry); for a bound orbit ``a = −1/(2H)``, ``e = ‖A‖`` and ``A`` points at the periapsis
(:func:`kepler_elements`).

Data (docs/methods.md §4): initial ``q ~ q_shift + q_scale·N(0, I)``, ``p ~ p_scale·N(0, I)``; each
trajectory is integrated in float64 by SciPy's DOP853 (``rtol = atol = 1e-10``; ``1e-12`` for Kepler,
whose perihelion passages need it to conserve ``H`` to ``< 1e-9``) and sampled every
``dt``; a trajectory of ``steps`` steps gives ``steps`` pairs ``(x_t, x_{t+dt})``. Reference
splits (:func:`reference_splits`):

=========  ===============  =======  =======  =======  =====================================
split      trajectories     q scale  q shift  p scale  target noise
=========  ===============  =======  =======  =======  =====================================
train      7×4 (SHO),       1        0        0.5      N(0, 0.001) (variance) on y
           200×50 (others)
test       100×20           1        0        0.2      none
wider      100×20           3        0        0.2      none
moved      100×20           1        +1       0.2      none
=========  ===============  =======  =======  =======  =====================================

Kepler draws bound orbits instead (:class:`KeplerSplitSpec`, :func:`kepler_initial_states`):
semi-major axis ``a``, eccentricity ``e``, argument of periapsis ``ω`` and mean anomaly ``M``
uniform in ranges (``M ∈ [0, 2π)``; ``e`` uniform in ``[e_min, min(e_max, 1 − r_min/a)]`` so the
perihelion ``a(1 − e) ≥ r_min = 0.3``), counter-clockwise (``L > 0``), ``dt = 0.5``:

=========  ============  ===========  ===========  ==========  =====================================
split      trajectories  a            e            ω           target noise
=========  ============  ===========  ===========  ==========  =====================================
train      50×20         [0.8, 1.5]   [0, 0.5]     [0, π)      N(0, 0.001) (variance) on y
test       50×20         [0.8, 1.5]   [0, 0.5]     [0, π)      none
wider      50×20         [0.8, 2.5]   [0, 0.8]     [0, π)      none
moved      50×20         [0.8, 1.5]   [0, 0.5]     [π, 2π)     none
=========  ============  ===========  ===========  ==========  =====================================

``moved`` holds orientations never seen in training: a model that has learned the rotation
symmetry generalises to it.

Seeds: every split draws its initial states from its own stream ``SeedSequence([seed, split
index])`` and its noise from a third component, so no two splits share random numbers (the
reference reused the training seed for its test data). Trajectories are cached on disk
(``.npz``) under a file name holding a hash of *every* setting (:func:`cache_key`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from pyro_invariance._optional import scipy_integrate
from pyro_invariance.registry import DATASETS
from pyro_invariance.validation import check_positive_float, check_positive_int, check_subset_size, refuse_data_dir

#: Bump when the generated data would change for the same settings.
DATA_VERSION = 1
SPLITS = ("train", "test", "wider", "moved")
DEFAULT_CACHE_DIR = Path("~/.cache/pyro_invariance/physics")


# ---------------------------------------------------------------------------------------------
# Systems
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class HamiltonianSystem:
    """A Hamiltonian system given by ``H`` alone.

    Attributes:
        name: identifier (used in cache keys).
        dof: degrees of freedom; the state has dimension ``M = 2·dof``.
        hamiltonian: ``H(x)``: ``(..., M)`` tensor → ``(...)`` tensor (torch ops, any float dtype).
        params: the settings that define ``H`` (e.g. ``{"n": 3}``), part of the cache key.
    """

    name: str
    dof: int
    hamiltonian: Callable[[Tensor], Tensor]
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def state_dim(self) -> int:
        return 2 * self.dof

    def check_state(self, x: Tensor) -> None:
        """Raise ``ValueError`` unless ``x`` has shape ``(..., M)``."""
        if x.dim() < 1 or x.shape[-1] != self.state_dim:
            raise ValueError(
                f"{self.name}: states must have shape (..., {self.state_dim}) = (q, p), got {tuple(x.shape)}"
            )

    def energy(self, x: Tensor) -> Tensor:
        """``H(x)``, shape ``x.shape[:-1]``."""
        self.check_state(x)
        return self.hamiltonian(x)

    def vector_field(self, x: Tensor) -> Tensor:
        """``ẋ = J ∇H(x)``, i.e. ``(q̇, ṗ) = (∂H/∂p, −∂H/∂q)``; shape as ``x``."""
        self.check_state(x)
        with torch.enable_grad():
            xg = x.detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(self.hamiltonian(xg).sum(), xg)
        return symplectic(grad)


def symplectic(grad: Tensor) -> Tensor:
    """``J g`` for ``g = (g_q, g_p)``: returns ``(g_p, −g_q)`` (last dim ``M`` even)."""
    d = grad.shape[-1] // 2
    return torch.cat([grad[..., d:], -grad[..., :d]], dim=-1)


def _sho(x: Tensor) -> Tensor:
    return 0.5 * (x**2).sum(-1)


def _nbody_hamiltonian(n: int, softening: float) -> Callable[[Tensor], Tensor]:
    def h(x: Tensor) -> Tensor:
        q = x[..., : 2 * n].reshape(*x.shape[:-1], n, 2)
        p = x[..., 2 * n :]
        kinetic = 0.5 * (p**2).sum(-1)
        i, j = torch.triu_indices(n, n, offset=1)
        d2 = ((q[..., i, :] - q[..., j, :]) ** 2).sum(-1)
        return kinetic - (1.0 / torch.sqrt(d2 + softening)).sum(-1)

    return h


def sho() -> HamiltonianSystem:
    """Simple harmonic oscillator, ``H = (q² + p²)/2`` (M = 2)."""
    return HamiltonianSystem("sho", 1, _sho, {})


def oscillators(n: int = 3) -> HamiltonianSystem:
    """``n`` uncoupled isotropic oscillators, ``H = Σ_i (q_i² + p_i²)/2`` (M = 2n)."""
    check_positive_int("n", n)
    return HamiltonianSystem("oscillators", n, _sho, {"n": n})


def nbody(n: int = 3, softening: float = 1.0) -> HamiltonianSystem:
    """2-d ``n``-body gravity, unit masses, ``H = Σ‖p_i‖²/2 − Σ_{i<j} 1/√(‖q_i−q_j‖² + s)``
    with softening ``s = 1`` (docs/methods.md §4); M = 4n."""
    check_positive_int("n", n, minimum=2)
    check_positive_float("softening", softening)
    return HamiltonianSystem(
        "nbody", 2 * n, _nbody_hamiltonian(n, float(softening)), {"n": n, "softening": float(softening)}
    )


def _kepler(x: Tensor) -> Tensor:
    return 0.5 * (x[..., 2:] ** 2).sum(-1) - 1.0 / torch.linalg.vector_norm(x[..., :2], dim=-1)


def kepler() -> HamiltonianSystem:
    """2-d Kepler problem, unit mass and ``GM = 1``: ``H = ‖p‖²/2 − 1/‖q‖``, state
    ``x = (q_x, q_y, p_x, p_y)`` (M = 4). Conserved: ``H``, ``L``, ``A`` (:func:`kepler_conserved`)."""
    return HamiltonianSystem("kepler", 2, _kepler, {})


def _check_kepler_states(x: Tensor) -> None:
    if not isinstance(x, Tensor) or x.dim() < 1 or x.shape[-1] != 4:
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"kepler: states must be a tensor of shape (..., 4) = (q_x, q_y, p_x, p_y), got {shape}")


def kepler_conserved(x: Tensor) -> dict[str, Tensor]:
    """The Kepler problem's conserved quantities of states ``x`` ``(..., 4) = (q_x, q_y, p_x, p_y)``.

    Returns ``{"H", "L", "A_x", "A_y"}``, each of shape ``x.shape[:-1]`` (dtype of ``x``):
    ``H = ‖p‖²/2 − 1/‖q‖``, ``L = q × p = q_x p_y − q_y p_x`` (generates rotations) and the
    Runge–Lenz vector ``A = p × L − q/‖q‖ = (p_y L − q_x/‖q‖, −p_x L − q_y/‖q‖)`` (the hidden
    symmetry: together with ``L`` it generates SO(3) on the bound orbits of fixed ``H``).
    """
    _check_kepler_states(x)
    qx, qy, px, py = x.unbind(-1)
    r = torch.sqrt(qx**2 + qy**2)
    ang = qx * py - qy * px
    return {
        "H": 0.5 * (px**2 + py**2) - 1.0 / r,
        "L": ang,
        "A_x": py * ang - qx / r,
        "A_y": -px * ang - qy / r,
    }


def kepler_elements(x: Tensor) -> dict[str, Tensor]:
    """Orbital elements of bound Kepler states ``x`` ``(..., 4)`` from the conserved quantities.

    Returns ``{"a", "e", "omega"}``, each of shape ``x.shape[:-1]``: semi-major axis
    ``a = −1/(2H)`` (``H < 0``; ``inf``/negative for unbound states), eccentricity ``e = ‖A‖``
    and argument of periapsis ``ω = atan2(A_y, A_x) ∈ [0, 2π)`` (``A`` points at the periapsis;
    ``ω`` is ill-defined for near-circular orbits, ``e → 0``).
    """
    c = kepler_conserved(x)
    omega = torch.remainder(torch.atan2(c["A_y"], c["A_x"]), 2 * math.pi)
    omega = torch.where(omega >= 2 * math.pi, omega - 2 * math.pi, omega)  # remainder(−tiny) rounds to 2π
    return {"a": -0.5 / c["H"], "e": torch.sqrt(c["A_x"] ** 2 + c["A_y"] ** 2), "omega": omega}


SYSTEMS: dict[str, Callable[..., HamiltonianSystem]] = {
    "sho": sho,
    "oscillators": oscillators,
    "nbody": nbody,
    "kepler": kepler,
}
#: ``dt`` of :func:`make_dataset` when none is given (0.2 for systems not listed).
DEFAULT_DT: dict[str, float] = {"nbody": 1.0, "kepler": 0.5}
#: DOP853 ``rtol = atol`` of :func:`make_dataset` when none is given (1e-10 for systems not listed).
#: Kepler at 1e-10 drifts by ~1e-8 in ``H`` over 20 steps of 0.5 (perihelion passages); 1e-12: < 1e-9.
DEFAULT_TOL: dict[str, float] = {"kepler": 1e-12}


def get_system(name: str, **kwargs: Any) -> HamiltonianSystem:
    """Build a built-in system by name (``sho``, ``oscillators``, ``nbody``, ``kepler``)."""
    if name not in SYSTEMS:
        raise ValueError(f"unknown Hamiltonian system {name!r}; known systems: {sorted(SYSTEMS)}")
    return SYSTEMS[name](**kwargs)


# ---------------------------------------------------------------------------------------------
# Integration
# ---------------------------------------------------------------------------------------------
def integrate(
    system: HamiltonianSystem, x0: np.ndarray | Tensor, dt: float, steps: int, rtol: float = 1e-10, atol: float = 1e-10
) -> np.ndarray:
    """Trajectories sampled every ``dt``: ``x0 (T, M)`` → ``(T, steps + 1, M)`` float64.

    All ``T`` trajectories are integrated as one ODE system by SciPy's ``solve_ivp`` (DOP853,
    ``rtol``/``atol``); the vector field is ``J∇H`` by autograd in float64.

    Raises:
        ValueError: wrong state dimension, a non-finite state (the message names the
            trajectory) or a failed integration (a trajectory that diverges / leaves the floats).
    """
    solve_ivp = scipy_integrate.solve_ivp
    x0 = np.asarray(x0, dtype=np.float64)
    if x0.ndim != 2 or x0.shape[1] != system.state_dim:
        raise ValueError(f"{system.name}: initial states must have shape (T, {system.state_dim}), got {x0.shape}")
    check_positive_float("dt", dt)
    check_positive_int("steps", steps)
    t_count, m = x0.shape

    def rhs(_t: float, flat: np.ndarray) -> np.ndarray:
        x = torch.from_numpy(flat.reshape(t_count, m))
        return system.vector_field(x).numpy().reshape(-1)

    if not np.isfinite(x0).all():
        raise ValueError(f"{system.name}: initial states contain non-finite values")
    with np.errstate(all="ignore"):
        v0 = rhs(0.0, x0.reshape(-1))
    if not np.isfinite(v0).all():
        bad = int(np.nonzero((~np.isfinite(v0.reshape(t_count, m))).any(1))[0][0])
        raise ValueError(f"{system.name}: non-finite vector field J∇H at the initial state of trajectory {bad}")
    times = dt * np.arange(steps + 1)
    sol = solve_ivp(rhs, (0.0, times[-1]), x0.reshape(-1), method="DOP853", t_eval=times, rtol=rtol, atol=atol)
    if not sol.success or sol.y.shape[1] != steps + 1:
        # DOP853 fails when the solution leaves the floats or blows up in finite time
        t_fail = float(sol.t[-1]) if sol.t.size else 0.0
        raise ValueError(
            f"{system.name}: integration failed after t={t_fail:g} of {times[-1]:g}: the trajectories diverge "
            f"or become non-finite ({sol.message})"
        )
    out = sol.y.T.reshape(steps + 1, t_count, m).transpose(1, 0, 2)
    check_trajectories(system.name, out)
    return out


def check_trajectories(name: str, traj: np.ndarray) -> None:
    """Raise ``ValueError`` naming the first trajectory with a non-finite state."""
    bad = ~np.isfinite(traj)
    if bad.any():
        t, s, _ = np.argwhere(bad)[0]
        raise ValueError(f"{name}: trajectory {t} is non-finite from step {s} on ({int(bad.sum())} bad values)")


# ---------------------------------------------------------------------------------------------
# Splits and caching
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SplitSpec:
    """Settings of one split: ``trajectories`` × ``steps`` pairs, initial-state distribution and noise.

    ``noise_var`` is the variance of the Gaussian noise added to the *targets* ``y`` only.
    """

    trajectories: int
    steps: int
    q_scale: float = 1.0
    q_shift: float = 0.0
    p_scale: float = 0.5
    noise_var: float = 0.0

    def validate(self, split: str) -> None:
        check_positive_int(f"{split}.trajectories", self.trajectories)
        check_positive_int(f"{split}.steps", self.steps)
        check_positive_float(f"{split}.q_scale", self.q_scale)
        check_positive_float(f"{split}.p_scale", self.p_scale)
        if not (math.isfinite(self.q_shift) and math.isfinite(self.noise_var) and self.noise_var >= 0):
            raise ValueError(f"{split}: q_shift must be finite and noise_var >= 0, got {self}")

    def initial_states(self, rng: np.random.Generator, system: HamiltonianSystem) -> np.ndarray:
        """``(trajectories, M)``: ``q ~ q_shift + q_scale·N(0, I)``, then ``p ~ p_scale·N(0, I)``."""
        d = system.dof
        q = self.q_shift + self.q_scale * rng.standard_normal((self.trajectories, d))
        p = self.p_scale * rng.standard_normal((self.trajectories, d))
        return np.concatenate([q, p], axis=1)


def _check_range(name: str, value: object, low: float = -math.inf, high: float = math.inf) -> tuple[float, float]:
    """``value`` as ``(lo, hi)`` floats with ``low <= lo <= hi <= high``; else ``ValueError``."""
    try:
        lo, hi = (float(v) for v in value)  # type: ignore[union-attr]
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a pair (low, high) of numbers, got {value!r}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and low <= lo <= hi <= high):
        bounds = f"{low:g} <= low <= high <= {high:g}" if math.isfinite(low) else "low <= high"
        raise ValueError(f"{name} must be finite with {bounds}, got {value!r}")
    return lo, hi


@dataclass(frozen=True)
class KeplerSplitSpec:
    """Settings of one split of bound 2-d Kepler orbits (``H = ‖p‖²/2 − 1/‖q‖``, ``GM = 1``).

    Each trajectory starts on an orbit with semi-major axis ``a ~ U(a_range)``, eccentricity
    ``e ~ U(e_range[0], min(e_range[1], 1 − min_perihelion/a))`` (so the perihelion
    ``a(1 − e) ≥ min_perihelion``: no near-collisions), argument of periapsis
    ``ω ~ U(omega_range)`` and mean anomaly ``M ~ U(anomaly_range)``, moving counter-clockwise
    (``L > 0``); see :func:`kepler_initial_states`. Ranges are ``(low, high)`` radians for
    angles. ``noise_var`` is the variance of the Gaussian noise added to the *targets* ``y`` only.
    """

    #: Names the initial-state distribution in the cache key (not a field: not in ``asdict``).
    kind: ClassVar[str] = "kepler-orbits"

    trajectories: int
    steps: int
    a_range: tuple[float, float] = (0.8, 1.5)
    e_range: tuple[float, float] = (0.0, 0.5)
    omega_range: tuple[float, float] = (0.0, math.pi)
    anomaly_range: tuple[float, float] = (0.0, 2 * math.pi)
    min_perihelion: float = 0.3
    noise_var: float = 0.0

    def validate(self, split: str) -> None:
        check_positive_int(f"{split}.trajectories", self.trajectories)
        check_positive_int(f"{split}.steps", self.steps)
        a_lo, _ = _check_range(f"{split}.a_range", self.a_range)
        e_lo, _ = _check_range(f"{split}.e_range", self.e_range, 0.0, 1.0)
        _check_range(f"{split}.omega_range", self.omega_range)
        _check_range(f"{split}.anomaly_range", self.anomaly_range)
        rp = check_positive_float(f"{split}.min_perihelion", self.min_perihelion)
        if self.e_range[1] >= 1:
            raise ValueError(f"{split}.e_range must stay below 1 (bound orbits), got {self.e_range!r}")
        if not a_lo * (1 - e_lo) >= rp:
            raise ValueError(
                f"{split}: a_range[0]·(1 − e_range[0]) = {a_lo * (1 - e_lo):g} is below min_perihelion = {rp:g}"
            )
        if not (math.isfinite(self.noise_var) and self.noise_var >= 0):
            raise ValueError(f"{split}: noise_var must be finite and >= 0, got {self.noise_var!r}")

    def initial_states(self, rng: np.random.Generator, system: HamiltonianSystem) -> np.ndarray:
        """``(trajectories, 4)`` states ``(q_x, q_y, p_x, p_y)`` on orbits drawn as in the class doc."""
        if system.state_dim != 4:
            raise ValueError(
                f"KeplerSplitSpec draws 2-d Kepler states (M = 4); {system.name} has M = {system.state_dim}"
            )
        n = self.trajectories
        (a_lo, a_hi), (e_lo, e_hi) = self.a_range, self.e_range
        (w_lo, w_hi), (m_lo, m_hi) = self.omega_range, self.anomaly_range
        a = a_lo + (a_hi - a_lo) * rng.random(n)
        e_top = np.minimum(e_hi, 1.0 - self.min_perihelion / a)
        e = e_lo + (e_top - e_lo) * rng.random(n)
        omega = w_lo + (w_hi - w_lo) * rng.random(n)
        mean_anomaly = m_lo + (m_hi - m_lo) * rng.random(n)
        return kepler_initial_states(a, e, omega, mean_anomaly)


def eccentric_anomaly(mean_anomaly: np.ndarray, e: np.ndarray, tol: float = 1e-14, max_iter: int = 50) -> np.ndarray:
    """Solve Kepler's equation ``E − e sin E = M`` for ``E`` by Newton iterations (``0 <= e < 1``).

    ``M`` and ``e`` broadcast; starts from ``E = M`` (``e < 0.8``) or ``E = π`` (``M`` taken mod
    2π), which converges for every ``M``; raises ``ValueError`` if ``|ΔE| > tol`` after ``max_iter``.
    """
    m, e = np.broadcast_arrays(np.asarray(mean_anomaly, dtype=np.float64), np.asarray(e, dtype=np.float64))
    m = np.mod(m, 2 * np.pi)
    big_e = np.where(e < 0.8, m, np.pi)
    for _ in range(max_iter):
        step = (big_e - e * np.sin(big_e) - m) / (1.0 - e * np.cos(big_e))
        big_e = big_e - step
        if np.all(np.abs(step) <= tol):
            return big_e
    raise ValueError(
        f"Kepler's equation did not converge in {max_iter} Newton steps (max |ΔE| = {np.abs(step).max():g})"
    )


def kepler_initial_states(a: np.ndarray, e: np.ndarray, omega: np.ndarray, mean_anomaly: np.ndarray) -> np.ndarray:
    """States ``(T, 4) = (q_x, q_y, p_x, p_y)`` float64 on counter-clockwise Kepler orbits (``GM = 1``).

    Standard two-body formulas: with the eccentric anomaly ``E`` (:func:`eccentric_anomaly`),
    ``r = a(1 − e cos E)``, in the perifocal frame ``q = a(cos E − e, √(1−e²) sin E)`` and
    ``p = (√a / r)(−sin E, √(1−e²) cos E)``; both are then rotated by ``ω`` (periapsis direction).
    Then ``H = −1/(2a)``, ``L = √(a(1−e²))`` and ``A = e (cos ω, sin ω)``.

    Args:
        a: semi-major axes ``(T,)`` (``> 0``); e: eccentricities (``0 <= e < 1``); omega:
            arguments of periapsis (radians); mean_anomaly: mean anomalies ``M`` (radians). All broadcast.
    """
    a, e, omega, m = np.broadcast_arrays(*(np.asarray(v, dtype=np.float64) for v in (a, e, omega, mean_anomaly)))
    if not (np.isfinite(a).all() and (a > 0).all()):
        raise ValueError("kepler: semi-major axes must be finite and > 0")
    if not (np.isfinite(e).all() and (e >= 0).all() and (e < 1).all()):
        raise ValueError("kepler: eccentricities must lie in [0, 1) (bound orbits)")
    if not (np.isfinite(omega).all() and np.isfinite(m).all()):
        raise ValueError("kepler: omega and mean_anomaly must be finite")
    big_e = eccentric_anomaly(m, e)
    cos_e, sin_e, b = np.cos(big_e), np.sin(big_e), np.sqrt(1.0 - e**2)
    r = a * (1.0 - e * cos_e)
    qx, qy = a * (cos_e - e), a * b * sin_e
    v = np.sqrt(a) / r
    px, py = -v * sin_e, v * b * cos_e
    c, s = np.cos(omega), np.sin(omega)
    return np.stack([c * qx - s * qy, s * qx + c * qy, c * px - s * py, s * px + c * py], axis=-1).reshape(-1, 4)


def reference_splits(
    system: str,
    train_trajectories: int | None = None,
    train_steps: int | None = None,
    test_trajectories: int | None = None,
    test_steps: int = 20,
    noise_var: float = 1e-3,
) -> dict[str, SplitSpec | KeplerSplitSpec]:
    """The reference's splits for ``system`` (tables in the module docstring), sizes overridable.

    ``test_trajectories=None``: 100 (50 for ``kepler``). ``kepler`` gets :class:`KeplerSplitSpec` s
    (bound orbits; ``moved`` = orientations ``ω ∈ [π, 2π)`` unseen in training), the others
    :class:`SplitSpec` s.
    """
    if system == "kepler":
        n = 50 if test_trajectories is None else test_trajectories
        return {
            "train": KeplerSplitSpec(train_trajectories or 50, train_steps or 20, noise_var=noise_var),
            "test": KeplerSplitSpec(n, test_steps),
            "wider": KeplerSplitSpec(n, test_steps, a_range=(0.8, 2.5), e_range=(0.0, 0.8)),
            "moved": KeplerSplitSpec(n, test_steps, omega_range=(math.pi, 2 * math.pi)),
        }
    big = system != "sho"
    tt = train_trajectories or (200 if big else 7)
    ts = train_steps or (50 if big else 4)
    test = dict(trajectories=100 if test_trajectories is None else test_trajectories, steps=test_steps, p_scale=0.2)
    return {
        "train": SplitSpec(tt, ts, 1.0, 0.0, 0.5, noise_var),
        "test": SplitSpec(q_scale=1.0, **test),
        "wider": SplitSpec(q_scale=3.0, **test),
        "moved": SplitSpec(q_scale=1.0, q_shift=1.0, **test),
    }


def cache_key(settings: dict[str, Any]) -> str:
    """SHA-256 (first 20 hex digits) of the canonical JSON of ``settings`` (every setting)."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:20]


def generate_split(
    system: HamiltonianSystem,
    spec: SplitSpec | KeplerSplitSpec,
    dt: float,
    seed: int,
    split_index: int,
    rtol: float = 1e-10,
    atol: float = 1e-10,
) -> np.ndarray:
    """Clean trajectories ``(trajectories, steps + 1, M)`` float64 of one split (own seed stream).

    The initial states are ``spec.initial_states(rng, system)``: a new initial-state distribution
    is a spec class with ``trajectories``, ``steps``, ``noise_var``, ``validate(split)``,
    ``initial_states(rng, system)`` and a class attribute ``kind`` naming it in the cache key
    (as :class:`KeplerSplitSpec`).
    """
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(split_index), 0]))
    return integrate(system, spec.initial_states(rng, system), dt, spec.steps, rtol, atol)


def load_or_generate(
    system: HamiltonianSystem,
    spec: SplitSpec | KeplerSplitSpec,
    dt: float,
    seed: int,
    split: str,
    cache_dir: str | Path | None = None,
    rtol: float = 1e-10,
    atol: float = 1e-10,
) -> tuple[np.ndarray, Path | None]:
    """Clean trajectories of ``split``, from the cache when present (``cache_dir=False``: no cache).

    The file name is ``<system>-<split>-<hash>.npz`` with the hash of every setting
    (system and its parameters, split settings, dt, seed, split, tolerances, integrator, version,
    and the spec's ``kind`` for specs other than :class:`SplitSpec`, e.g. ``"kepler-orbits"``);
    the settings are stored in the file too and checked on load.
    """
    idx = SPLITS.index(split)
    settings = {
        "system": system.name,
        "system_params": system.params,
        "split": split,
        "spec": dataclasses.asdict(spec),
        "dt": float(dt),
        "seed": int(seed),
        "rtol": rtol,
        "atol": atol,
        "integrator": "scipy-DOP853",
        "version": DATA_VERSION,
    }
    kind = getattr(spec, "kind", None)
    if kind is not None:  # absent for SplitSpec: the reference systems' keys stay as they were
        settings["initial_states"] = kind
    path = None
    if cache_dir is not False:
        root = Path(os.path.expanduser(str(cache_dir if cache_dir is not None else DEFAULT_CACHE_DIR)))
        path = root / f"{system.name}-{split}-{cache_key(settings)}.npz"
        if path.exists():
            try:
                with np.load(path, allow_pickle=False) as f:
                    if json.loads(str(f["settings"])) == json.loads(json.dumps(settings)):
                        traj = f["trajectories"]
                        check_trajectories(system.name, traj)
                        return traj, path
            except (OSError, ValueError, KeyError):
                pass  # unreadable or stale: regenerate
    traj = generate_split(system, spec, dt, seed, idx, rtol, atol)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}.npz")
        np.savez(tmp, trajectories=traj, settings=json.dumps(settings))
        os.replace(tmp, path)
    return traj, path


def pairs(traj: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(x_t, x_{t+dt})`` pairs from ``(T, steps + 1, M)`` → two ``(T·steps, M)`` arrays."""
    m = traj.shape[-1]
    return traj[:, :-1].reshape(-1, m), traj[:, 1:].reshape(-1, m)


# ---------------------------------------------------------------------------------------------
# Dataset
# ---------------------------------------------------------------------------------------------
@dataclass
class PhysicsDataset:
    """States ``x`` and next states ``y`` (``dt`` later) per split, float32 tensors ``(N, M)``.

    Attributes: ``x_train, y_train`` (targets noisy when the train split has ``noise_var > 0``),
    ``x_test, y_test``, ``x_wider, y_wider``, ``x_moved, y_moved``; ``trajectories[split]``
    (clean float64 arrays ``(T, steps+1, M)``), ``system``, ``dt``, ``splits`` (the
    :class:`SplitSpec` s or :class:`KeplerSplitSpec` s), ``seed``, ``cache_files``.
    """

    name: str
    system: HamiltonianSystem
    dt: float
    splits: dict[str, SplitSpec | KeplerSplitSpec]
    seed: int
    trajectories: dict[str, np.ndarray]
    arrays: dict[str, tuple[Tensor, Tensor]]
    cache_files: dict[str, str | None] = field(default_factory=dict)

    def __getattr__(self, attr: str) -> Tensor:
        if attr[:2] in ("x_", "y_") and attr[2:] in self.__dict__.get("arrays", {}):
            return self.arrays[attr[2:]][0 if attr[0] == "x" else 1]
        raise AttributeError(attr)

    @property
    def state_dim(self) -> int:
        return self.system.state_dim

    @property
    def noise_var(self) -> float:
        return self.splits["train"].noise_var

    def split(self, name: str) -> tuple[Tensor, Tensor]:
        """``(x, y)`` of split ``name``."""
        if name not in self.arrays:
            raise ValueError(f"unknown split {name!r}; this dataset has {sorted(self.arrays)}")
        return self.arrays[name]


def make_dataset(
    system: str | HamiltonianSystem,
    *,
    dt: float | None = None,
    seed: int = 0,
    splits: dict[str, SplitSpec | KeplerSplitSpec] | None = None,
    train_trajectories: int | None = None,
    train_steps: int | None = None,
    test_trajectories: int | None = None,
    test_steps: int = 20,
    noise_var: float = 1e-3,
    cache_dir: str | Path | bool | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    train_size: int | None = None,
    test_size: int | None = None,
    **system_kwargs: Any,
) -> PhysicsDataset:
    """Trajectory dataset of ``system`` with the splits ``train/test/wider/moved``.

    Args:
        system: a name in :data:`SYSTEMS` (``system_kwargs`` such as ``n`` go to it) or a
            :class:`HamiltonianSystem`.
        dt: time between a state and its target (default :data:`DEFAULT_DT`: 0.2; 1.0 for
            ``nbody``, 0.5 for ``kepler``).
        seed: base seed; each split uses its own stream derived from it.
        splits: explicit :class:`SplitSpec` (or :class:`KeplerSplitSpec`) per split (default
            :func:`reference_splits` with the size/noise arguments; ``test_trajectories=None``:
            100, 50 for ``kepler``).
        noise_var: variance of the Gaussian noise on the training targets (0: none).
        cache_dir: cache folder (default ``~/.cache/pyro_invariance/physics`` or the environment
            variable ``PYRO_INVARIANCE_CACHE``/physics); ``False`` disables caching.
        rtol, atol: DOP853 tolerances (default :data:`DEFAULT_TOL`: 1e-10; 1e-12 for ``kepler``).
        train_size, test_size: keep the first n pairs of the training split / of every held-out
            split (test, wider, moved), as the image datasets keep a prefix; a positive integer or
            ``None`` (all). ``trajectories`` stay whole.
    """
    sys_ = get_system(system, **system_kwargs) if isinstance(system, str) else system
    if not isinstance(sys_, HamiltonianSystem):
        raise TypeError(f"system must be a name or a HamiltonianSystem, got {type(system).__name__}")
    dt = float(dt if dt is not None else DEFAULT_DT.get(sys_.name, 0.2))
    rtol = DEFAULT_TOL.get(sys_.name, 1e-10) if rtol is None else rtol
    atol = DEFAULT_TOL.get(sys_.name, 1e-10) if atol is None else atol
    check_positive_float("dt", dt)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an integer, got {seed!r}")
    if splits is None:
        splits = reference_splits(sys_.name, train_trajectories, train_steps, test_trajectories, test_steps, noise_var)
    unknown = set(splits) - set(SPLITS)
    if unknown or "train" not in splits:
        raise ValueError(f"splits must include 'train' and only use {SPLITS}, got {sorted(splits)}")
    for what, size in (("train_size", train_size), ("test_size", test_size)):
        check_subset_size(what, size, sys.maxsize)  # bad sizes fail before any integration
    if cache_dir is None and os.environ.get("PYRO_INVARIANCE_CACHE"):
        cache_dir = Path(os.environ["PYRO_INVARIANCE_CACHE"]) / "physics"
    trajectories, arrays, files = {}, {}, {}
    for split, spec in splits.items():
        spec.validate(split)
        traj, path = load_or_generate(sys_, spec, dt, seed, split, cache_dir, rtol, atol)
        x, y = pairs(traj)
        if spec.noise_var > 0:
            rng = np.random.default_rng(np.random.SeedSequence([int(seed), SPLITS.index(split), 1]))
            y = y + math.sqrt(spec.noise_var) * rng.standard_normal(y.shape)
        keep = check_subset_size(
            "train_size" if split == "train" else "test_size", train_size if split == "train" else test_size, len(x)
        )
        trajectories[split] = traj
        arrays[split] = (torch.tensor(x[:keep], dtype=torch.float32), torch.tensor(y[:keep], dtype=torch.float32))
        files[split] = str(path) if path is not None else None
    name = sys_.name + (f"-{sys_.params['n']}" if "n" in sys_.params else "")
    return PhysicsDataset(name, sys_, dt, dict(splits), seed, trajectories, arrays, files)


# ---------------------------------------------------------------------------------------------
# Registry entries
# ---------------------------------------------------------------------------------------------
def sho_dataset(**kwargs: Any) -> PhysicsDataset:
    """Simple harmonic oscillator trajectories (see :func:`make_dataset` for kwargs)."""
    return make_dataset("sho", **kwargs)


def oscillators_dataset(n: int = 3, **kwargs: Any) -> PhysicsDataset:
    """n uncoupled isotropic oscillators (see :func:`make_dataset` for kwargs)."""
    return make_dataset("oscillators", n=n, **kwargs)


def oscillators3_dataset(**kwargs: Any) -> PhysicsDataset:
    """3 uncoupled isotropic oscillators (see :func:`make_dataset` for kwargs)."""
    return make_dataset("oscillators", n=3, **kwargs)


def nbody_dataset(n: int = 3, **kwargs: Any) -> PhysicsDataset:
    """2-d n-body system (see :func:`make_dataset` for kwargs)."""
    return make_dataset("nbody", n=n, **kwargs)


def nbody3_dataset(**kwargs: Any) -> PhysicsDataset:
    """2-d 3-body system (see :func:`make_dataset` for kwargs)."""
    return make_dataset("nbody", n=3, **kwargs)


def kepler_dataset(**kwargs: Any) -> PhysicsDataset:
    """2-d Kepler problem, bound orbits (see :func:`make_dataset` for kwargs; 50×20 train pairs, dt 0.5)."""
    return make_dataset("kepler", **kwargs)


def _registered(name: str, make: Callable[..., PhysicsDataset]) -> Callable[..., PhysicsDataset]:
    """``make`` with the keywords every registered dataset takes: ``data_dir`` / ``root`` are
    refused unless ``None`` (trajectories are generated, not read; the cache is ``cache_dir``),
    ``download`` is ignored (nothing is downloaded)."""

    def factory(*, data_dir: Any = None, root: Any = None, download: bool = False, **kwargs: Any) -> PhysicsDataset:
        refuse_data_dir(name, data_dir=data_dir, root=root)
        return make(**kwargs)

    factory.__name__ = factory.__qualname__ = make.__name__
    factory.__doc__ = make.__doc__
    return factory


_REGISTERED = (
    ("sho", sho_dataset, "simple harmonic oscillator trajectories (Noether's razor; 7×4 train pairs)"),
    ("oscillators", oscillators_dataset, "n uncoupled isotropic oscillators (kwarg n, default 3)"),
    ("oscillators-3", oscillators3_dataset, "3 uncoupled isotropic oscillators (200×50 train pairs)"),
    ("nbody", nbody_dataset, "2-d n-body softened gravity (kwarg n, default 3)"),
    ("nbody-3", nbody3_dataset, "2-d 3-body softened gravity (200×50 train pairs, dt 1.0)"),
    ("kepler", kepler_dataset, "2-d Kepler problem, bound orbits; moved split = unseen orientations"),
)
for _name, _make, _summary in _REGISTERED:
    DATASETS.register(_name, summary=_summary, kind=("dynamics", "vectors"))(_registered(_name, _make))
del _name, _make, _summary
