"""What the Gradient Starvation task declarations share."""

from __future__ import annotations

from typing import Any

from training.app.tasks import Collected, Task
from training.tasks.gs.result import StarvationResult

# hashed dataset keys of the image pipeline, which the synthetic GS tasks do not read
NOT_AN_IMAGE_PIPELINE = {"dataset.augment": False, "dataset.zscore": False, "dataset.zscore_order": "before",
                         "dataset.limit": None, "dataset.permute_labels": False}


def _method(result: dict[str, Any]) -> str:
    return str(result["method"])


class StarvationTask(Task):
    """A Gradient Starvation task: options in the `gs` group; its result names the method (ERM / SD λ=...)."""

    group = "gs"
    result_type = StarvationResult

    def lifecycle(self) -> dict[str, Any]:
        return {"describe": _method}

    def rows(self, collected: Collected) -> dict[str, str]:
        """The task's tables (and plots) of its results (aggregate_gs.py `TABLES`), if it has any."""
        if not collected.results:
            return {}
        from training.tasks.gs.aggregate_gs import TABLES

        return TABLES[self.name](collected.as_written(), collected.out)
