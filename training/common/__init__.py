"""The harness's bottom layer: atomic file writes (`files`), file locks that name their holder (`locks`) and
progress display (`progress`). It imports nothing of training/ above it, so engine/, data/, mdl/, starvation/, app/
and cli/ may all use it; erasure/ and models/ do not (they are libraries of their own)."""
