"""Hydra discovers this package's launcher (`hydra/launcher=packed`) in the `hydra_plugins` namespace package."""
