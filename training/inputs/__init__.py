"""A job's inputs, below the tasks that use them: the data steps in one pass (pipeline.py: load, permute the labels,
plan the fit, fit, erase, z-score, certify), how the eraser is fitted (plan.py), the one erase path through the
erased-data cache (erase.py), where inputs are kept (store.py) and the fit settings the tasks share
(fit_settings.py)."""
