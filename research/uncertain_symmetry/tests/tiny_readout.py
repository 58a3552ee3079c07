"""A tiny invariant MLP and data for the read-out evidence tests (AIS and Laplace): 16 pixels, 3 hidden units,
3 classes, prior scale 1.5 — small enough for brute-force references."""

from __future__ import annotations

import torch

from pyro_invariance.models import InvariantMLP


def tiny_readout_model(prior: str, sampling: str = "deterministic", eta: float = 0.4) -> InvariantMLP:
    return InvariantMLP(
        image_shape=(1, 4, 4),
        num_classes=3,
        hidden=3,
        num_transforms=4,
        symmetry="rotation",
        learn_symmetry=False,
        eta_init=eta,
        sampling=sampling,
        prior=prior,
        prior_scale=1.5,
        init_seed=3,
    )


def tiny_readout_data(n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.rand(n, 1, 4, 4, generator=g), torch.randint(0, 3, (n,), generator=g)


def tiny_latent_model(
    symmetry_prior: str, prior: str = "hierarchical", sampling: str = "deterministic"
) -> InvariantMLP:
    """:func:`tiny_readout_model`'s features with η a latent site (``symmetry_prior``) instead of fixed."""
    return InvariantMLP(
        image_shape=(1, 4, 4),
        num_classes=3,
        hidden=3,
        num_transforms=4,
        symmetry="rotation",
        symmetry_prior=symmetry_prior,
        sampling=sampling,
        prior=prior,
        prior_scale=1.5,
        init_seed=3,
    )
