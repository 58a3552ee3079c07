"""Data: every dataset of the catalogue, registered in :data:`~pyro_invariance.registry.DATASETS`.

* :mod:`.images` — image classification (embedded digits, Fashion-MNIST, MNIST, CIFAR-10) and their
  rotated / translated / scaled variants (paper 003); :func:`load_dataset` for any registered name.
* :mod:`.quadrant` — paper 004's quadrant task and resized variants.
* :mod:`.physics` — Hamiltonian trajectories from our own integrators (Noether's razor).
* :mod:`.toy2d` — paper 003's 2-D rotation toy.
* :mod:`.basis_toy` — the symmetric-basis regression toy of talk 000 (``basis-toy``).
* :mod:`.arrays` — turning a dataset or an ``(x, y)`` pair into checked tensors for a model.
* :mod:`.idx` — the IDX file reader.

A new dataset is one module here that registers its factory with
``@DATASETS.register(name, kind=(task name, "images" | "vectors"))`` (the kind lets a model that cannot
take the rows be refused, naming the datasets that fit, before any data is built) and one import line
below.
"""

from pyro_invariance.data import basis_toy, images, physics, quadrant, toy2d  # noqa: F401  (each registers its datasets)
from pyro_invariance.data.arrays import prepare_arrays, test_arrays, train_arrays
from pyro_invariance.data.images import ImageDataset, list_datasets, load_dataset

__all__ = ["ImageDataset", "list_datasets", "load_dataset", "prepare_arrays", "test_arrays", "train_arrays"]
