"""The command lines users run (aggregate, plan, calibrate, show_erasure, coord_check): `python -m scripts.<name>`."""
