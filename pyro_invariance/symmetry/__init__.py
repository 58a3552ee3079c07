"""Symmetry: the groups and layers whose parameters the catalogue learns.

* :mod:`.affine` — 2-D affine generators, T = expm(Σ εᵢηᵢGᵢ), image warping (paper 003).
* :mod:`.conserved` — quadratic conserved quantities and their flows, generator analysis (Noether's razor).
* :mod:`.ode_flow` — learned non-quadratic conserved quantities and their flows by RK4 (Noether's razor).
* :mod:`.equivariant_layers` — equivariant and relaxed layers: CONV, FC, F-FC, S-FC, S-CONV, GCONV (paper 004).
* :mod:`.priors` — priors over η for models that treat it as a latent variable (``symmetry_prior``).
"""
