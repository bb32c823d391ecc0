"""Datasets as in-memory tensors: float32 images in [0, 1], NCHW, int64 labels."""

from training.data.registry import DatasetMissingError, LoadedData, load_dataset

__all__ = ["DatasetMissingError", "LoadedData", "load_dataset"]
