"""Command-line scripts (aggregate, benchmarks, plots); importable as `scripts.<name>` (the package is installed)."""
