#!/usr/bin/env python
"""Aggregate result.json files into tables (Markdown, CSV, LaTeX) and plots (PNG).

    python -m scripts.aggregate outputs/runs --name all          # everything under a directory
    python -m scripts.aggregate --experiment demo --name demo    # exactly the jobs of a preset
    python -m scripts.aggregate --experiment paper_table_c --override paths.out_dir=/scratch/out
    python -m scripts.aggregate outputs/runs --strict            # refuse cells mixing code versions

Every cell (dataset, arch, width, depth, eraser) reports mean ± sd over its finished seeds. Erasers are compared
only where everything else is equal: results whose semantic configs differ in anything but the eraser and the
seed (a learning rate, a regularizer, a key one result did not record) fall into different groups, each with
tables (and plots, and a claims verdict) of its own, headed by the keys that differ; eraser options are variants
of the eraser, and so is `eraser.fit_on` (a `fit on` column: all | self | holdout | oracle). The repeats of a
repeated-holdout cell (`eraser.fit_on=holdout|self`, `eraser.repeat=0..`; `eraser.fold` in older results) are one
cell: each repeat is its own MDL run, the cell reports the mean over repeats × seeds (sd over seeds of the per-seed
means) and lists the repeats. Where an eraser ran out of sample (holdout) and in sample (self, or all at equal
n_coded), the "Brackets" table gives [out, in]; "Fit and training budget" gives per cell n_fit, n_coded, QLEACE's
working rank and dropped variance, why the block models stopped and the share at the cap (budget-bound above a
fifth). A permuted-label run (`dataset.permute_labels=true`) is the null of the cell it otherwise matches: the "Null
control" table gives its MDL and bias = null MDL − label entropy, flagged against the null's own SE with a floor
(below the entropy: label injection; training/analysis/tables.py); it corrects no number. Jobs that did not finish
are listed as missing, failed (a multirun's job-status ledger says so, or its MDL is not finite), partial
(progress.json: killed or still running), incomplete (result.json without an mdl section) or malformed (a
result.json that cannot be read: also a warning naming it); they are never filled in.
A cell whose seeds come from different commits (result.json provenance; none recorded: "unknown") is marked;
--strict refuses it. A cell whose runs were computed on different data (result.json `dataset.fingerprint`: files
swapped under the same names, another copy) is marked ‡ and never averaged; --strict refuses it.
With --experiment a result whose config hash differs from the preset's job is "other-config", not counted. Every
task makes the tables of its own results (`Task.rows`, training/tasks/*.py): the above are the MDL task's; the Gradient
Starvation tasks' are in training/tasks/gs/aggregate_gs.py.
"""

from __future__ import annotations

import argparse
import difflib
import re
import shutil
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import pandas as pd

from training.app.result_codec import flatten
from training.app.result_types import Result
from training.app.tasks import Collected, load_job, task_names, tasks
from training.common.sweeps import expand, presets, sweep_overrides
from training.tasks.mdl.aggregate_collect import collect_dir, collect_experiment
from training.tasks.mdl.aggregate_summary import commit_problems, data_problems, unverified_problems


def write_all(df: pd.DataFrame, results: list[Result], out: Path, name: str, title: str) -> str:
    """Every task's tables (`Task.rows`, training/tasks/*.py) from its results: table "" as <name>.md, table t as
    <name>_<t>.md; the text of all of them, the main tables first. A task whose tables fail is reported, not fatal,
    except for a file that cannot be written (OSError: raised)."""
    mine: dict[str, list[Result]] = defaultdict(list)
    for r in results:
        mine[r.task].append(r)
    if unknown := sorted(set(mine) - set(task_names())):
        print(f"note: {sum(len(mine[t]) for t in unknown)} result(s) of tasks not declared here ({', '.join(unknown)}) "
              "have no table", file=sys.stderr)
    tables: dict[str, str] = {}
    for task in tasks():
        try:
            made = task.rows(Collected(mine[task.name], df, out, name, title))
        except OSError:
            raise
        except Exception as e:  # noqa: BLE001 - the other tasks' tables stand on their own
            print(f"warning: the tables of task {task.name} failed ({type(e).__name__}: {e})", file=sys.stderr)
            continue
        tables.update(made)
    text = ""
    for key in sorted(tables, key=lambda k: (k != "", k)):
        (out / (f"{name}_{key}.md" if key else f"{name}.md")).write_text(tables[key])
        text += tables[key] if not text else f"\n{tables[key]}"
    return text


def strict_refusal(df: pd.DataFrame) -> str | None:
    """The one line --strict refuses with, or None: every cell's seeds from one known commit, on one data."""
    mixed, unknown = commit_problems(df)
    problems = []
    if other_data := data_problems(df):
        problems.append(f"{len(other_data)} cell(s) with runs on different data, by their dataset.fingerprint "
                        f"(first: {other_data[0]}); rerun them on one copy of the data")
    if mixed:
        problems.append(f"{len(mixed)} cell(s) with seeds from different commits (first: {mixed[0]})")
    if unknown:
        problems.append(f"{len(unknown)} result(s) without a recorded commit (first: {unknown[0]})")
    if unverified := unverified_problems(df):
        problems.append(f"{len(unverified)} result(s) whose checkout may have had uncommitted changes (provenance "
                        f"dirty null: git could not tell, e.g. safe.directory; first: {unverified[0]})")
    if not problems:
        return None
    return ("--strict: " + "; ".join(problems) + "; rerun those jobs with one version of the code, or aggregate "
            "without --strict")


def experiment_refusal(experiment: str, overrides: list[str]) -> str | None:
    """One line when `--experiment` names no preset or an `--override` does not compose (else None)."""
    from hydra.errors import HydraException

    if experiment not in (names := presets()):
        return (f"--experiment {experiment!r} is not a preset; the presets (conf/experiment/*.yaml) are: "
                f"{', '.join(names)}")
    from training.app.schema import ConfigError

    try:
        sweep_overrides(experiment, overrides)
        for cfg in expand(experiment, overrides, limit=1):
            load_job(cfg)  # a value the jobs would refuse
    except (HydraException, ConfigError) as err:
        first = " ".join(str(err).split("\n")[0].split())
        if unknown := re.match(r"Could not override '([^']+)'", first):
            keys = flatten(expand(experiment, [], limit=1)[0])
            near = difflib.get_close_matches(unknown[1], keys, n=3)
            first = (f"{unknown[1]} is not a key of the preset's config" + (f" (did you mean {', '.join(near)}?)"
                     if near else "") + f"; check its spelling, or write +{unknown[1]}=... to add a new key")
        return f"--experiment {experiment} with --override {' '.join(overrides)}: {first}"
    return None


def output_refusal(out: Path, name: str) -> str | None:
    """One line when the tables cannot be written as `<out>/<name>.*` (a name with a separator, a folder that cannot
    be made or written), checked before anything is computed; else None."""
    if not name or "/" in name or "\\" in name or name in (".", ".."):
        return f"--name {name!r} is not allowed: it names files in --out, so one name without / (e.g. --name demo)"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".{name}.write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        return f"--out {out} cannot be written ({err.strerror or err}): nothing was written; choose another --out"
    return None


def _refuse(line: str) -> int:
    print(f"error: {line}", file=sys.stderr)
    return 2  # a refusal: one line, exit 2


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", nargs="?", type=Path, help="directory searched for result.json")
    ap.add_argument("--experiment", help="aggregate exactly the jobs of this preset (missing ones shown)")
    ap.add_argument("--override", action="append", default=[], help="extra Hydra override for --experiment")
    ap.add_argument("--name", default=None, help="table/plot file stem (default: experiment name or 'results')")
    ap.add_argument("--out", type=Path, default=Path("outputs/tables"))
    ap.add_argument("--claims", action="store_true",
                    help="also print the paper's claims report (training/tasks/mdl/claims.py), per group; with "
                         "--experiment it is printed whenever the preset defines `claims`")
    ap.add_argument("--strict", action="store_true",
                    help="refuse (exit 2, one line) when a cell's seeds come from different commits or data "
                         "(dataset.fingerprint) or a result has no recorded commit (provenance.code.commit)")
    ap.add_argument("--set-aside", action="store_true",
                    help="also read the results a job moved aside when its data changed (result.data-<fingerprint>"
                         ".json; marked as runs on different data, never averaged)")
    args = ap.parse_args(argv)
    if args.override and not args.experiment:
        return _refuse(f"--override {args.override[0]} needs --experiment <preset> (it changes that preset's jobs); "
                       "give --experiment, or leave --override out to read the directory as it is")
    if args.experiment:
        if (line := experiment_refusal(args.experiment, args.override)) is not None:
            return _refuse(line)
        df, results = collect_experiment(expand(args.experiment, args.override))
        title = f"Experiment {args.experiment}"
    elif args.root:
        df, results = collect_dir(args.root, args.set_aside)
        title = f"Results under {args.root}"
    else:
        ap.error("give a directory or --experiment")
    if df.empty and not results:
        where = args.root if args.root is not None else f"the jobs of --experiment {args.experiment}"
        why = "" if args.root is None or args.root.is_dir() else (
            " (a file, not a directory)" if args.root.exists() else " (it does not exist)")
        return _refuse(f"no result.json under {where}{why}: run a sweep first, or give the directory that holds the "
                       "results (e.g. outputs/runs)")
    if args.strict and not df.empty and (line := strict_refusal(df)) is not None:
        return _refuse(line)
    name = args.name or args.experiment or "results"
    if (line := output_refusal(args.out, name)) is not None:
        return _refuse(line)
    keys = preset_claims(args.experiment, args.override) if args.experiment else None
    stage = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=args.out))  # moved into --out once all is written
    try:
        text, report = write_all(df, results, stage, name, title), None
        if (args.claims or keys) and not df.empty:
            from training.tasks.mdl import claims

            report = claims.markdown_groups(claims.evaluate_groups(df, keys, args.experiment))
            (stage / f"{name}_claims.md").write_text(report)
        for path in sorted(stage.iterdir()):
            path.replace(args.out / path.name)
    except OSError as err:
        return _refuse(f"--out {args.out}: the tables could not be written ({err.strerror or err}): nothing was "
                       "written; free space there or choose another --out")
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    print(text)
    print(f"wrote {args.out}/{name}.md, .csv, _jobs.csv, .tex and PNG plots", file=sys.stderr)
    if report is not None:
        print(report)
    return 0


def preset_claims(experiment: str, extra: list[str]) -> list[str] | None:
    """The claims a preset defines (its `claims` key), or None."""
    cfgs = expand(experiment, extra, limit=1)  # a preset-level key: every job has the same
    keys = load_job(cfgs[0]).claims if cfgs else None
    return [str(k) for k in keys] if keys else None


if __name__ == "__main__":
    sys.exit(main())

