"""Follow one value through the code (its "value trail", docs/code-map.md): run a tiny job in this process under
`sys.settrace` and record every call of a project function, inside an entry function's call, that is handed the object
the entry received as one of its arguments (by identity; a `handoff` function's result is followed too). Per trail:
the distinct functions, the returns to a module it had left (A -> B -> A counts one) and the distinct modules.

    PYTHONPATH=$PWD python -m tools.value_trail [-v]     # -v: the functions of each trail
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

PROJECT = ("atomicio", "erasure", "models", "training", "scripts")


@dataclass
class Trail:
    """One followed value: the entry `function` (a code object's name) and the `argument` whose object is followed."""

    function: str
    argument: str
    handoff: tuple[str, ...] = ()  # functions that rebuild the value: what they return is followed too
    targets: list[Any] = field(default_factory=list)  # the value and its rebuilt forms
    entry: FrameType | None = None  # the entry's frame: calls are recorded while it is on the stack
    visits: list[tuple[str, str]] = field(default_factory=list)  # (module, function) per call it was handed to
    # inside a handoff's call: (module, function, arguments) of every call, matched once it returns its new form
    pending: list[tuple[str, str, list[Any]]] | None = None

    def holds(self, qualname: str, args: list[Any]) -> bool:
        """Whether a call of `qualname` with `args` is handed the value (its own construction is not)."""
        if qualname.endswith("__init__") and args and any(args[0] is t for t in self.targets):
            return False
        return any(a is t for a in args for t in self.targets)

    def figures(self) -> tuple[int, int, int]:
        """(functions, returns to a module left before, modules)."""
        modules = [m for m, _ in self.visits]
        back = sum(1 for i, m in enumerate(modules) if i and m != modules[i - 1] and m in modules[:i])
        return len(dict.fromkeys(self.visits)), back, len(set(modules))


def _arguments(frame: FrameType) -> list[Any]:
    code = frame.f_code
    n = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 0x04) + bool(code.co_flags & 0x08)
    return [frame.f_locals[name] for name in code.co_varnames[:n] if name in frame.f_locals]


def _inside(frame: FrameType | None, entry: FrameType | None) -> bool:
    while frame is not None and frame is not entry:
        frame = frame.f_back
    return frame is not None


def follow(trails: list[Trail], run: Callable[[], Any], project: tuple[str, ...] = PROJECT) -> None:
    """Run `run()` under a tracer that fills every trail's visits (each trail starts at its entry's first call)."""

    def handed_back(trail: Trail) -> Callable[[FrameType, str, Any], Any]:
        """The local tracer of a handoff's frame: on its return, what it returns is followed too, and the calls made
        inside it are matched against the value's forms."""

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "return" and trail.pending is not None:
                trail.targets += [] if any(arg is t for t in trail.targets) else [arg]
                trail.visits += [(module, fn) for module, fn, args in trail.pending if trail.holds(fn, args)]
                trail.pending = None
            return local

        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        if event != "call":
            return None
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(project) and module != "__main__":
            return None
        name, args, local = frame.f_code.co_name, None, None
        for trail in trails:
            if not trail.targets and name == trail.function and trail.argument in frame.f_locals:
                trail.targets, trail.entry = [frame.f_locals[trail.argument]], frame
            if trail.targets and _inside(frame, trail.entry):
                args = _arguments(frame) if args is None else args
                if trail.pending is not None:
                    trail.pending.append((module, frame.f_code.co_qualname, args))
                elif trail.holds(frame.f_code.co_qualname, args):
                    if name in trail.handoff:
                        trail.pending = [(module, frame.f_code.co_qualname, args)]
                        local = handed_back(trail)
                    else:
                        trail.visits.append((module, frame.f_code.co_qualname))
        return local

    sys.settrace(tracer)  # a tracer that returns None traces no lines of the frame
    try:
        run()
    finally:
        sys.settrace(None)


def main() -> None:
    from training.common.sweeps import expand
    from training.tasks.mdl.job import run_job

    trails = [Trail("run_job", "config", handoff=("load_config",)), Trail("run_in_job_dir", "cfg"),
              Trail("prepare_inputs", "cfg"), Trail("prepare_inputs", "store"), Trail("apply_eraser", "data")]
    with tempfile.TemporaryDirectory() as out:
        job = expand("smoke", [f"paths.out_dir={out}", "eraser=leace", "mdl.max_epochs=1", "progress=false"])[0]
        follow(trails, lambda: run_job(job))
    print("value                  functions  returns  modules")
    for t in trails:
        f, r, m = t.figures()
        print(f"{t.function + ':' + t.argument:<22} {f:>9} {r:>8} {m:>8}")
        if "-v" in sys.argv:
            for module, fn in dict.fromkeys(t.visits):
                print(f"    {module}.{fn}")


if __name__ == "__main__":
    main()
