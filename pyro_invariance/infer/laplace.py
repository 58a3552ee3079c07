"""Laplace evidence for layer-wise prior precisions (paper 004 Section 4, Eqs. 9-11; MacKay 1992).

The paper learns every pathway's prior precision δ_g by maximising a Laplace approximation of the
log marginal likelihood around the MAP weights θ*, with a Gauss-Newton (GGN) curvature. Two
curvatures (``curvature=``): ``"kfac"``, the paper's Kronecker-factored GGN per layer
(:mod:`pyro_invariance.infer.kfac_layers`; ``log det`` from the factors' eigenvalues, δ added in the
eigenbasis; the default), and ``"diagonal"``, a Monte-Carlo diagonal GGN. Two δ updates
(``delta_update=``): ``"gradient"``, Adam steps on log δ of the evidence (the paper; the default),
and ``"mackay"``, MacKay's fixed point. Both curvatures enter the formulas below through their
eigenvalues λ (for the diagonal GGN, λ = h; for KFAC, N λ_i^G λ_j^A). The diagonal case:

* **curvature** (Fisher = GGN for a softmax likelihood): ``h_i = Σ_n E_ŷ[(∂_i log p(ŷ_n | x_n, θ*))²]``
  with ŷ_n ~ p(y | x_n, θ*). The squared gradient of a *minibatch sum* is an unbiased estimate of
  the same sum, because the cross terms have zero mean (E_ŷ ∇ log p(ŷ_n) = 0 for each n), so one
  backward pass per minibatch suffices: ``h ≈ Σ_b (∇ Σ_{n∈b} log p(ŷ_n | x_n, θ*))²``.
* **evidence** for precision groups g with P_g parameters (Eq. 10 with a diagonal H)::

      log p(D | δ) ≈ log p(D | θ*) − ½ Σ_g δ_g ‖θ*_g‖² + ½ Σ_g P_g log δ_g − ½ Σ_i log(h_i + δ_{g(i)})

  (the ±P/2 log 2π of prior and Laplace normaliser cancel).
* **update** (setting ∂/∂δ_g of the evidence to zero with θ* and h held fixed)::

      γ_g = Σ_{i∈g} h_i / (h_i + δ_g)          (effective number of parameters)
      δ_g ← γ_g / ‖θ*_g‖²

  applied with optional damping in log space. A pathway that the data do not need has
  γ_g ≪ P_g and shrinking θ*_g, so δ_g grows without bound: the layer becomes equivariant.

Training alternates (online, Immer et al. 2021): MAP steps on θ with the current δ — the ``map``
guide of :func:`pyro_invariance.fit` with ``prior="fixed"`` precisions, which are buffers — and,
every ``every`` steps after ``warmup``, the curvature and the δ update (:class:`LaplaceEvidenceUpdate`,
a ``fit`` callback, so checkpoints and bit-for-bit resume keep working). :func:`fit_laplace` wraps
both and returns the posterior ``N(θ*, diag(h + δ)⁻¹)`` as a :class:`DiagonalLaplacePosterior`,
which :func:`pyro_invariance.diagnostics.layerwise_analysis.analyse_pathways` reads like a guide (then
``γ = P − δ·tr Σ = Σ h/(h+δ)`` exactly).

Models: anything with ``precision_groups()`` returning :class:`PrecisionGroup` s and a forward
``model(x) -> logits`` observing ``"obs"`` as a Categorical (e.g.
:class:`~pyro_invariance.models.layerwise.LayerwiseNet` with ``prior="fixed"``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import pyro.distributions as dist
import torch
from pyro import poutine
from torch import Tensor, nn

import pyro_invariance.guides as guide_registry
from pyro_invariance._pyro_scope import pyro_scope
from pyro_invariance.data.arrays import train_arrays
from pyro_invariance.infer.config import FitConfig, resolve_config
from pyro_invariance.infer.distributed import current_ranks
from pyro_invariance.infer.kfac_layers import LABELS, kfac_curvature
from pyro_invariance.infer.training import FitResult, fit
from pyro_invariance.models.base import PrecisionGroup
from pyro_invariance.validation import check_choice, check_positive_float, check_positive_int

__all__ = [
    "DiagonalLaplacePosterior",
    "LaplaceEvidenceUpdate",
    "PrecisionGroup",
    "CURVATURES",
    "DELTA_UPDATES",
    "DiagonalCurvature",
    "as_curvature",
    "diagonal_ggn",
    "fit_laplace",
    "gradient_update",
    "LaplaceFitResult",
    "laplace_log_evidence",
    "log_likelihood",
    "mackay_update",
]

#: δ is capped here (the equivariant limit δ → ∞, kept finite).
MAX_PRECISION = 1e8


def _groups(model: Any) -> list[PrecisionGroup]:
    if not hasattr(model, "precision_groups"):
        raise TypeError(f"{type(model).__name__} has no precision_groups(); the Laplace evidence needs one")
    groups = model.precision_groups()
    for g in groups:
        v = g.value
        if not isinstance(v, Tensor) or isinstance(v, nn.Parameter) or v.requires_grad:
            raise ValueError(
                f"precision {g.name} is not a fixed buffer; build the model with prior='fixed' "
                "(the Laplace evidence sets δ itself)"
            )
    return groups


def map_values(guide: Any) -> dict[str, Tensor]:
    """The MAP point θ* of a fitted ``map`` guide (detached)."""
    with torch.no_grad():
        return {k: v.detach() for k, v in guide.median().items()}


def _logits(model: Any, values: dict[str, Tensor], x: Tensor) -> Tensor:
    dummy = torch.zeros(x.shape[0], dtype=torch.long, device=x.device)
    with poutine.block(), poutine.condition(data={**values, "obs": dummy}):
        return model(x)


def log_likelihood(model: Any, values: dict[str, Tensor], x: Tensor, y: Tensor, batch_size: int = 512) -> float:
    """``Σ_n log p(y_n | x_n, θ)`` over all of ``x`` (no gradient)."""
    total = 0.0
    with torch.no_grad():
        for i in range(0, x.shape[0], batch_size):
            logits = _logits(model, values, x[i : i + batch_size])
            total += float(dist.Categorical(logits=logits).log_prob(y[i : i + batch_size]).sum())
    return total


def diagonal_ggn(
    model: Any,
    values: dict[str, Tensor],
    x: Tensor,
    sites: Sequence[str],
    *,
    batch_size: int = 32,
    num_samples: int = 1,
    generator: torch.Generator | None = None,
) -> dict[str, Tensor]:
    """Monte-Carlo diagonal GGN / Fisher ``h`` of the summed log likelihood at ``values``.

    ``h_i ≈ (1/S) Σ_s Σ_b (∂_i Σ_{n∈b} log p(ŷ_n^s | x_n, θ))²`` with labels ŷ drawn from the
    model's own predictive (module docstring). Smaller ``batch_size`` and more ``num_samples``
    lower the variance (each costs one backward pass per minibatch).

    Returns ``{site: h (same shape as the site)}`` for ``sites``.
    """
    check_positive_int("batch_size", batch_size)
    check_positive_int("num_samples", num_samples)
    missing = [s for s in sites if s not in values]
    if missing:
        raise KeyError(f"no MAP value for sites {missing[:3]}")
    out = {s: torch.zeros_like(values[s]) for s in sites}
    for _ in range(num_samples):
        for i in range(0, x.shape[0], batch_size):
            leaves = {k: (v.detach().requires_grad_(k in out)) for k, v in values.items()}
            with torch.enable_grad():
                logits = _logits(model, leaves, x[i : i + batch_size])
                probs = torch.softmax(logits.detach(), -1)
                y_hat = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
                loss = dist.Categorical(logits=logits).log_prob(y_hat).sum()
                grads = torch.autograd.grad(loss, [leaves[s] for s in sites], allow_unused=True)
            for s, g in zip(sites, grads):
                if g is not None:
                    out[s] += g.detach() ** 2
    return {s: h / num_samples for s, h in out.items()}


class DiagonalCurvature:
    """A diagonal GGN ``h`` (per site, the site's shape) in the form the evidence uses: its
    eigenvalues are ``h`` itself and the posterior marginal variances ``1/(h + δ)``.
    :class:`~pyro_invariance.infer.kfac_layers.KFACCurvature` offers the same two methods."""

    def __init__(self, h: dict[str, Tensor]) -> None:
        self.h = h

    def eigenvalues(self, sites: list[str]) -> Tensor:
        missing = [s for s in sites if s not in self.h]
        if missing:
            raise KeyError(f"no curvature for sites {missing[:3]}")
        return torch.cat([self.h[s].reshape(-1).double() for s in sites])

    def marginal_variances(self, sites: list[str], delta: float, shapes: dict[str, torch.Size]) -> dict[str, Tensor]:
        return {s: 1.0 / (self.h[s].double() + delta) for s in sites}


def as_curvature(h: Any) -> Any:
    """A diagonal ``{site: h}`` as :class:`DiagonalCurvature`; a curvature object as it is."""
    return DiagonalCurvature(h) if isinstance(h, dict) else h


def _group_stats(g: PrecisionGroup, values: dict[str, Tensor], curvature: Any) -> tuple[int, float, Tensor]:
    """``P_g``, ``‖θ*_g‖²`` and the curvature's eigenvalues over the group's sites (float64)."""
    p = sum(values[s].numel() for s in g.sites)
    sq = float(sum((values[s].double() ** 2).sum() for s in g.sites))
    hh = curvature.eigenvalues(list(g.sites))
    if hh.numel() != p:
        raise ValueError(f"the curvature of {g.name} has {hh.numel()} eigenvalues for {p} parameters")
    return p, sq, hh


def laplace_log_evidence(model: Any, values: dict[str, Tensor], h: Any, log_lik: float) -> float:
    """Laplace log marginal likelihood (module docstring) at the current δ, from a diagonal
    curvature ``{site: h}`` or a curvature object (:class:`DiagonalCurvature`,
    :class:`~pyro_invariance.infer.kfac_layers.KFACCurvature`): ``log det`` is Σ log(λ + δ) over
    the curvature's eigenvalues λ in each group (paper 004 Eq. 9)."""
    total = float(log_lik)
    curvature = as_curvature(h)
    for g in _groups(model):
        p, sq, hh = _group_stats(g, values, curvature)
        d = float(g.value)
        total += -0.5 * d * sq + 0.5 * p * math.log(d) - 0.5 * float(torch.log(hh + d).sum())
    return total


def mackay_update(
    model: Any,
    values: dict[str, Tensor],
    h: Any,
    *,
    damping: float = 1.0,
    max_precision: float = MAX_PRECISION,
) -> dict[str, float]:
    """Set every group's δ to MacKay's fixed point ``γ/‖θ*‖²`` (damped in log space); returns γ per group.

    ``damping`` ρ ∈ (0, 1]: ``log δ ← (1−ρ) log δ + ρ log δ*``. δ stays in ``[1/max, max]``.
    Groups whose curvature is exactly zero keep their δ.
    """
    if not (0 < damping <= 1):
        raise ValueError(f"damping must lie in (0, 1], got {damping}")
    gammas: dict[str, float] = {}
    curvature = as_curvature(h)
    for g in _groups(model):
        p, sq, hh = _group_stats(g, values, curvature)
        d = float(g.value)
        gamma = float((hh / (hh + d)).sum())
        gammas[g.name] = gamma
        if float(hh.max()) == 0.0:
            continue
        target = gamma / max(sq, 1e-300)
        target = min(max(target, 1.0 / max_precision), max_precision)
        new = math.exp((1 - damping) * math.log(d) + damping * math.log(target))
        g.value.fill_(new)
    return gammas


def gradient_update(
    model: Any,
    values: dict[str, Tensor],
    h: Any,
    *,
    steps: int = 100,
    lr: float = 0.1,
    max_precision: float = MAX_PRECISION,
) -> dict[str, float]:
    """``steps`` Adam steps (learning rate ``lr``) on every group's ``log δ`` ascending the Laplace
    log evidence with θ* and the curvature held fixed (paper 004 Sec. 4: δ learned by the
    gradient of the evidence, as Immer et al. 2021's online marginal-likelihood training; a fresh
    optimiser per update, so that δ, a model buffer, is the whole state and resumes bit-for-bit).
    The objective is separable over groups: ``(P_g/2) log δ − (δ/2)‖θ*_g‖² − ½ Σ log(λ + δ)``.
    δ stays in ``[1/max, max]``. Returns the new δ per group."""
    check_positive_int("steps", steps)
    check_positive_float("lr", lr)
    curvature = as_curvature(h)
    groups = _groups(model)
    stats = [_group_stats(g, values, curvature) for g in groups]
    # all groups at once: eigenvalues concatenated, each with the index of its group
    eig = torch.cat([hh.detach().to(torch.float64) for _, _, hh in stats])  # on the curvature's device
    dev = eig.device
    num = torch.tensor([float(p) for p, _, _ in stats], dtype=torch.float64, device=dev)
    sq = torch.tensor([s for _, s, _ in stats], dtype=torch.float64, device=dev)
    owner = torch.repeat_interleave(
        torch.arange(len(stats), device=dev), torch.tensor([hh.numel() for _, _, hh in stats], device=dev)
    )
    log_delta = torch.tensor(
        [math.log(float(g.value)) for g in groups], dtype=torch.float64, device=dev, requires_grad=True
    )
    opt = torch.optim.Adam([log_delta], lr=lr)
    bound = math.log(max_precision)
    for _ in range(steps):
        opt.zero_grad()
        d = log_delta.exp()
        objective = (0.5 * num * log_delta - 0.5 * d * sq).sum() - 0.5 * torch.log(eig + d[owner]).sum()
        (-objective).backward()
        opt.step()
        with torch.no_grad():
            log_delta.clamp_(-bound, bound)
    out: dict[str, float] = {}
    for g, ld in zip(groups, log_delta.detach()):
        g.value.fill_(math.exp(float(ld)))
        out[g.name] = float(g.value)
    return out


#: how ``fit_laplace`` updates δ: MacKay's fixed point or the evidence's gradient
DELTA_UPDATES = ("mackay", "gradient")
#: the curvature ``fit_laplace`` uses
CURVATURES = ("diagonal", "kfac")


class DiagonalLaplacePosterior:
    """``q(θ) = N(θ*, diag(h + δ)⁻¹)`` per site, with the guide interface the analysis uses.

    ``get_distribution(site)`` (sites of the precision groups), ``median()`` → θ*.
    """

    def __init__(self, model: Any, values: dict[str, Tensor], h: Any) -> None:
        self.values = values
        curvature = as_curvature(h)
        shapes = {k: v.shape for k, v in values.items()}
        self.precision: dict[str, Tensor] = {}  # 1 / marginal variance (h + δ for a diagonal curvature)
        for g in _groups(model):
            variances = curvature.marginal_variances(list(g.sites), float(g.value), shapes)
            for s in g.sites:
                self.precision[s] = (1.0 / variances[s]).to(values[s].dtype)

    def get_distribution(self, site: str) -> dist.Normal:
        """The marginal ``N(θ*_i, Σ_ii)`` of every element of ``site`` (for KFAC: the diagonal of
        ``(N G⊗A + δI)⁻¹``; the correlations are not represented here)."""
        if site not in self.precision:
            raise KeyError(f"the Laplace posterior has no site {site!r}")
        return dist.Normal(self.values[site], self.precision[site].rsqrt())

    def median(self, *args: Any, **kwargs: Any) -> dict[str, Tensor]:
        return dict(self.values)


@dataclass
class LaplaceEvidenceUpdate:
    """``fit`` callback: every ``every`` steps from ``warmup`` on, the curvature at the current
    MAP point and an update of every δ.

    ``curvature``: ``"diagonal"`` (:func:`diagonal_ggn`, labels drawn from the model) or ``"kfac"``
    (:func:`~pyro_invariance.infer.kfac_layers.kfac_curvature`; ``labels="exact"`` takes the
    expectation over labels exactly, ``"sampled"`` draws one per example, ``"empirical"`` uses the
    observed labels: the empirical Fisher). ``delta_update``:
    ``"mackay"`` (:func:`mackay_update`, ``damping`` in log space) or ``"gradient"``
    (:func:`gradient_update`: ``delta_steps`` Adam steps of rate ``delta_lr`` on log δ).

    The label draws use a generator seeded by ``(seed, step)``, so a resumed run repeats them; δ are
    model buffers and travel in checkpoints.

    In a data-parallel run (``fit(..., strategy="ddp")``, :mod:`pyro_invariance.infer.distributed`)
    each rank computes the curvature and the log likelihood on its contiguous part of ``x`` and the
    sums are all-reduced, so every rank updates δ from the curvature of all the data: the KFAC
    curvature equals the one-process curvature (to float rounding); the diagonal one is the same in
    expectation (its sampled labels and minibatch cross terms differ: each rank's generator is
    offset by its rank). ``log`` (step, log evidence before the update, per-datum)
    is diagnostic and is not checkpointed.
    """

    x: Tensor
    y: Tensor
    every: int = 50
    warmup: int = 100
    batch_size: int = 32
    num_samples: int = 1
    damping: float = 1.0
    seed: int = 0
    max_precision: float = MAX_PRECISION
    curvature: str = "kfac"
    labels: str = "exact"
    delta_update: str = "gradient"
    delta_steps: int = 100
    delta_lr: float = 0.1
    log: list[tuple[int, float]] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_positive_int("every", self.every)
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ValueError(f"warmup must be an integer >= 0, got {self.warmup!r}")
        if not (0 < self.damping <= 1):
            raise ValueError(f"damping must lie in (0, 1], got {self.damping}")
        check_choice("curvature", self.curvature, CURVATURES)
        check_choice("delta_update", self.delta_update, DELTA_UPDATES)
        check_choice("labels", self.labels, LABELS)
        check_positive_int("delta_steps", self.delta_steps)
        check_positive_float("delta_lr", self.delta_lr)
        self._last: tuple[dict[str, Tensor], Any] | None = None  # the last update's (θ*, curvature)

    def compute_curvature(self, model: Any, guide: Any, step: int) -> tuple[dict[str, Tensor], Any]:
        """The MAP values and the curvature at them (a ``{site: h}`` dict or a KFAC curvature), of
        all the data (the ranks' parts summed in a data-parallel run)."""
        values = map_values(guide)
        ranks = current_ranks()
        rows = ranks.rows(self.x.shape[0])
        x, y = self.x[rows], self.y[rows]
        gen = torch.Generator(device=self.x.device).manual_seed(self.seed * 1_000_003 + step + 7_919 * ranks.rank)
        if self.curvature == "kfac":
            return values, kfac_curvature(
                model, values, x, batch_size=self.batch_size, labels=self.labels, generator=gen, y=y, ranks=ranks
            )
        sites = [s for g in _groups(model) for s in g.sites]
        h = diagonal_ggn(
            model, values, x, sites, batch_size=self.batch_size, num_samples=self.num_samples, generator=gen
        )
        return values, {s: ranks.sum(v) for s, v in h.items()}

    def log_likelihood(self, model: Any, values: dict[str, Tensor]) -> float:
        """``Σ_n log p(y_n | x_n, θ)`` over all of ``x`` (the ranks' parts summed in a data-parallel run)."""
        ranks = current_ranks()
        rows = ranks.rows(self.x.shape[0])
        part = log_likelihood(model, values, self.x[rows], self.y[rows])
        if not ranks.ddp:
            return part
        return float(ranks.sum(torch.tensor([part], dtype=torch.float64, device=self.x.device)).item())

    def update(self, model: Any, values: dict[str, Tensor], curvature: Any) -> None:
        """One δ update at fixed θ* and curvature (``delta_update``)."""
        if self.delta_update == "gradient":
            gradient_update(
                model, values, curvature, steps=self.delta_steps, lr=self.delta_lr, max_precision=self.max_precision
            )
        else:
            mackay_update(model, values, curvature, damping=self.damping, max_precision=self.max_precision)

    def __call__(self, step: int, model: Any, guide: Any) -> None:
        if step < self.warmup or (step - self.warmup) % self.every:
            return
        values, h = self.compute_curvature(model, guide, step)
        log_lik = self.log_likelihood(model, values)
        self.log.append((step, laplace_log_evidence(model, values, h, log_lik) / self.x.shape[0]))
        self.update(model, values, h)
        self._last = (values, h)

    def final_curvature(self, model: Any, guide: Any, step: int) -> tuple[dict[str, Tensor], Any]:
        """The curvature at the end of the run: the last update's when it was taken at the same MAP
        point and does not depend on δ or on label draws (KFAC with exact or empirical labels: then
        a recomputation would give the same numbers), else computed anew."""
        last = self._last
        if last is not None and self.curvature == "kfac" and self.labels in ("exact", "empirical"):
            values = map_values(guide)
            if values.keys() == last[0].keys() and all(torch.equal(values[k], last[0][k]) for k in values):
                return last
        return self.compute_curvature(model, guide, step)


@dataclass
class LaplaceFitResult(FitResult):
    """What :func:`fit_laplace` returns: a :class:`~pyro_invariance.infer.training.FitResult` plus

    ``laplace`` (the posterior ``N(θ*, diag(h + δ)⁻¹)``, :class:`DiagonalLaplacePosterior`),
    ``log_evidence`` (the final Laplace log evidence, Eq. 10, nats) and ``evidence_log``
    (``(step, log evidence / N)`` before each update).
    """

    laplace: DiagonalLaplacePosterior | None = None
    log_evidence: float = math.nan
    evidence_log: list[tuple[int, float]] = field(default_factory=list)


@pyro_scope()
def fit_laplace(
    model: Any,
    guide: Any,
    data: Any,
    config: FitConfig | None = None,
    *,
    every: int = 50,
    warmup: int = 100,
    ggn_batch_size: int = 32,
    num_samples: int = 1,
    damping: float = 1.0,
    curvature: str = "kfac",
    labels: str = "exact",
    delta_update: str = "gradient",
    delta_steps: int = 100,
    delta_lr: float = 0.1,
    callbacks: Sequence[Any] = (),
    **kwargs: Any,
) -> LaplaceFitResult:
    """MAP training with online Laplace-evidence updates of the prior precisions.

    The same arguments, in the same order, as :func:`pyro_invariance.fit`: ``guide`` is the
    ``map`` guide (``None`` or ``"map"`` builds it), ``config`` / ``**kwargs`` the
    :class:`~pyro_invariance.infer.config.FitConfig` settings and ``fit``'s run options
    (``checkpoint_path``, ``resume`` ...). Adds a :class:`LaplaceEvidenceUpdate` callback (every
    ``every`` steps after ``warmup``; curvature on minibatches of ``ggn_batch_size`` with
    ``num_samples`` label draws for the diagonal curvature; ``damping`` in log space for MacKay's
    update), whose settings are part of the run's fingerprint, and computes the curvature at the
    final point. By default the paper's method: ``curvature="kfac"`` (KFAC GGN; ``labels``: exact
    expectation or one sampled label) and ``delta_update="gradient"`` (``delta_steps`` Adam steps of
    rate ``delta_lr`` on log δ); ``curvature="diagonal"``, ``delta_update="mackay"`` is the diagonal
    GGN with MacKay's fixed point (the method of the earlier tables); see
    :class:`LaplaceEvidenceUpdate`. The returned ``laplace`` posterior's marginals are
    the diagonal of the chosen curvature's posterior covariance.
    """
    _groups(model)
    if guide is None or isinstance(guide, str):
        guide = guide_registry.get(guide or "map", model)
    overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in FitConfig.names()}
    cfg = resolve_config(config, model, guide, overrides)
    x, y = train_arrays(data, model)
    x, y = x.to(cfg.device), y.to(cfg.device)
    update = LaplaceEvidenceUpdate(
        x,
        y,
        every=every,
        warmup=warmup,
        batch_size=ggn_batch_size,
        num_samples=num_samples,
        damping=damping,
        seed=cfg.seed,
        curvature=curvature,
        labels=labels,
        delta_update=delta_update,
        delta_steps=delta_steps,
        delta_lr=delta_lr,
    )
    settings = {
        "laplace": {
            "every": every,
            "warmup": warmup,
            "ggn_batch_size": ggn_batch_size,
            "num_samples": num_samples,
            "damping": damping,
        }
    }
    if curvature != "diagonal" or delta_update != "mackay":  # the diagonal/MacKay runs keep their fingerprints
        settings["laplace"].update(
            curvature=curvature, labels=labels, delta_update=delta_update, delta_steps=delta_steps, delta_lr=delta_lr
        )
    result = fit(model, guide, (x, y), cfg, callbacks=[*callbacks, update], run_settings=settings, **kwargs)
    values, h = update.final_curvature(model, result.guide, cfg.steps + 1)
    log_evidence = laplace_log_evidence(model, values, h, update.log_likelihood(model, values))
    base = {f.name: getattr(result, f.name) for f in fields(FitResult)}
    return LaplaceFitResult(
        **base,
        laplace=DiagonalLaplacePosterior(model, values, h),
        log_evidence=log_evidence,
        evidence_log=list(update.log),
    )
