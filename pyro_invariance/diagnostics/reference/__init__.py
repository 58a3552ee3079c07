"""Reference posteriors in the spirit of posteriordb: NUTS draws for small catalogue entries.

* :mod:`.entries` — the catalogue: each :class:`ReferenceEntry` is *model × data* with a small
  metadata record (what it is, which paper and figure, which symmetry, the symmetry parameters
  held fixed or made latent) and its :class:`NUTSSettings`;
* :mod:`.nuts` — :func:`run_nuts` samples an entry's latent sites with Pyro's NUTS;
  :func:`diagnose` / :func:`passes` check rank-normalised split R-hat < :data:`RHAT_MAX` (1.01) and
  bulk ESS > :data:`ESS_BULK_MIN` (400) for every scalar (Vehtari et al. 2021, as ArviZ computes them);
* :mod:`.store` — :func:`save_reference` / :func:`load_reference`: the draws (``posteriors/<name>.npz``,
  float32, ``(chain, draw, *site shape)``) and their metadata (``posteriors/<name>.json``: sampler
  settings, seed, R-hat / ESS, wall time, data settings and fingerprint, versions, date), package data
  in :data:`REFERENCE_DIR`;
* :mod:`.scoring` — :func:`score_guide` / :func:`score_draws`: a guide against a reference
  (standardised mean error, log variance ratio, sliced Wasserstein-2 with its Monte-Carlo floor,
  mean 1-D Wasserstein-1); :func:`fit_and_score` fits guides by SVI and scores them;
* :mod:`.cli` — ``python -m pyro_invariance.diagnostics.reference {list, regenerate, check, score}``.
"""

from pyro_invariance.diagnostics.reference.cli import main
from pyro_invariance.diagnostics.reference.entries import (
    DATA_SOURCES,
    ENTRIES,
    QUICK,
    NUTSSettings,
    ReferenceEntry,
    entry,
    names,
)
from pyro_invariance.diagnostics.reference.nuts import (
    ESS_BULK_MIN,
    RHAT_MAX,
    diagnose,
    passes,
    run_nuts,
)
from pyro_invariance.diagnostics.reference.scoring import (
    fit_and_score,
    guide_draws,
    score_draws,
    score_guide,
    sliced_wasserstein2,
)
from pyro_invariance.diagnostics.reference.store import (
    REFERENCE_DIR,
    Reference,
    ReferenceFileError,
    data_fingerprint,
    load_reference,
    save_reference,
)

__all__ = [
    "DATA_SOURCES",
    "ENTRIES",
    "ESS_BULK_MIN",
    "QUICK",
    "REFERENCE_DIR",
    "RHAT_MAX",
    "NUTSSettings",
    "Reference",
    "ReferenceEntry",
    "ReferenceFileError",
    "data_fingerprint",
    "diagnose",
    "entry",
    "fit_and_score",
    "guide_draws",
    "load_reference",
    "main",
    "names",
    "passes",
    "run_nuts",
    "save_reference",
    "score_draws",
    "score_guide",
    "sliced_wasserstein2",
]
