"""Reference posteriors in the spirit of posteriordb: NUTS draws for small catalogue entries.

An entry (:class:`ReferenceEntry`) is *model × data* with a small metadata record — what it is,
which paper and figure it comes from, which symmetry is expected, and the symmetry parameters held
fixed. With ``symmetry_prior`` unset, η (λ for basis regression) is a hyperparameter chosen by the
marginal likelihood, not a latent, so the reference posterior is conditional on the stated values
(``fixed``); an entry built with ``symmetry_prior`` (issue 15: ``basis-regression-lambda``,
``invariant-mlp-digits-eta``) makes η a latent site that NUTS samples jointly with the weights, and
holds nothing fixed (``fixed = {}``). :func:`run_nuts` samples the entry's latent sites with Pyro's
NUTS; :func:`save_reference` stores the draws compactly next to this module::

    pyro_invariance/diagnostics/reference_posteriors/<name>.npz    float32 draws per site, (chain, draw, *site shape)
    pyro_invariance/diagnostics/reference_posteriors/<name>.json   sampler settings, seed, R-hat / ESS, wall time,
                                                        data settings and fingerprint, versions, date

and :func:`load_reference` reads them back (checking that the two files agree). The stored
references pass the diagnostics of Vehtari et al. (2021) as ArviZ computes them: rank-normalised
split R-hat < :data:`RHAT_MAX` (1.01) and bulk ESS > :data:`ESS_BULK_MIN` (400) for every scalar.

Scoring a guide against a reference: :func:`score_guide` draws from the guide and compares with
:func:`score_draws` — per coordinate, the standardised mean error ``|mean_q − mean_ref| / sd_ref``
and the log variance ratio ``log(var_q / var_ref)``; jointly, a sliced Wasserstein-2 distance in
the reference's standardised coordinates (averaged over random directions) and the mean 1-D
Wasserstein-1 distance per coordinate (``scipy.stats.wasserstein_distance``).

Regenerate (the four fixed-η entries: 21 minutes on one thread of the project's shared 2-core machine
under a load of 4–6 — basis-regression 2.8, rotation-toy-2d-full 5.2, rotation-toy-2d-none 4.0,
invariant-mlp-digits 9.1 minutes; the two latent-η entries on the same machine under a load of 3–8
from other jobs — basis-regression-lambda 13.2 minutes, invariant-mlp-digits-eta 52 minutes (4 chains
of 12–15 minutes); ``--quick`` is a smoke test that must be written elsewhere with ``--out``)::

    python -m pyro_invariance.diagnostics.reference regenerate [--name NAME ...] [--quick --out DIR]
    python -m pyro_invariance.diagnostics.reference check      # recompute R-hat / ESS from the stored draws
    python -m pyro_invariance.diagnostics.reference score [--name NAME] [--guide GUIDE ...] [--steps N]
    python -m pyro_invariance.diagnostics.reference list
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import math
import platform
import sys
import time
import warnings
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch
from torch import Tensor

from pyro_invariance.models.base import symmetry_summary
from pyro_invariance.registry import DATASETS, MODELS, UnknownNameError
from pyro_invariance._pyro_scope import pyro_scope

__all__ = [
    "ENTRIES",
    "ESS_BULK_MIN",
    "REFERENCE_DIR",
    "RHAT_MAX",
    "NUTSSettings",
    "Reference",
    "ReferenceEntry",
    "ReferenceFileError",
    "diagnose",
    "entry",
    "fit_and_score",
    "guide_draws",
    "load_reference",
    "main",
    "names",
    "run_nuts",
    "save_reference",
    "score_draws",
    "score_guide",
    "sliced_wasserstein2",
]

#: Where the stored references live (package data).
REFERENCE_DIR = Path(__file__).resolve().parent / "reference_posteriors"
#: Every scalar of a stored reference has rank-normalised split R-hat below this ...
RHAT_MAX = 1.01
#: ... and bulk effective sample size above this.
ESS_BULK_MIN = 400.0
#: File format version written into the metadata.
FORMAT_VERSION = 1


class ReferenceFileError(ValueError):
    """A stored reference is missing, corrupt or inconsistent with its metadata."""


# ------------------------------------------------------------------------------------------------
# the catalogue


@dataclass(frozen=True)
class NUTSSettings:
    """Sampler settings of a reference (all of them are stored in the metadata).

    Chains run one after another, each as its own ``pyro.infer.MCMC(NUTS(...), num_chains=1)``
    seeded with ``seed + chain`` and started from ``init_to_uniform(radius=init_radius)`` in the
    unconstrained space (over-dispersed starts, as R-hat needs). ``full_mass`` adapts a dense mass
    matrix during warm-up (the basis-regression posterior has condition number ≈ 100).
    ``jit_compile`` traces the potential energy with the PyTorch JIT (4–5× faster per gradient
    on these models; the traced and untraced potentials and gradients agree to float32 precision,
    which needs a model that is deterministic given its latents, e.g. ``sampling="deterministic"``).
    ``thin`` keeps every ``thin``-th draw.
    """

    num_chains: int = 4
    warmup_steps: int = 500
    num_samples: int = 500
    thin: int = 1
    target_accept_prob: float = 0.8
    max_tree_depth: int = 10
    full_mass: bool = True
    init_radius: float = 2.0
    jit_compile: bool = True
    seed: int = 0

    def validate(self) -> None:
        for name in ("num_chains", "warmup_steps", "num_samples", "thin", "max_tree_depth"):
            value = getattr(self, name)
            minimum = 0 if name == "warmup_steps" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
        if self.num_samples // self.thin < 4:
            raise ValueError("num_samples // thin must leave at least 4 draws per chain")
        if not 0.0 < float(self.target_accept_prob) < 1.0:
            raise ValueError(f"target_accept_prob must lie in (0, 1), got {self.target_accept_prob!r}")
        if not float(self.init_radius) > 0.0:
            raise ValueError(f"init_radius must be positive, got {self.init_radius!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")


#: Smoke-test settings of ``regenerate --quick`` (they do not reach the R-hat / ESS thresholds).
QUICK = {"num_chains": 2, "warmup_steps": 100, "num_samples": 100, "thin": 1}


@dataclass(frozen=True)
class ReferenceEntry:
    """One reference: model × data, the fixed symmetry parameters and the sampler settings.

    Attributes:
        name: file stem of the stored reference.
        model, model_kwargs: a registered model (:data:`pyro_invariance.registry.MODELS`) and its
            arguments; symmetry parameters are fixed there (``learn_symmetry=False``) or latent
            (``symmetry_prior=...``): the model may have no learnable parameters.
        data, data_kwargs: a registered dataset (training split used) or one of
            :data:`DATA_SOURCES` (a function returning ``(x, y)``).
        description: one line: what the entry is.
        paper: where it comes from (paper / talk, figure or table).
        symmetry: the symmetry the entry is about and the value it is held at.
        fixed: the symmetry parameters held fixed, by the model's ``symmetry_summary()`` names
            (checked against the built model); empty when η is latent (``symmetry_prior``: its
            sites, ``model.symmetry_sites()``, are sampled with the rest).
        nuts: :class:`NUTSSettings`.
    """

    name: str
    model: str
    model_kwargs: Mapping[str, Any]
    data: str
    data_kwargs: Mapping[str, Any]
    description: str
    paper: str
    symmetry: str
    fixed: Mapping[str, float]
    nuts: NUTSSettings = field(default_factory=NUTSSettings)

    def build(self) -> tuple[Any, Tensor, Tensor]:
        """``(model, x, y)``: the model with its symmetry parameters fixed (or latent), and the training data."""
        from pyro_invariance.catalogue import model_kwargs_for
        from pyro_invariance.data.arrays import train_arrays

        if self.data in DATA_SOURCES:
            dataset: Any = None
            x, y = DATA_SOURCES[self.data](**dict(self.data_kwargs))
        else:
            dataset = DATASETS.get(self.data, **dict(self.data_kwargs))
            x, y = train_arrays(dataset)
        model = MODELS.get(self.model, **model_kwargs_for(self.model, dataset, **dict(self.model_kwargs)))
        model.eval()
        params = {k: float(v) for k, v in symmetry_summary(model).items()}
        for key, value in self.fixed.items():
            if key not in params or not math.isclose(params[key], value, rel_tol=1e-6, abs_tol=1e-6):
                raise ValueError(
                    f"reference {self.name!r}: model symmetry parameter {key!r} is {params.get(key)}, "
                    f"the entry says it is fixed at {value}"
                )
        if any(p.requires_grad for p in model.parameters()):
            names_ = [n for n, p in model.named_parameters() if p.requires_grad]
            raise ValueError(
                f"reference {self.name!r}: the model has learnable parameters {names_}; a reference posterior "
                "needs every hyperparameter fixed (learn_symmetry=False, prior='fixed') or η latent (symmetry_prior=...)"
            )
        return model, x, y

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["model_kwargs"] = dict(self.model_kwargs)
        out["data_kwargs"] = dict(self.data_kwargs)
        out["fixed"] = dict(self.fixed)
        return out


def _symmetric_toy_1d(**kwargs: Any) -> tuple[Tensor, Tensor]:
    from pyro_invariance.models.basis_regression import make_symmetric_toy

    return make_symmetric_toy(**kwargs)


#: Data sources that are not registered datasets (name -> function returning ``(x, y)``).
DATA_SOURCES: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "symmetric-toy-1d": _symmetric_toy_1d,  # models.basis_regression.make_symmetric_toy
}

_TOY2D_MODEL = {"hidden": 16, "lengthscale": 0.75, "num_transforms": 32, "sampling": "deterministic",
                "prior_scale": 3.0, "learn_symmetry": False}  # fmt: skip

#: The catalogue of references, by name.
ENTRIES: dict[str, ReferenceEntry] = {
    e.name: e
    for e in (
        ReferenceEntry(
            name="basis-regression",
            model="basis-regression",
            model_kwargs={"basis": "rbf", "num_features": 8, "lengthscale": 0.6, "noise_scale": 0.3,
                          "prior_scale": 1.0, "eta_init": 0.5, "learn_symmetry": False},  # fmt: skip
            data="symmetric-toy-1d",
            data_kwargs={"n": 20, "seed": 0, "noise": 0.3, "even": True},
            description="Bayesian linear regression on 8 RBF features symmetrised with λ = 0.5, 20 noisy "
            "points of cos(2x); Gaussian posterior known exactly (BasisRegression.posterior), correlations up to 0.91",
            paper="talk 000 (papers/000), slides 'Inductive bias in basis functions'",
            symmetry="reflection x → −x, held at λ = 0.5 (halfway to the fully symmetrised basis, λ = 1)",
            fixed={"lambda": 0.5},
        ),
        ReferenceEntry(
            name="rotation-toy-2d-full",
            model="rotation-toy-2d",
            model_kwargs={**_TOY2D_MODEL, "eta_init": math.pi},
            data="rotation-toy-2d",
            data_kwargs={},
            description="Bayesian logistic regression on 16 random Fourier features of 2-D points averaged over "
            "32 rotations covering the circle; 40 points on two rings in a 90° sector",
            paper="paper 003 (papers/003), Figure 1, right panel (strict invariance)",
            symmetry="rotation SO(2), held at η = π (full invariance)",
            fixed={"rot": math.pi},
        ),
        ReferenceEntry(
            name="rotation-toy-2d-none",
            model="rotation-toy-2d",
            model_kwargs={**_TOY2D_MODEL, "eta_init": 0.0},
            data="rotation-toy-2d",
            data_kwargs={},
            description="as rotation-toy-2d-full without invariance: Bayesian logistic regression on 16 random "
            "Fourier features of the 2-D points",
            paper="paper 003 (papers/003), Figure 1, left panel (no invariance)",
            symmetry="none, η = 0",
            fixed={"rot": 0.0},
        ),
        ReferenceEntry(
            name="invariant-mlp-digits",
            model="invariant-mlp",
            model_kwargs={"hidden": 8, "activation": "rff", "symmetry": "rotation", "learn_symmetry": False,
                          "eta_init": math.pi, "num_transforms": 8, "sampling": "deterministic",
                          "prior": "fixed", "prior_scale": 1.0},  # fmt: skip
            data="rotated-digits",
            data_kwargs={"train_size": 200, "test_size": 50},
            description="InvariantMLP read-out (10×8 weights + 10 biases) over 8 RFF features averaged over 8 "
            "rotations on a fixed grid, 200 rotated 8×8 digits",
            paper="paper 003 (papers/003), Table 1 setting at a tiny size (fixed rotation invariance)",
            symmetry="rotation, held at η_rot = π (full invariance; a linspace grid of 8 angles over [−π, π])",
            fixed={"rot": math.pi},
            # A dense mass matrix is estimated badly in the short warm-up windows (at H = 16, 170
            # latents: tree depth 10 after the first window); the posterior is well conditioned
            # (Laplace: condition number 26 at H = 16, 30 at H = 8), so a diagonal one is enough
            # (≈ 15 gradients per draw). At H = 16 with 4×400 stored draws the largest of 170 R-hats
            # was 1.013 (ESS ≈ 1100: the maximum over many scalars of R-hat's sampling noise), so the
            # entry uses H = 8 (90 latents), a longer warm-up and 700 stored draws per chain (≈ 1 MB).
            nuts=NUTSSettings(full_mass=False, warmup_steps=1000, num_samples=1400, thin=2),
        ),
        # η latent (issue 15): joint NUTS over the weights and the symmetry parameter.
        #
        # Data setting, chosen from the shape of the exact p(λ | D) alone (quadrature of the closed-form
        # evidence, diagnostics.symmetry_posterior.exact_symmetry_posterior; no variational fit was
        # looked at). The evidence is even about λ = 1 and depends on λ only through the prior
        # variance (1 − λ)² of the odd part of f, so with even data the posterior is symmetric about 1
        # and its shape at 1 is set by whether the odd part of the *noise* looks like signal: the
        # existing entry's 20 points (seed 0) give two modes at λ ≈ 0.90 and 1.10 (a dip at 1). Over
        # n = 40..100 and data seeds 0-2 the posterior is unimodal for 9 of 21 sets; with the entry's
        # seed 0, n = 60 has the strongest curvature at λ = 1 (unimodal, mode 1, sd 0.152, density
        # at 1 / at 0.9 / at 0.7 = 4.15 / 1.93 / 0.21: a sharp peak with heavy shoulders, excess
        # kurtosis 5.8, not flat-topped); n = 50 (seed 0) is bimodal, n = 70 and 80 are unimodal with
        # 3× and 4.6× less curvature at 1.
        ReferenceEntry(
            name="basis-regression-lambda",
            model="basis-regression",
            model_kwargs={"basis": "rbf", "num_features": 8, "lengthscale": 0.6, "noise_scale": 0.3,
                          "prior_scale": 1.0, "symmetry_prior": "uniform"},  # fmt: skip
            data="symmetric-toy-1d",
            data_kwargs={"n": 60, "seed": 0, "noise": 0.3, "even": True},
            description="basis-regression with λ latent, λ ~ U(0, 2): joint posterior of 8 RBF weights and λ, "
            "60 noisy points of cos(2x); p(λ | D) known by quadrature (exact_symmetry_posterior): unimodal at "
            "λ = 1 (symmetric about 1, sd 0.15, heavy-tailed) for these data, where 20 points give two modes",
            paper="talk 000 (papers/000), slides 'Can we learn the inductive bias?' (λ by the marginal "
            "likelihood; here integrated over, issue 15)",
            symmetry="reflection x → −x, λ latent with a uniform prior on [0, 2] (λ = 1: fully symmetrised basis)",
            fixed={},
            # The odd part of the weights is pinned by the data with scale ∝ 1/|1 − λ| and free at λ = 1:
            # a funnel in (λ, weight). Default settings gave 62 divergences and λ's bulk ESS 147 (4×500
            # draws), target_accept_prob 0.95 still 9; 0.99 with a 1000-step warm-up none (ESS 1334 of
            # 4×500). 4×1500 draws bring λ's ESS to the thousands that a ±10 % check of its sd needs
            # (its posterior has excess kurtosis 5.8: the sd's relative Monte-Carlo error is ≈ √(κ − 1)/(2√ESS)).
            nuts=NUTSSettings(target_accept_prob=0.99, warmup_steps=1000, num_samples=1500),
        ),
        ReferenceEntry(
            name="invariant-mlp-digits-eta",
            model="invariant-mlp",
            model_kwargs={"hidden": 8, "activation": "rff", "symmetry": "rotation", "learn_symmetry": True,
                          "symmetry_prior": "uniform", "num_transforms": 32, "sampling": "deterministic",
                          "prior": "fixed", "prior_scale": 1.0},  # fmt: skip
            data="rotated-digits",
            data_kwargs={"train_size": 200, "test_size": 50},
            description="invariant-mlp-digits with the rotation range η latent, η ~ U(0, π), and 32 rotations "
            "on the grid: joint posterior of the read-out (10×8 weights + 10 biases) and η, 200 rotated 8×8 digits",
            paper="paper 003 (papers/003), Table 1 setting at a tiny size (invariance integrated over, issue 15)",
            symmetry="rotation, η_rot latent with a uniform prior on [0, π] (angles η·linspace(−1, 1, 32))",
            fixed={},
            # 32 transforms instead of invariant-mlp-digits' 8: with 8 angles on the grid η·linspace(−1, 1, 8)
            # the posterior of η is rugged and multi-modal (bilinear interpolation of 8×8 filters at few
            # angles): the log evidence over η (read-out integrated by Laplace) has local maxima at η ≈ 1.40,
            # 1.96 and 2.43 with dips of up to 6 nats between them, joint modes sit at η = 1.95 and 2.92, and
            # two short NUTS chains stayed at η ≈ 1.97 and 2.44. With 16 angles the dips are ≤ 2 nats, with 32
            # ≤ 0.7 (a plateau over η ≈ 2.4–3.1); two chains of 300 draws agreed (η means 2.78, 2.85). A
            # gradient costs 6.8 ms against 5.0 at 8 angles, but the roughness left in η keeps the step size
            # ≈ 0.05–0.07 (tree depth ≈ 7; 0.25 at fixed η) and η's bulk ESS at ≈ 0.26 per draw, hence the
            # diagonal mass matrix, 700 warm-up steps and 4×600 draws (0.8 MB stored).
            nuts=NUTSSettings(full_mass=False, warmup_steps=700, num_samples=600),
        ),
    )
}


def names() -> list[str]:
    """Names of the catalogue's references, in catalogue order."""
    return list(ENTRIES)


def entry(name: str) -> ReferenceEntry:
    """The entry ``name``; an unknown name raises :class:`~pyro_invariance.registry.UnknownNameError`."""
    if not isinstance(name, str) or name not in ENTRIES:
        import difflib

        close = difflib.get_close_matches(str(name), list(ENTRIES), n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise UnknownNameError(f"unknown reference {name!r}.{hint} Known references: {', '.join(ENTRIES)}")
    return ENTRIES[name]


# ------------------------------------------------------------------------------------------------
# draws and diagnostics


@dataclass(eq=False)
class Reference:
    """Reference draws and their metadata.

    Attributes:
        name: the entry name.
        draws: site → float array ``(chain, draw, *site shape)``.
        metadata: the JSON record (see the module docstring).
    """

    name: str
    draws: dict[str, np.ndarray]
    metadata: dict[str, Any]

    @property
    def entry(self) -> ReferenceEntry:
        return entry(self.name)

    @property
    def sites(self) -> list[str]:
        return list(self.draws)

    @property
    def num_chains(self) -> int:
        return int(next(iter(self.draws.values())).shape[0])

    @property
    def num_draws(self) -> int:
        """Draws per chain."""
        return int(next(iter(self.draws.values())).shape[1])

    def flat(self, chains: Sequence[int] | None = None) -> np.ndarray:
        """All scalars side by side: ``(chains·draws, D)`` in site order (float64)."""
        parts = []
        for value in self.draws.values():
            v = value if chains is None else value[list(chains)]
            parts.append(v.reshape(v.shape[0] * v.shape[1], -1).astype(np.float64))
        return np.concatenate(parts, axis=1)

    def mean(self) -> dict[str, np.ndarray]:
        return {k: v.astype(np.float64).mean(axis=(0, 1)) for k, v in self.draws.items()}

    def var(self) -> dict[str, np.ndarray]:
        return {k: v.astype(np.float64).var(axis=(0, 1), ddof=1) for k, v in self.draws.items()}


def diagnose(draws: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """R-hat (rank-normalised split), bulk and tail ESS per scalar, with ArviZ.

    Each scalar's ``(chain, draw)`` array goes to ``az.rhat`` / ``az.ess`` on its own (a 2-D array
    means ``(chain, draw)`` in ArviZ 0.x and 1.x alike; tail ESS with ``prob=(0.05, 0.95)``, the
    0.x default, which 1.x needs spelled out — values checked equal on ArviZ 0.23.4 and 1.3.0).

    Returns:
        ``{"rhat_max", "ess_bulk_min", "ess_tail_min", "sites": {site: {...same...}}, "per_scalar":
        {site: {"rhat": [...], "ess_bulk": [...], "ess_tail": [...]}}}``.
    """
    import arviz as az

    out: dict[str, Any] = {"sites": {}, "per_scalar": {}}
    for site, value in draws.items():
        arr = np.asarray(value, dtype=np.float64)
        if arr.ndim < 2 or arr.shape[0] < 2 or arr.shape[1] < 4:
            raise ValueError(f"site {site!r}: need draws of shape (chain >= 2, draw >= 4, ...), got {arr.shape}")
        flat = arr.reshape(arr.shape[0], arr.shape[1], -1)
        rhat, bulk, tail = [], [], []
        for j in range(flat.shape[2]):
            a = flat[:, :, j]
            rhat.append(float(az.rhat(a)))
            bulk.append(float(az.ess(a, method="bulk")))
            tail.append(float(az.ess(a, method="tail", prob=(0.05, 0.95))))  # 1.x needs prob; 0.x's default
        out["per_scalar"][site] = {"rhat": rhat, "ess_bulk": bulk, "ess_tail": tail}
        out["sites"][site] = {"rhat_max": max(rhat), "ess_bulk_min": min(bulk), "ess_tail_min": min(tail)}
    sites = out["sites"].values()
    out["rhat_max"] = max(s["rhat_max"] for s in sites)
    out["ess_bulk_min"] = min(s["ess_bulk_min"] for s in sites)
    out["ess_tail_min"] = min(s["ess_tail_min"] for s in sites)
    return out


def passes(diagnostics: Mapping[str, Any]) -> bool:
    """R-hat < :data:`RHAT_MAX` and bulk ESS > :data:`ESS_BULK_MIN` for every scalar."""
    return bool(diagnostics["rhat_max"] < RHAT_MAX and diagnostics["ess_bulk_min"] > ESS_BULK_MIN)


def _fingerprint(x: Tensor, y: Tensor) -> str:
    """sha256 of the data (float32 / int64 bytes): tells whether the data regenerate identically."""
    h = hashlib.sha256()
    for t in (x, y):
        a = t.detach().cpu()
        a = a.to(torch.float32) if a.is_floating_point() else a.to(torch.int64)
        h.update(str(tuple(a.shape)).encode())
        h.update(a.contiguous().numpy().tobytes())
    return h.hexdigest()


def _versions() -> dict[str, str]:
    import arviz
    import pyro

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "pyro": pyro.__version__,
        "arviz": arviz.__version__,
        "numpy": np.__version__,
        "machine": platform.machine(),
    }


@pyro_scope()
def run_nuts(
    ref: str | ReferenceEntry,
    *,
    num_chains: int | None = None,
    warmup_steps: int | None = None,
    num_samples: int | None = None,
    thin: int | None = None,
    seed: int | None = None,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> Reference:
    """NUTS draws of an entry's latent sites, with diagnostics and metadata.

    Keyword arguments override the entry's :class:`NUTSSettings`. Chains run sequentially (one
    ``MCMC(NUTS(model), num_chains=1)`` per chain, seed ``seed + chain``), so results do not
    depend on the number of CPUs. Draws are stored as float32.
    """
    import pyro
    from pyro.infer import MCMC, NUTS
    from pyro.infer.autoguide.initialization import init_to_uniform

    e = entry(ref) if isinstance(ref, str) else ref
    overrides = {"num_chains": num_chains, "warmup_steps": warmup_steps, "num_samples": num_samples,
                 "thin": thin, "seed": seed}  # fmt: skip
    settings = dataclasses.replace(e.nuts, **{k: v for k, v in overrides.items() if v is not None})
    settings.validate()
    if settings.num_chains < 2:
        raise ValueError("R-hat needs at least 2 chains")
    model, x, y = e.build()

    chains: list[dict[str, np.ndarray]] = []
    per_chain: list[dict[str, Any]] = []
    start = time.perf_counter()
    for c in range(settings.num_chains):
        pyro.set_rng_seed(settings.seed + c)
        kernel = NUTS(
            model,
            target_accept_prob=settings.target_accept_prob,
            max_tree_depth=settings.max_tree_depth,
            full_mass=settings.full_mass,
            init_strategy=init_to_uniform(radius=settings.init_radius),
            jit_compile=settings.jit_compile,
            ignore_jit_warnings=True,
        )
        mcmc = MCMC(kernel, num_samples=settings.num_samples, warmup_steps=settings.warmup_steps,
                    num_chains=1, disable_progbar=not progress)  # fmt: skip
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            # Pyro's jit_compile uses torch.jit.trace, which torch 2.14 marks deprecated; should it go,
            # run with jit_compile=False (same draws up to float rounding, 4–5× slower).
            warnings.filterwarnings("ignore", message=".*torch.jit.trace.*is deprecated", category=FutureWarning)
            mcmc.run(x, y)
        seconds = time.perf_counter() - t0
        samples = mcmc.get_samples()
        chains.append({k: v.detach().cpu().numpy()[:: settings.thin] for k, v in samples.items()})
        diag = mcmc.diagnostics()
        divergences = diag.get("divergences", {})
        accept = diag.get("acceptance rate", {})
        per_chain.append(
            {
                "seed": settings.seed + c,
                "seconds": round(seconds, 2),
                "divergences": int(sum(len(v) for v in divergences.values())) if divergences else 0,
                "acceptance_rate": float(next(iter(accept.values()))) if accept else float("nan"),
                "step_size": float(kernel.step_size),
            }
        )
        if log:
            last = per_chain[-1]
            log(f"  {e.name}: chain {c} {seconds:.1f}s, {last['divergences']} divergences, "
                f"acceptance {last['acceptance_rate']:.2f}, step size {last['step_size']:.3g}")  # fmt: skip
    wall = time.perf_counter() - start

    sites = sorted(chains[0])
    draws = {k: np.stack([ch[k] for ch in chains]).astype(np.float32) for k in sites}
    diagnostics = diagnose(draws)
    metadata = {
        "format_version": FORMAT_VERSION,
        "name": e.name,
        "entry": e.to_dict(),
        "sampler": {
            "algorithm": "NUTS (pyro.infer.NUTS), chains run sequentially",
            **dataclasses.asdict(settings),
            "init_strategy": f"init_to_uniform(radius={settings.init_radius})",
            "chain_seeds": "seed + chain (pyro.set_rng_seed before each chain)",
        },
        "seed": settings.seed,
        "sites": {k: list(v.shape[2:]) for k, v in draws.items()},
        "num_chains": settings.num_chains,
        "draws_per_chain": int(next(iter(draws.values())).shape[1]),
        "dtype": "float32",
        "diagnostics": {
            "rhat_max": diagnostics["rhat_max"],
            "ess_bulk_min": diagnostics["ess_bulk_min"],
            "ess_tail_min": diagnostics["ess_tail_min"],
            "sites": diagnostics["sites"],
            "thresholds": {"rhat_max": RHAT_MAX, "ess_bulk_min": ESS_BULK_MIN},
            "passes": passes(diagnostics),
            "method": "arviz rank-normalised split R-hat, bulk/tail ESS (Vehtari et al. 2021), per scalar",
        },
        "chains": per_chain,
        "divergences": sum(c["divergences"] for c in per_chain),
        "wall_seconds": round(wall, 2),
        "torch_threads": torch.get_num_threads(),
        "data": {
            "source": e.data,
            "kwargs": dict(e.data_kwargs),
            "num_data": int(x.shape[0]),
            "x_shape": list(x.shape),
            "fingerprint_sha256": _fingerprint(x, y),
        },
        "versions": _versions(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": f"python -m pyro_invariance.diagnostics.reference regenerate --name {e.name}",
    }
    return Reference(e.name, draws, metadata)


# ------------------------------------------------------------------------------------------------
# files


def _paths(name: str, directory: str | Path | None) -> tuple[Path, Path]:
    d = Path(directory) if directory is not None else REFERENCE_DIR
    return d / f"{name}.npz", d / f"{name}.json"


def save_reference(reference: Reference, directory: str | Path | None = None) -> tuple[Path, Path]:
    """Write ``<name>.npz`` (compressed float32 draws) and ``<name>.json`` into ``directory``
    (default :data:`REFERENCE_DIR`); returns both paths."""
    npz, meta = _paths(reference.name, directory)
    npz.parent.mkdir(parents=True, exist_ok=True)
    arrays = {k: np.asarray(v, dtype=np.float32) for k, v in reference.draws.items()}
    np.savez_compressed(npz, **arrays)
    meta.write_text(json.dumps(reference.metadata, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return npz, meta


def load_reference(name: str, directory: str | Path | None = None) -> Reference:
    """Stored draws and metadata of reference ``name`` (from ``directory``, default the package's).

    Raises:
        UnknownNameError: ``name`` is not in the catalogue (the message lists the known names).
        FileNotFoundError: a file is missing (the message says how to regenerate it).
        ReferenceFileError: a file is corrupt, or draws and metadata disagree.
    """
    e = entry(name)
    npz, meta = _paths(e.name, directory)
    regen = f"regenerate it with `python -m pyro_invariance.diagnostics.reference regenerate --name {e.name}`"
    for p in (npz, meta):
        if not p.is_file():
            raise FileNotFoundError(f"reference {e.name!r}: {p} does not exist; {regen}")
    try:
        metadata = json.loads(meta.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReferenceFileError(f"reference {e.name!r}: {meta} is not valid JSON ({exc}); {regen}") from None
    if not isinstance(metadata, dict) or "sites" not in metadata or "diagnostics" not in metadata:
        raise ReferenceFileError(f"reference {e.name!r}: {meta} lacks 'sites' / 'diagnostics'; {regen}")
    try:
        with np.load(npz, allow_pickle=False) as f:
            draws = {k: np.asarray(f[k]) for k in f.files}
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, KeyError) as exc:
        raise ReferenceFileError(
            f"reference {e.name!r}: cannot read {npz} ({type(exc).__name__}: {exc}); {regen}"
        ) from None
    expected = {k: tuple(v) for k, v in metadata["sites"].items()}
    if set(draws) != set(expected):
        raise ReferenceFileError(
            f"reference {e.name!r}: {npz} holds sites {sorted(draws)} but {meta} lists {sorted(expected)}; {regen}"
        )
    chains, per_chain = metadata.get("num_chains"), metadata.get("draws_per_chain")
    for k in expected:
        shape = draws[k].shape
        if shape[2:] != expected[k] or (chains and shape[0] != chains) or (per_chain and shape[1] != per_chain):
            raise ReferenceFileError(
                f"reference {e.name!r}: site {k!r} has shape {shape}, metadata says "
                f"({chains}, {per_chain}, {', '.join(map(str, expected[k]))}); {regen}"
            )
        if not np.issubdtype(draws[k].dtype, np.floating) or not np.isfinite(draws[k]).all():
            raise ReferenceFileError(f"reference {e.name!r}: site {k!r} holds non-finite or non-float values; {regen}")
    ordered = {k: draws[k] for k in metadata["sites"]}
    return Reference(e.name, ordered, metadata)


# ------------------------------------------------------------------------------------------------
# scoring


def sliced_wasserstein2(a: np.ndarray, b: np.ndarray, num_projections: int = 200, seed: int = 0,
                        num_quantiles: int = 1000) -> float:  # fmt: skip
    """Sliced Wasserstein-2 distance between samples ``a`` ``(n, D)`` and ``b`` ``(m, D)``.

    ``sqrt(mean_u W2²(u·a, u·b))`` over ``num_projections`` random unit directions ``u``; each 1-D
    W2 compares the two empirical quantile functions on ``num_quantiles`` midpoint levels.
    """
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"need two (n, D) arrays with the same D, got {a.shape} and {b.shape}")
    rng = np.random.default_rng(seed)
    dirs = rng.standard_normal((a.shape[1], num_projections))
    dirs /= np.linalg.norm(dirs, axis=0, keepdims=True)
    levels = (np.arange(num_quantiles) + 0.5) / num_quantiles
    qa, qb = _quantiles(a @ dirs, levels), _quantiles(b @ dirs, levels)
    return float(np.sqrt(np.mean((qa - qb) ** 2)))


def _quantiles(x: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Column-wise empirical quantiles of ``x`` ``(n, K)`` at ``levels``, by one sort and linear
    interpolation between order statistics at positions ``level·n − ½`` (np.quantile with many
    levels partitions once per level, which is slow)."""
    s = np.sort(x, axis=0)
    pos = np.clip(levels * s.shape[0] - 0.5, 0.0, s.shape[0] - 1.0)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, s.shape[0] - 1)
    frac = (pos - lo)[:, None]
    return s[lo] * (1.0 - frac) + s[hi] * frac


def score_draws(
    draws: Mapping[str, Any], reference: Reference | str, num_projections: int = 200, seed: int = 0
) -> dict[str, Any]:
    """Compare draws ``{site: (S, *site shape)}`` with a reference.

    Returns a dict of floats:

    * ``mean_error_max`` / ``mean_error_mean``: ``|mean_q − mean_ref| / sd_ref`` over all scalars;
    * ``log_var_ratio_min`` / ``_max`` / ``_mean``: ``log(var_q / var_ref)`` (0 is a match; a
      guide that is too narrow has negative values); ``var_ratio_geomean`` = exp of the mean;
    * ``sliced_w2``: :func:`sliced_wasserstein2` in the reference's standardised coordinates
      (one unit = one reference standard deviation per scalar);
    * ``w1_mean``: mean over scalars of the 1-D Wasserstein-1 distance (standardised,
      ``scipy.stats.wasserstein_distance``);
    * ``sliced_w2_floor``: the same sliced W2 between two halves of the reference's chains — the
      Monte-Carlo noise level below which differences mean nothing;
    * ``sites``: the per-coordinate numbers per site; ``num_samples``, ``num_reference_draws``.
    """
    from scipy.stats import wasserstein_distance

    ref = load_reference(reference) if isinstance(reference, str) else reference
    missing = [k for k in ref.draws if k not in draws]
    if missing:
        raise ValueError(f"draws lack the reference's sites {missing} (have {sorted(draws)})")
    q_parts, per_site = [], {}
    for site, value in ref.draws.items():
        q = np.asarray(draws[site].detach().cpu() if isinstance(draws[site], Tensor) else draws[site], dtype=np.float64)
        if q.shape[1:] != value.shape[2:]:
            raise ValueError(
                f"site {site!r}: draws have shape {q.shape[1:]} per sample, the reference {value.shape[2:]}"
            )
        q_parts.append(q.reshape(q.shape[0], -1))
    q_flat = np.concatenate(q_parts, axis=1)
    r_flat = ref.flat()
    if q_flat.shape[0] < 2:
        raise ValueError("need at least 2 draws to score")
    mu, sd = r_flat.mean(0), r_flat.std(0, ddof=1)
    mean_err = np.abs(q_flat.mean(0) - mu) / sd
    with np.errstate(divide="ignore"):  # a point-mass guide (map) has variance 0: log ratio −inf
        log_vr = np.log(q_flat.var(0, ddof=1) / sd**2)
    zq, zr = (q_flat - mu) / sd, (r_flat - mu) / sd
    w1 = np.array([wasserstein_distance(zq[:, j], zr[:, j]) for j in range(zr.shape[1])])
    half = ref.num_chains // 2
    floor = sliced_wasserstein2(
        (ref.flat(range(half)) - mu) / sd, (ref.flat(range(half, ref.num_chains)) - mu) / sd, num_projections, seed
    )
    start = 0
    for site, value in ref.draws.items():
        d = int(np.prod(value.shape[2:], dtype=int))
        sl = slice(start, start + d)
        start += d
        per_site[site] = {
            "mean_error_max": float(mean_err[sl].max()),
            "mean_error_mean": float(mean_err[sl].mean()),
            "log_var_ratio_min": float(log_vr[sl].min()),
            "log_var_ratio_max": float(log_vr[sl].max()),
            "log_var_ratio_mean": float(log_vr[sl].mean()),
            "w1_mean": float(w1[sl].mean()),
        }
    return {
        "mean_error_max": float(mean_err.max()),
        "mean_error_mean": float(mean_err.mean()),
        "log_var_ratio_min": float(log_vr.min()),
        "log_var_ratio_max": float(log_vr.max()),
        "log_var_ratio_mean": float(log_vr.mean()),
        "var_ratio_geomean": float(np.exp(log_vr.mean())),
        "sliced_w2": sliced_wasserstein2(zq, zr, num_projections, seed),
        "sliced_w2_floor": floor,
        "w1_mean": float(w1.mean()),
        "num_samples": int(q_flat.shape[0]),
        "num_reference_draws": int(r_flat.shape[0]),
        "num_scalars": int(r_flat.shape[1]),
        "sites": per_site,
    }


@pyro_scope()
@torch.no_grad()
def guide_draws(guide: Any, x: Tensor, y: Tensor, sites: Sequence[str], num_samples: int = 2000,
                seed: int = 0) -> dict[str, np.ndarray]:  # fmt: skip
    """``num_samples`` joint draws of ``sites`` from ``guide`` (run on the full data), ``{site: (S, ...)}``.

    Works for any guide that samples the sites when called as ``guide(x, y, num_data=N)``; the global
    RNG state is restored afterwards.
    """
    from pyro import poutine

    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 2:
        raise ValueError(f"num_samples must be an integer >= 2, got {num_samples!r}")
    out: dict[str, list[np.ndarray]] = {k: [] for k in sites}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for _ in range(num_samples):
            with poutine.block():
                tr = poutine.trace(guide).get_trace(x, y, num_data=x.shape[0])
            for k in sites:
                if k not in tr.nodes:
                    sampled = sorted(n for n, s in tr.nodes.items() if s["type"] == "sample")
                    raise ValueError(f"the guide has no site {k!r} (it samples {sampled})")
                out[k].append(tr.nodes[k]["value"].detach().cpu().numpy())
    return {k: np.stack(v) for k, v in out.items()}


@pyro_scope()
def score_guide(
    guide: Any,
    model: Any,
    reference: Reference | str,
    num_samples: int = 2000,
    data: tuple[Tensor, Tensor] | None = None,
    seed: int = 0,
    num_projections: int = 200,
) -> dict[str, Any]:
    """Score a fitted guide against a reference (see :func:`score_draws` for the numbers).

    ``model`` must be the entry's model (same fixed hyperparameters) and ``guide`` fitted on the
    entry's data; ``data`` defaults to the entry's training data (rebuilt; a warning is raised
    when it differs from the data the reference was sampled on).
    """
    ref = load_reference(reference) if isinstance(reference, str) else reference
    if data is None:
        _, x, y = ref.entry.build()
    else:
        x, y = data
    stored = ref.metadata.get("data", {}).get("fingerprint_sha256")
    if stored and stored != _fingerprint(x, y):
        warnings.warn(
            f"reference {ref.name!r} was sampled on data with another fingerprint than the data given/rebuilt "
            "here (different library versions can change generated data); scores may be off",
            stacklevel=2,
        )
    symmetry = {k: float(v) for k, v in symmetry_summary(model).items()}
    for key, value in ref.entry.fixed.items():
        if key in symmetry and not math.isclose(symmetry[key], value, rel_tol=1e-5, abs_tol=1e-5):
            warnings.warn(
                f"model has {key} = {symmetry[key]:.4g} but reference {ref.name!r} holds it at {value:.4g}",
                stacklevel=2,
            )
    draws = guide_draws(guide, x, y, ref.sites, num_samples=num_samples, seed=seed)
    return score_draws(draws, ref, num_projections=num_projections, seed=seed)


@pyro_scope()
def fit_and_score(
    reference_names: Sequence[str],
    guide_names: Sequence[str],
    *,
    steps: int = 1500,
    lr: float = 0.05,
    init_scale: float = 0.3,
    num_samples: int = 2000,
    seed: int = 0,
    directory: str | Path | None = None,
    log: Callable[[dict[str, Any]], None] | None = None,
) -> list[dict[str, Any]]:
    """Fit each guide to each entry's model and data (``pyro_invariance.fit``, full batch, one
    learning rate ``lr`` for all guide parameters) and score it with :func:`score_guide`.

    Returns one row per (reference, guide): the settings, the fit's seconds and final ELBO/N, and the
    scores without the per-site breakdown.
    """
    import pyro

    from pyro_invariance import guides as guide_registry
    from pyro_invariance.infer.training import fit

    rows = []
    for name in reference_names:
        ref = load_reference(name, directory)
        for guide_name in guide_names:
            pyro.clear_param_store()
            model, x, y = ref.entry.build()
            kwargs = {} if guide_name == "map" else {"init_scale": init_scale}
            guide = guide_registry.get(guide_name, model, **kwargs)
            start = time.perf_counter()
            result = fit(model, guide, (x, y), steps=steps, batch_size=None, lr=lr, factor_lr=lr, seed=seed,
                         progress=False)  # fmt: skip
            seconds = time.perf_counter() - start
            scores = score_guide(guide, model, ref, num_samples=num_samples, data=(x, y), seed=seed)
            scores.pop("sites")
            row = {"reference": name, "guide": guide_name, "steps": steps, "lr": lr, "init_scale": init_scale,
                   "seed": seed, "fit_seconds": round(seconds, 1), "elbo_per_datum": result.final_elbo,
                   **scores}  # fmt: skip
            rows.append(row)
            if log:
                log(row)
    return rows


# ------------------------------------------------------------------------------------------------
# command line


def _score_row(r: Mapping[str, Any]) -> str:
    return (
        f"{r['reference']:24s} {r['guide']:14s} "
        f"mean err max {r['mean_error_max']:.3f} (mean {r['mean_error_mean']:.3f})  "
        f"var ratio {math.exp(r['log_var_ratio_min']):.3f}–{math.exp(r['log_var_ratio_max']):.3f} "
        f"(geomean {r['var_ratio_geomean']:.3f})  sliced W2 {r['sliced_w2']:.3f} (floor {r['sliced_w2_floor']:.3f})  "
        f"W1 {r['w1_mean']:.3f}  ELBO/N {r['elbo_per_datum']:.3f}  {r['fit_seconds']:.0f}s"
    )


def _file_size(path: Path) -> str:
    return f"{path.stat().st_size / 1024:.0f} KiB" if path.is_file() else "-"


def _row(ref: Reference, npz: Path | None = None) -> str:
    d = ref.metadata["diagnostics"]
    scalars = sum(int(np.prod(v.shape[2:], dtype=int)) for v in ref.draws.values())
    size = f"  {_file_size(npz)}" if npz is not None else ""
    return (
        f"{ref.name:24s} {scalars:4d} scalars  {ref.num_chains}×{ref.num_draws} draws  R-hat max {d['rhat_max']:.4f}  "
        f"ESS bulk min {d['ess_bulk_min']:6.0f}  tail min {d['ess_tail_min']:6.0f}  "
        f"divergences {ref.metadata.get('divergences', 0)}  {ref.metadata.get('wall_seconds', float('nan')):.0f}s{size}"
    )


@pyro_scope()
def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pyro_invariance.diagnostics.reference {list, regenerate, check, score}``; see ``--help``."""
    parser = argparse.ArgumentParser(prog="python -m pyro_invariance.diagnostics.reference",
                                     description="NUTS reference posteriors of small catalogue entries.")  # fmt: skip
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the catalogue of references and what is stored")
    regen = sub.add_parser("regenerate", help="run NUTS and store the draws and metadata")
    regen.add_argument("--name", action="append", help="reference name (repeatable; default: all)")
    regen.add_argument("--out", default=None, help=f"output folder (default {REFERENCE_DIR})")
    regen.add_argument("--quick", action="store_true",
                       help=f"smoke test with {QUICK}: does not reach the thresholds; needs --out")  # fmt: skip
    regen.add_argument("--seed", type=int, default=None, help="override the entries' seed")
    regen.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    regen.add_argument("--progress", action="store_true", help="show NUTS progress bars")
    score = sub.add_parser("score", help="fit guides to an entry by SVI and score them against its reference")
    score.add_argument("--name", action="append", help="reference name (repeatable; default: all)")
    score.add_argument("--guide", action="append", help="guide name (repeatable; default full-rank and mean-field)")
    score.add_argument("--steps", type=int, default=1500, help="SVI steps (default 1500)")
    score.add_argument("--lr", type=float, default=0.05, help="learning rate of all guide parameters (default 0.05)")
    score.add_argument("--init-scale", type=float, default=0.3, help="initial guide scale (default 0.3)")
    score.add_argument("--samples", type=int, default=2000, help="guide draws per score (default 2000)")
    score.add_argument("--seed", type=int, default=0)
    score.add_argument("--dir", default=None, help=f"folder of the references (default {REFERENCE_DIR})")
    score.add_argument("--json", default=None, help="also write the scores to this JSON file")
    score.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    check = sub.add_parser("check", help="recompute R-hat and ESS from the stored draws")
    check.add_argument("--dir", default=None, help=f"folder of the references (default {REFERENCE_DIR})")
    check.add_argument("--name", action="append", help="reference name (repeatable; default: all)")
    args = parser.parse_args(argv)

    if args.command == "list":
        for e in ENTRIES.values():
            npz, _ = _paths(e.name, None)
            print(f"{e.name:24s} {e.model} on {e.data}; {e.symmetry}\n{'':24s} {e.description}\n"
                  f"{'':24s} {e.paper}; stored: {_file_size(npz)}")  # fmt: skip
        return 0

    selected = args.name or names()
    for n in selected:
        try:
            entry(n)  # unknown names fail before any work
        except UnknownNameError as exc:
            parser.error(str(exc))
    if args.command == "score":
        torch.set_num_threads(args.threads)
        rows = fit_and_score(selected, args.guide or ["full-rank", "mean-field"], steps=args.steps, lr=args.lr,
                             init_scale=args.init_scale, num_samples=args.samples, seed=args.seed,
                             directory=args.dir, log=lambda r: print(_score_row(r), flush=True))  # fmt: skip
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
        return 0
    if args.command == "check":
        ok = True
        for n in selected:
            ref = load_reference(n, args.dir)
            diag = diagnose(ref.draws)
            ref.metadata["diagnostics"].update({k: diag[k] for k in ("rhat_max", "ess_bulk_min", "ess_tail_min")})
            good = passes(diag)
            ok &= good
            print(_row(ref, _paths(n, args.dir)[0]) + ("" if good else "  FAILS"))
        return 0 if ok else 1

    # regenerate
    if args.quick and args.out is None:
        parser.error("--quick references do not meet the thresholds: write them elsewhere with --out DIR")
    torch.set_num_threads(args.threads)
    overrides: dict[str, Any] = dict(QUICK) if args.quick else {}
    if args.seed is not None:
        overrides["seed"] = args.seed
    ok = True
    total = time.perf_counter()
    for n in selected:
        print(f"{n}: NUTS ...", flush=True)
        ref = run_nuts(n, progress=args.progress, log=lambda s: print(s, flush=True), **overrides)
        ref.metadata["quick"] = bool(args.quick)
        if args.quick:
            ref.metadata["command"] += " --quick"
        npz, meta = save_reference(ref, args.out)
        good = passes(ref.metadata["diagnostics"])
        ok &= good or args.quick
        print(_row(ref, npz) + ("" if good else "  below thresholds") + f"\n  wrote {npz} and {meta}", flush=True)
    print(f"total {time.perf_counter() - total:.0f}s")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
