"""Data for the papers' experiments, written against the array API.

Images (:mod:`geoarray.data.images`): scikit-learn's digits, MNIST IDX files from a local
directory, patch extraction, one-hot labels and train/test splits.
"""

from .images import load_digits, load_mnist, one_hot, patches, read_idx, train_test_split, unpatch

__all__ = ["load_digits", "load_mnist", "one_hot", "patches", "read_idx", "train_test_split", "unpatch"]
