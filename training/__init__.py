"""Training side of erasure-mdl: data, fit loop, prequential MDL, the Hydra entrypoint."""

from training.app.resolvers import register as _register_resolvers

_register_resolvers()
