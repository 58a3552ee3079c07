"""The catalogue of reference posteriors: each entry is *model × data* with a small metadata record.

An entry (:class:`ReferenceEntry`) says what it is, which paper and figure it comes from, which
symmetry is expected, and the symmetry parameters held fixed. With ``symmetry_prior`` unset, η (λ
for basis regression) is a hyperparameter chosen by the marginal likelihood, not a latent, so the
reference posterior is conditional on the stated values (``fixed``); an entry built with
``symmetry_prior`` (``basis-regression-lambda``, ``invariant-mlp-digits-eta``: the weights and η
integrated over jointly) makes η a latent site that NUTS samples with the weights, and holds nothing
fixed (``fixed = {}``). :class:`NUTSSettings` are the sampler settings stored with each entry.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor

from pyro_invariance.catalogue import model_kwargs_for
from pyro_invariance.data.arrays import train_arrays
from pyro_invariance.models.base import symmetry_summary
from pyro_invariance.models.basis_regression import make_symmetric_toy
from pyro_invariance.registry import DATASETS, MODELS, UnknownNameError

__all__ = ["DATA_SOURCES", "ENTRIES", "QUICK", "NUTSSettings", "ReferenceEntry", "entry", "names"]


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
                "needs every hyperparameter fixed (learn_symmetry=False, prior='fixed') "
                "or η latent (symmetry_prior=...)"
            )
        return model, x, y

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["model_kwargs"] = dict(self.model_kwargs)
        out["data_kwargs"] = dict(self.data_kwargs)
        out["fixed"] = dict(self.fixed)
        return out


#: Data sources that are not registered datasets (name -> function returning ``(x, y)``).
DATA_SOURCES: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "symmetric-toy-1d": make_symmetric_toy,
}

_TOY2D_MODEL = {
    "hidden": 16,
    "lengthscale": 0.75,
    "num_transforms": 32,
    "sampling": "deterministic",
    "prior_scale": 3.0,
    "learn_symmetry": False,
}

#: The catalogue of references, by name.
ENTRIES: dict[str, ReferenceEntry] = {
    e.name: e
    for e in (
        ReferenceEntry(
            name="basis-regression",
            model="basis-regression",
            model_kwargs={
                "basis": "rbf",
                "num_features": 8,
                "lengthscale": 0.6,
                "noise_scale": 0.3,
                "prior_scale": 1.0,
                "eta_init": 0.5,
                "learn_symmetry": False,
            },
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
            model_kwargs={
                "hidden": 8,
                "activation": "rff",
                "symmetry": "rotation",
                "learn_symmetry": False,
                "eta_init": math.pi,
                "num_transforms": 8,
                "sampling": "deterministic",
                "prior": "fixed",
                "prior_scale": 1.0,
            },
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
        # η latent (symmetry_prior): joint NUTS over the weights and the symmetry parameter, the
        # reference for guides that integrate over η instead of fitting it.
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
            model_kwargs={
                "basis": "rbf",
                "num_features": 8,
                "lengthscale": 0.6,
                "noise_scale": 0.3,
                "prior_scale": 1.0,
                "symmetry_prior": "uniform",
            },
            data="symmetric-toy-1d",
            data_kwargs={"n": 60, "seed": 0, "noise": 0.3, "even": True},
            description="basis-regression with λ latent, λ ~ U(0, 2): joint posterior of 8 RBF weights and λ, "
            "60 noisy points of cos(2x); p(λ | D) known by quadrature (exact_symmetry_posterior): unimodal at "
            "λ = 1 (symmetric about 1, sd 0.15, heavy-tailed) for these data, where 20 points give two modes",
            paper="talk 000 (papers/000), slides 'Can we learn the inductive bias?' (λ by the marginal "
            "likelihood; here integrated over with a prior on λ)",
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
            model_kwargs={
                "hidden": 8,
                "activation": "rff",
                "symmetry": "rotation",
                "learn_symmetry": True,
                "symmetry_prior": "uniform",
                "num_transforms": 32,
                "sampling": "deterministic",
                "prior": "fixed",
                "prior_scale": 1.0,
            },
            data="rotated-digits",
            data_kwargs={"train_size": 200, "test_size": 50},
            description="invariant-mlp-digits with the rotation range η latent, η ~ U(0, π), and 32 rotations "
            "on the grid: joint posterior of the read-out (10×8 weights + 10 biases) and η, 200 rotated 8×8 digits",
            paper="paper 003 (papers/003), Table 1 setting at a tiny size (the invariance η integrated over "
            "with a prior)",
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
        close = difflib.get_close_matches(str(name), list(ENTRIES), n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise UnknownNameError(f"unknown reference {name!r}.{hint} Known references: {', '.join(ENTRIES)}")
    return ENTRIES[name]
