"""Block-Cholesky guide (paper 003): one full-covariance Gaussian per row of each weight matrix.

For every weight-matrix site ``W`` of shape ``(C, H)`` (rows = output classes; see
:func:`~pyro_invariance.guides.base.is_matrix_site`)::

    q(W) = Π_c N(W_c; μ_c, L_c L_cᵀ),     L_c = diag(s_c) · T_c,

with ``s_c > 0`` (softplus) and ``T_c`` unit lower triangular: a Gaussian over ``vec_r(W)`` with
block-diagonal covariance, one ``H×H`` Cholesky block per class (docs/methods.md §1, "Guide").
Initialisation: ``μ = 0`` (``init_loc_fn=init_to_feasible``) and ``L_c = init_scale·I`` (paper 003
starts at ``L = I``; the default ``init_scale`` is Pyro's 0.1, :data:`~.base.DEFAULT_INIT_SCALE`).
Every other latent site gets a mean-field Normal.

``log q`` of the guide's own sample is computed from the noise, ``−½‖ε‖² − Σ log s − const``
(:class:`~pyro_invariance.distributions.RowwiseMultivariateNormal`), not by re-solving
``L_c z = W_c − μ_c``, which broke down numerically in a large test (docs/methods.md §5). The KL to a
``Normal(...).to_event(2)`` prior is analytic under :class:`~pyro.infer.TraceMeanField_ELBO`.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from pyro.distributions import constraints
from pyro.infer.autoguide.initialization import init_to_feasible
from pyro.nn import PyroModule, PyroParam
from torch import Tensor

from pyro_invariance.distributions import RowwiseMultivariateNormal
from pyro_invariance.registry import GUIDES

from .base import DEFAULT_INIT_SCALE, InitLocFn, StructuredGuide, is_matrix_site

__all__ = ["BlockCholeskyGuide", "BlockCholeskySite"]


class BlockCholeskySite(PyroModule):
    """Parameters of ``q(W) = Π_c N(μ_c, L_c L_cᵀ)`` for one ``(C, H)`` site.

    The attributes hold constrained values.

    Attributes:
        loc: ``μ`` (C, H).
        scale: ``s`` (C, H), the diagonals of the ``L_c``.
        scale_tril: ``T`` (C, H, H), unit lower triangular.
    """

    def __init__(self, init_loc: Tensor, init_scale: float) -> None:
        super().__init__()
        C, H = init_loc.shape
        like = dict(dtype=init_loc.dtype, device=init_loc.device)
        self.loc = PyroParam(init_loc.clone(), constraints.real, event_dim=2)
        self.scale = PyroParam(torch.full((C, H), init_scale, **like), constraints.softplus_positive, 2)
        self.scale_tril = PyroParam(torch.eye(H, **like).expand(C, H, H).clone(), constraints.unit_lower_cholesky, 3)

    def cholesky_factor(self) -> Tensor:
        """``L_c = diag(s_c) T_c``, shape (C, H, H)."""
        return self.scale.unsqueeze(-1) * self.scale_tril

    def distribution(self) -> RowwiseMultivariateNormal:
        return RowwiseMultivariateNormal(self.loc, self.cholesky_factor())


@GUIDES.register(
    "block-cholesky",
    summary="full-covariance Gaussian per weight-matrix row (paper 003), mean-field elsewhere",
)
class BlockCholeskyGuide(StructuredGuide):
    """Block-Cholesky guide over weight matrices, mean-field Normal over all other sites.

    Args:
        model: a Pyro model.
        init_loc_fn: initialisation of the means (default ``init_to_feasible``: ``μ = 0``).
        init_scale: initial ``L_c = init_scale·I`` (default :data:`~.base.DEFAULT_INIT_SCALE`, 0.1;
            paper 003 uses ``L = I``), also the initial scale of the mean-field sites.
        create_plates: as in Pyro's autoguides.

    Raises:
        ValueError: ``init_scale <= 0``.
    """

    catalogue_name = "block-cholesky"

    def __init__(
        self,
        model: Callable,
        *,
        init_loc_fn: InitLocFn = init_to_feasible,
        init_scale: float = DEFAULT_INIT_SCALE,
        create_plates: Callable | None = None,
    ) -> None:
        super().__init__(model, init_loc_fn=init_loc_fn, init_scale=init_scale, create_plates=create_plates)

    def _is_structured(self, name: str, site: dict) -> bool:
        return is_matrix_site(site)

    def _make_structured(self, name: str, site: dict, init_loc: Tensor) -> BlockCholeskySite:
        return BlockCholeskySite(init_loc, self._init_scale)
