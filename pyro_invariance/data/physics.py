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
===============  ======================================================================  ==========

State layout: ``x = (q, p)``; for the 2-d n-body system ``q = (q_1x, q_1y, q_2x, q_2y, ...)`` and
``p`` likewise.

Data (docs/methods.md §4): initial ``q ~ q_shift + q_scale·N(0, I)``, ``p ~ p_scale·N(0, I)``; each
trajectory is integrated in float64 by SciPy's DOP853 (``rtol = atol = 1e-10``) and sampled every
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch import Tensor

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
        p = x[..., 2 * n:]
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
    return HamiltonianSystem("nbody", 2 * n, _nbody_hamiltonian(n, float(softening)), {"n": n, "softening": float(softening)})


SYSTEMS: dict[str, Callable[..., HamiltonianSystem]] = {"sho": sho, "oscillators": oscillators, "nbody": nbody}


def get_system(name: str, **kwargs: Any) -> HamiltonianSystem:
    """Build a built-in system by name (``sho``, ``oscillators``, ``nbody``)."""
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
    from scipy.integrate import solve_ivp

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


def reference_splits(
    system: str,
    train_trajectories: int | None = None,
    train_steps: int | None = None,
    test_trajectories: int = 100,
    test_steps: int = 20,
    noise_var: float = 1e-3,
) -> dict[str, SplitSpec]:
    """The reference's splits for ``system`` (table in the module docstring), sizes overridable."""
    big = system != "sho"
    tt = train_trajectories or (200 if big else 7)
    ts = train_steps or (50 if big else 4)
    test = dict(trajectories=test_trajectories, steps=test_steps, p_scale=0.2)
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
    spec: SplitSpec,
    dt: float,
    seed: int,
    split_index: int,
    rtol: float = 1e-10,
    atol: float = 1e-10,
) -> np.ndarray:
    """Clean trajectories ``(trajectories, steps + 1, M)`` float64 of one split (own seed stream)."""
    rng = np.random.default_rng(np.random.SeedSequence([int(seed), int(split_index), 0]))
    d = system.dof
    q = spec.q_shift + spec.q_scale * rng.standard_normal((spec.trajectories, d))
    p = spec.p_scale * rng.standard_normal((spec.trajectories, d))
    return integrate(system, np.concatenate([q, p], axis=1), dt, spec.steps, rtol, atol)


def load_or_generate(
    system: HamiltonianSystem,
    spec: SplitSpec,
    dt: float,
    seed: int,
    split: str,
    cache_dir: str | Path | None = None,
    rtol: float = 1e-10,
    atol: float = 1e-10,
) -> tuple[np.ndarray, Path | None]:
    """Clean trajectories of ``split``, from the cache when present (``cache_dir=False``: no cache).

    The file name is ``<system>-<split>-<hash>.npz`` with the hash of every setting
    (system and its parameters, split settings, dt, seed, split, tolerances, integrator, version);
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
    :class:`SplitSpec` s), ``seed``, ``cache_files``.
    """

    name: str
    system: HamiltonianSystem
    dt: float
    splits: dict[str, SplitSpec]
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
    splits: dict[str, SplitSpec] | None = None,
    train_trajectories: int | None = None,
    train_steps: int | None = None,
    test_trajectories: int = 100,
    test_steps: int = 20,
    noise_var: float = 1e-3,
    cache_dir: str | Path | bool | None = None,
    rtol: float = 1e-10,
    atol: float = 1e-10,
    train_size: int | None = None,
    test_size: int | None = None,
    **system_kwargs: Any,
) -> PhysicsDataset:
    """Trajectory dataset of ``system`` with the splits ``train/test/wider/moved``.

    Args:
        system: a name in :data:`SYSTEMS` (``system_kwargs`` such as ``n`` go to it) or a
            :class:`HamiltonianSystem`.
        dt: time between a state and its target (default 0.2; 1.0 for ``nbody``).
        seed: base seed; each split uses its own stream derived from it.
        splits: explicit :class:`SplitSpec` per split (default :func:`reference_splits` with the
            size/noise arguments).
        noise_var: variance of the Gaussian noise on the training targets (0: none).
        cache_dir: cache folder (default ``~/.cache/pyro_invariance/physics`` or the environment
            variable ``PYRO_INVARIANCE_CACHE``/physics); ``False`` disables caching.
        train_size, test_size: keep the first n pairs of the training split / of every held-out
            split (test, wider, moved), as the image datasets keep a prefix; a positive integer or
            ``None`` (all). ``trajectories`` stay whole.
    """
    sys_ = get_system(system, **system_kwargs) if isinstance(system, str) else system
    if not isinstance(sys_, HamiltonianSystem):
        raise TypeError(f"system must be a name or a HamiltonianSystem, got {type(system).__name__}")
    dt = float(dt if dt is not None else (1.0 if sys_.name == "nbody" else 0.2))
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
)
for _name, _make, _summary in _REGISTERED:
    DATASETS.register(_name, summary=_summary)(_registered(_name, _make))
del _name, _make, _summary
