"""Data for the papers' experiments, written against the array API.

Images (:mod:`geoarray.data.images`): scikit-learn's digits, MNIST IDX files from a local
directory, patch extraction, one-hot labels and train/test splits.
Dynamics: integrators (:mod:`~geoarray.data.integrators`), systems (:mod:`~geoarray.data.systems`)
and windowing (:mod:`~geoarray.data.windows`).
"""

from .images import load_digits, load_mnist, one_hot, patches, read_idx, train_test_split, unpatch
from .integrators import ConvergenceError, implicit_midpoint, stormer_verlet
from .windows import batches, shuffle, windows

__all__ = [
    "ConvergenceError",
    "batches",
    "implicit_midpoint",
    "load_digits",
    "load_mnist",
    "one_hot",
    "patches",
    "read_idx",
    "shuffle",
    "stormer_verlet",
    "train_test_split",
    "unpatch",
    "windows",
]
