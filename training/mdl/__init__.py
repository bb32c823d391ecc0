"""Prequential MDL: pure code-length arithmetic (`code`), nested splits (`splits`), the MDL job (`job`)."""
