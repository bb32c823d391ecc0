"""The app layer: task registry, job directories and results, the multirun ledger, sweeps, logging."""
