"""The η-posterior ("uncertain symmetry") investigation: how well a variational q(η) over a symmetry
parameter matches the posterior p(η | D), and why the ELBO's does not (``REPORT.md``).

Its pieces, on top of the library's public API:

* :mod:`.evidence_profile` — the fitted guide's own ``IWAE_K(η_j)`` at fixed η_j (the amortisation profile).
* :mod:`.iwae_given_symmetry` — ``elbo="iwae-given-symmetry"`` (registered with ``fit`` on import).
* :mod:`.symmetry_warmup` — train q(θ | η) across a wide, held q(η) before the joint fit.
* :mod:`.collapsed_symmetry` — the optimal q(η) for a fitted q(θ | η), by quadrature over one scalar η;
  its draws from :class:`.distributions.PiecewiseLinear`.
* :mod:`.annealed_evidence`, :mod:`.laplace_evidence` — ``log p(D | η)`` of an invariant MLP's read-out by
  annealed importance sampling and by Laplace.
* :mod:`.common` — the scripts' helpers (result files, resumable units); the scripts are in ``scripts/``,
  their results in ``results/``.
"""

from research.uncertain_symmetry import iwae_given_symmetry  # noqa: F401  (registers elbo="iwae-given-symmetry")
