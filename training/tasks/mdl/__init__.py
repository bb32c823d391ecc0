"""task=mdl (the default): dataset -> eraser -> prequential MDL -> full-data run (training/tasks/mdl/job.py); its tables
are the aggregate's MDL pipeline (training/tasks/mdl/aggregate_render.py)."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

from training.app.tasks import Collected, Task
from training.tasks.mdl.result import MdlResult

if TYPE_CHECKING:
    from training.app.lifecycle import Outcome
    from training.app.schema import JobConfig
    from training.inputs.store import Store


class Mdl(Task):
    name = "mdl"
    uses = None  # every group
    result_type = MdlResult
    numerics = 3  # unchanged by 4 (gs_erased_eval's erase path)

    def implementation(self) -> ModuleType:
        import training.tasks.mdl.job as job

        return job

    def lifecycle(self) -> dict[str, Any]:
        from training.tasks.mdl.job import LIFECYCLE  # the precheck, the data fingerprint, the finished sections

        return LIFECYCLE

    def run_cell(self, cfgs: list[JobConfig], store: Store | None = None) -> list[Outcome]:
        """The cell's seeds together: one lockstep group of every seed's block models (training/tasks/mdl/cell.py)."""
        from training.tasks.mdl.job import run_cell

        return run_cell(cfgs, store)

    def rows(self, collected: Collected) -> dict[str, str]:
        from training.tasks.mdl.aggregate_render import mdl_tables

        return mdl_tables(collected)


TASK = Mdl()
