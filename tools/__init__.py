"""Operations: benchmarks, the GPU report, the SLURM cluster and test-tier helpers, code-shape instruments. Not
installed: run from the checkout as `python -m tools.<name>`."""
