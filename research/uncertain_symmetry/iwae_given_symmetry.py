"""``elbo="iwae-given-symmetry"``: an ELBO in the symmetry latents η, the IWAE bound in θ given η.

:class:`LeanIWAEGivenSymmetry_ELBO` is the importance-weighted bound over the other latents with one
draw of η shared by the K particles. Importing this module registers it with ``fit``
(:func:`pyro_invariance.infer.fast_step.register_elbo`), so that
``pi.fit(model, guide, data, elbo="iwae-given-symmetry", num_particles=K)`` trains on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from pyro import poutine
from pyro.distributions import Delta, MaskedDistribution
from pyro.distributions.torch_distribution import ExpandedDistribution
from pyro.poutine.messenger import Messenger
from torch import Tensor
from torch.distributions import Independent

from pyro_invariance.infer.fast_step import LeanIWAE_ELBO, register_elbo
from pyro_invariance.models.base import symmetry_sites

__all__ = ["AUXILIARY_SUFFIXES", "LeanIWAEGivenSymmetry_ELBO"]


#: suffixes of the auxiliary guide sites that an autoguide draws a site ``name`` from
#: (``AutoStructured``: ``name_aux``; ``AutoNormal``: ``name_unconstrained``)
AUXILIARY_SUFFIXES = ("_aux", "_unconstrained")


class _FirstDraw(Messenger):
    """Every particle of one loss evaluation gets the first particle's draw of the sites named: under
    vectorised particles the draw is made once, before the particle plate broadcasts the site (its
    value has no particle dim; a value that already has one is cut to its first particle); sequential
    particles reuse the first one's value. The draw is the site's own (reparameterised where the
    distribution is), so its gradient still flows into the guide. An autoguide that draws a site from
    an auxiliary one (``<name>_aux``, ``<name>_unconstrained``, marked ``is_auxiliary``) and then puts
    a ``Delta`` at ``<name>`` has the auxiliary draw shared, so the ``Delta`` follows it."""

    def __init__(self, sites: Sequence[str]) -> None:
        super().__init__()
        self.sites = frozenset(sites)
        self.values: dict[str, Tensor] = {}

    def _shared(self, msg: dict[str, Any]) -> bool:
        name = msg["name"]
        if name in self.sites:
            return True
        return bool(msg["infer"].get("is_auxiliary")) and any(
            name.endswith(sfx) and name[: -len(sfx)] in self.sites for sfx in AUXILIARY_SUFFIXES
        )

    def _pyro_sample(self, msg: dict[str, Any]) -> None:
        name = msg["name"]
        if msg["is_observed"] or msg["value"] is not None or not self._shared(msg):
            return
        drawn_from_shared = any(name + sfx in self.values for sfx in AUXILIARY_SUFFIXES)
        if name in self.sites and _is_delta(msg["fn"]) and not drawn_from_shared:
            raise ValueError(
                f"elbo='iwae-given-symmetry' needs a guide that draws the symmetry site {name!r} on its own "
                "(mean-field, symmetry-conditional); this guide puts a Delta there, drawn jointly with "
                "other latents, so one draw of it cannot be shared"
            )
        if name not in self.values:
            value = msg["fn"](*msg["args"], **msg["kwargs"])
            batch_dims = value.dim() - len(msg["fn"].event_shape)
            self.values[name] = value[(slice(0, 1),) * batch_dims] if batch_dims else value
        msg["value"] = self.values[name]


def _is_delta(fn: Any) -> bool:
    """Whether ``fn`` is a ``Delta`` (under Pyro's and torch's wrappers: masked, expanded, independent)."""
    while isinstance(fn, (Independent, MaskedDistribution, ExpandedDistribution)):
        fn = fn.base_dist
    return isinstance(fn, Delta)


class LeanIWAEGivenSymmetry_ELBO(LeanIWAE_ELBO):
    """The importance-weighted bound over the other latents θ with one draw of the symmetry latents η
    shared by the K particles: an ELBO in η, an IWAE bound (Burda et al. 2016, Eq. 8) in θ given η::

        L_K = E_{q(η)} [ E_{θ_1..K ~ q(θ | η)} log (1/K) Σ_k p(D, θ_k | η) / q(θ_k | η) + log p(η) − log q(η) ]
            = E_{q(η)} [ IWAE_K(η) + log p(η) − log q(η) ]  ≤  log p(D),

    (the loss is −L_K for one draw of η; ``log p(η) − log q(η)`` is the same in every particle's weight,
    so the log-mean-exp over particles leaves it outside). For a fixed q(θ | η), the q(η) that maximises
    L_K is ∝ p(η) exp(IWAE_K(η)), which tends to the posterior p(η | D) as K grows, whereas the ELBO's
    (K = 1 here) is ∝ p(η) exp(ELBO(η)) and leans towards the η where q(θ | η) fits best (Turner &
    Sahani 2011). The fixed-η grid reference of ``scripts/uncertain_symmetry.py`` estimates the same
    ``IWAE_K(η)`` from separate fits per η, so at the reference's K the two target the same posterior.
    ``shared_sites`` are the model's symmetry sites (``model.symmetry_sites()``; :meth:`for_model`);
    every guide site must be reparameterised, as for :class:`LeanIWAE_ELBO`."""

    def __init__(self, *args: Any, shared_sites: Sequence[str], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not shared_sites:
            raise ValueError(
                "elbo='iwae-given-symmetry' needs a latent symmetry (build the model with symmetry_prior=...); "
                "with η a point estimate it is elbo='iwae'"
            )
        self.shared_sites = tuple(shared_sites)

    @classmethod
    def for_model(cls, model: Any, **kwargs: Any) -> LeanIWAEGivenSymmetry_ELBO:
        """The loss with ``shared_sites = model.symmetry_sites()`` (none for a model outside the catalogue)."""
        return cls(shared_sites=symmetry_sites(model), **kwargs)

    def check_guide(self, guide: Any, *args: Any, **kwargs: Any) -> None:
        """Refuse (``ValueError``, one line) a guide that cannot share one draw of the symmetry sites: one
        that draws them jointly with other latents (full-rank, low-rank: a ``Delta`` at the site). Runs
        the guide once aside (random streams restored, no handler sees it)."""
        cuda = [a.device for a in args if isinstance(a, Tensor) and a.is_cuda][:1]
        with torch.random.fork_rng(devices=cuda), poutine.block(), torch.no_grad():
            _FirstDraw(self.shared_sites)(guide)(*args, **kwargs)

    def differentiable_loss(self, model: Any, guide: Any, *args: Any, **kwargs: Any) -> Tensor:
        return super().differentiable_loss(model, _FirstDraw(self.shared_sites)(guide), *args, **kwargs)


register_elbo("iwae-given-symmetry", LeanIWAEGivenSymmetry_ELBO)
