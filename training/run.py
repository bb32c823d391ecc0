"""`python -m training.run [overrides]` runs one job; add `-m` for a multirun. The entry lives in
training/cli/run.py (the command-line layer); this shim is what users type."""

from training.cli.run import main

if __name__ == "__main__":
    main()
