"""The command-line layer, on top of everything: the Hydra entry (`run`, reached through the shim training/run.py),
one-line error reporting (`report`), SIGTERM handling (`preemption`) and the multirun ledger Hydra calls back
(`ledger`, named in conf/config.yaml). Nothing imports it but the shim (tests/test_layers.py checks it)."""
