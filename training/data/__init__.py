"""Datasets as in-memory tensors: float32 images in [0, 1], NCHW, int64 labels. Each loader module registers its
datasets in `registry.DATASETS` when imported; the list below is every one of them (a new loader adds its line).
`erase` (eraser through the cache) and `cache` are imported where used.
"""

# the loader modules, each registering itself
from training.data import colored_mnist, generators, image_sets, moons, offline
from training.data.registry import DatasetMissingError, LoadedData, load_dataset

__all__ = ["DatasetMissingError", "LoadedData", "colored_mnist", "generators", "image_sets", "load_dataset", "moons",
           "offline"]
