"""Hydra finds this package's launcher (`hydra/launcher=slurm`) in the `hydra_plugins` namespace package."""
