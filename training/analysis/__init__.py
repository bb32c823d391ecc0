"""The analysis below the tasks and the scripts: results collected into job and cell rows, seed statistics, the
tables and plots (the MDL task's and the Gradient Starvation tasks'). Task declarations (training/tasks/) name their
tables here; scripts/aggregate.py is the command line over it (with the claims, training/tasks/mdl/claims.py)."""
