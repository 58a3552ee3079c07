"""The symmetric-basis regression toy of talk 000, registered as ``"basis-toy"``.

1-D regression data from :func:`make_symmetric_toy` (``x ~ U[lo, hi]``,
``y = cos(ωx) + ε``, even in ``x``; ``even=False`` adds the odd part ``sin(ωx)``), split into a
training and a test set drawn with independent seeds, so that ``basis-regression`` can be fitted and
evaluated by name: ``pyro-invariance fit --model basis-regression --data basis-toy``.

Seeds: the training split is drawn from :data:`pyro_invariance.data.images.TRAIN_SEED` + ``seed``, the
test split from :data:`~pyro_invariance.data.images.TEST_SEED` + ``seed``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from pyro_invariance.data.images import TEST_SEED, TRAIN_SEED
from pyro_invariance.registry import DATASETS
from pyro_invariance.validation import check_positive_int, check_seed, refuse_data_dir

__all__ = ["RegressionDataset", "basis_toy", "make_symmetric_toy"]


@dataclass(repr=False, eq=False)
class RegressionDataset:
    """Real inputs and targets, train/test split (the attribute names of the other datasets).

    Attributes:
        name: registry name.
        x_train: ``(N, D_in)`` inputs; y_train: ``(N, D_out)`` targets.
        x_test: ``(M, D_in)``; y_test: ``(M, D_out)``.
        info: the settings that produced the data.
    """

    name: str
    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    info: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        return f"RegressionDataset({self.name!r}, train={tuple(self.x_train.shape)}, test={tuple(self.x_test.shape)})"


def basis_toy(
    train_size: int | None = None,
    test_size: int | None = None,
    *,
    noise: float = 0.1,
    even: bool = True,
    num_outputs: int = 1,
    lo: float = -3.0,
    hi: float = 3.0,
    seed: int = 0,
    data_dir: Any = None,
    root: Any = None,
    download: bool = False,
) -> RegressionDataset:
    """The symmetric-basis toy: ``train_size`` (default 100) and ``test_size`` (default 200) points
    of :func:`make_symmetric_toy` with ``noise``, ``even``, ``num_outputs``,
    ``lo``, ``hi``.

    Takes the keywords of every registered dataset: ``data_dir`` / ``root`` are refused unless
    ``None`` (the points are generated), ``download`` is ignored.

    Raises:
        ValueError: a size below 1, a non-integer ``seed``, a path given (one line naming it).
    """
    refuse_data_dir("basis-toy", data_dir=data_dir, root=root)
    train_size = check_positive_int("train_size", 100 if train_size is None else train_size)
    test_size = check_positive_int("test_size", 200 if test_size is None else test_size)
    seed = check_seed(seed)
    kw = {"noise": noise, "even": bool(even), "num_outputs": num_outputs, "lo": lo, "hi": hi}
    x_train, y_train = make_symmetric_toy(train_size, seed=TRAIN_SEED + seed, **kw)
    x_test, y_test = make_symmetric_toy(test_size, seed=TEST_SEED + seed, **kw)
    info = {
        "train_size": train_size,
        "test_size": test_size,
        "seed": seed,
        "train_seed": TRAIN_SEED + seed,
        "test_seed": TEST_SEED + seed,
        **kw,
    }
    return RegressionDataset("basis-toy", x_train, y_train, x_test, y_test, info)


def make_symmetric_toy(
    n: int,
    seed: int = 0,
    noise: float = 0.1,
    even: bool = True,
    num_outputs: int = 1,
    lo: float = -3.0,
    hi: float = 3.0,
) -> tuple[Tensor, Tensor]:
    """1-D regression data for the symmetric-basis toy (talk 000).

    ``x ~ U[lo, hi]`` and, for output ``d`` with frequency ``ω_d = 2 + d/2``::

        even=True:   y_d = cos(ω_d x) + ε                  (even: f(x) = f(−x))
        even=False:  y_d = cos(ω_d x) + sin(ω_d x) + ε     (a shifted wave; even and odd parts
                                                             of equal size)

    with ``ε ~ N(0, noise²)``. Deterministic in ``seed``.

    Returns:
        ``x`` of shape ``(n, 1)`` and ``y`` of shape ``(n, num_outputs)``, default dtype.
    """
    n = check_positive_int("n", n)
    num_outputs = check_positive_int("num_outputs", num_outputs)
    noise = float(noise)
    if not (math.isfinite(noise) and noise >= 0.0):
        raise ValueError(f"noise must be a finite number >= 0, got {noise!r}")
    lo, hi = float(lo), float(hi)
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"need finite lo < hi, got lo={lo}, hi={hi}")
    gen = torch.Generator().manual_seed(int(seed))
    x = lo + (hi - lo) * torch.rand(n, 1, generator=gen)
    omega = 2.0 + 0.5 * torch.arange(num_outputs, dtype=x.dtype)
    f = torch.cos(omega * x)
    if not even:
        f = f + torch.sin(omega * x)
    y = f + noise * torch.randn(n, num_outputs, generator=gen)
    return x, y


DATASETS.register(
    "basis-toy",
    summary="1-D regression y = cos(ωx) + ε (even; even=false adds sin(ωx)), the basis-regression toy (talk 000)",
    kind=("regression", "vectors"),
)(basis_toy)
