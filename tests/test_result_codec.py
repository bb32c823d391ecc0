"""result.json's one codec (training/app/result_codec.py) on stored results of every schema version.

tests/fixtures/results/:
- schema2_digits_leace.json   written by today's job lifecycle (a tiny digits job, no final model): schema 2
- numerics2_{leace,gradient}.json   real results of an older main (no schema_version; `eraser.fold` in the config)
- pre_v2_leace_trimmed.json   numerics2_leace.json trimmed by hand to what a result written before hash v2 held: no
  hash_version, numerics_version, task, provenance, dataset.fingerprint or group tags; the pre-v2 job path
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from training.app.result_codec import MalformedResultError, config_view, encode, new_result, upgrade
from training.app.result_types import ENVELOPE_KEYS, RESULT_SCHEMA, Result, Sections
from training.app.results import stored_hash
from training.app.tasks import decode_result, spec_of
from training.tasks.gs.result import StarvationResult
from training.tasks.mdl import aggregate_collect
from training.tasks.mdl.job_paths import JobPath
from training.tasks.mdl.result import MdlResult, MdlSections

FIXTURES = Path(__file__).parent / "fixtures" / "results"
CURRENT = "schema2_digits_leace.json"
OLDER = ("numerics2_leace.json", "numerics2_gradient.json", "pre_v2_leace_trimmed.json")


def _raw(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


@pytest.mark.parametrize("name", [CURRENT, *OLDER])
def test_every_stored_version_decodes_to_a_typed_mdl_result(name: str) -> None:
    raw = _raw(name)
    result = decode_result(raw)
    assert isinstance(result, MdlResult) and result.schema_version == RESULT_SCHEMA and result.task == "mdl"
    assert result.body.mdl is not None and result.body.mdl.bits_per_sample == raw["mdl"]["bits_per_sample"]
    assert result.body.mdl.legacy == raw["mdl"]["legacy"] and result.body.mdl.has_legacy
    assert [b.stop_reason for b in result.body.mdl.blocks] == [b["stop_reason"] for b in raw["mdl"]["blocks"]]
    if raw.get("final") is not None:
        assert result.body.final is not None and result.body.final.val_loss_bits == raw["final"]["val_loss_bits"]
    else:  # mdl.full_run=false
        assert result.body.final is None
    assert result.body.erasure.fit.n_coded == raw["eraser"]["fit"]["n_coded"]
    assert result.config == raw["config"]  # as recorded: the job hash is recomputed from exactly this
    assert result.config_hash == raw["config_hash"]


def test_what_the_writer_writes_round_trips_byte_for_byte() -> None:
    text = (FIXTURES / CURRENT).read_text()
    raw = json.loads(text)
    assert upgrade(raw) == raw  # a current result is not touched
    again = encode(decode_result(raw))
    assert again == raw and list(again) == list(raw)
    assert json.dumps(again, indent=2) == json.dumps(raw, indent=2)
    assert list(raw)[:7] == ["config_hash", "hash_version", "numerics_version", "schema_version", "job_dir",
                             "task", "config"] and list(raw)[-3:] == ["device", "timings", "provenance"]
    # What an MDL job's body returns (`MdlSections`) is what the tables read of its result (`MdlResult.body`), and
    # the result the lifecycle makes of it encodes to the bytes of a result.json written by the job.
    envelope = {k: raw[k] for k in ("config_hash", "hash_version", "numerics_version", "job_dir", "config", "device",
                                    "timings", "provenance")}
    sections = MdlSections.read({k: v for k, v in raw.items() if k not in ENVELOPE_KEYS})
    made = new_result(**envelope, task="mdl", sections=sections, spec=spec_of("mdl"))
    assert isinstance(made, MdlResult) and made.body is sections and made.dataset == decode_result(raw).dataset
    assert json.dumps(encode(made), indent=2) == json.dumps(raw, indent=2)
    read = decode_result(raw)
    assert type(read.body) is MdlSections and read.body == sections and read.body.mdl is not None
    with pytest.raises(TypeError, match="returned Sections, not MdlSections"):
        new_result(**envelope, task="mdl", sections=Sections.read(sections.written), spec=spec_of("mdl"))
    with pytest.raises(ValueError, match=r"\['task'\] are envelope keys"):
        new_result(**envelope, task="mdl", sections=MdlSections.read({**sections.written, "task": "x"}),
                   spec=spec_of("mdl"))


@pytest.mark.parametrize("name", OLDER[:2])
def test_an_older_result_gains_only_its_schema_version(name: str) -> None:
    raw = _raw(name)
    assert "schema_version" not in raw
    upgraded = encode(decode_result(raw))
    assert upgraded.pop("schema_version") == RESULT_SCHEMA
    assert upgraded == raw and list(upgraded) == list(raw)
    result = decode_result(raw)
    assert result.numerics_version == 2 and result.hash_version == 2
    assert result.dataset.fingerprint is not None and result.dataset.fingerprint.content == \
        raw["dataset"]["fingerprint"]["content"]
    assert aggregate_collect.commit_of(result) == raw["provenance"]["code"]["commit"][:10]


def test_a_result_written_before_hash_v2_reads_with_the_values_it_stood_for() -> None:
    raw = _raw("pre_v2_leace_trimmed.json")
    result = decode_result(raw)
    assert (result.numerics_version, result.hash_version, result.task) == (1, 1, "mdl")
    assert result.dataset.fingerprint is None and result.provenance is None
    assert aggregate_collect.commit_of(result) == aggregate_collect.UNKNOWN_COMMIT
    assert aggregate_collect.data_of(result) is None
    view = config_view(result.config)
    assert view["dataset.tag"] == "mnist5k" and view["arch.tag"] == "mlp"  # tags default to the names
    assert view["eraser.repeat"] == 0 and "eraser.fold" not in view  # eraser.fold reads as eraser.repeat
    assert stored_hash(result, spec_of("mdl")) is not None  # rehashed under numerics 1, as the lifecycle does
    assert JobPath.parse(str(result.job_dir)) == JobPath("mnist5k", "leace", "mlp_relu", 128, 2, None, 1)


def test_a_newer_schema_or_not_an_object_is_refused_in_one_line_and_other_tasks_decode_to_their_class() -> None:
    with pytest.raises(MalformedResultError, match=r"schema_version 3 is newer than this code"):
        decode_result({**_raw(CURRENT), "schema_version": RESULT_SCHEMA + 1})
    bad: Any  # deliberately not a JSON object
    for bad in ([], 42, "text"):
        with pytest.raises(MalformedResultError, match="not a JSON object"):
            decode_result(bad)
    # other tasks decode to their own class
    gs = decode_result({"config_hash": "h", "task": "gs_two_moons", "config": {"task": "gs_two_moons"}, "method": "ERM",
                 "train": {"acc": 1.0}})
    assert isinstance(gs, StarvationResult) and gs.body.method == "ERM" and gs.section("train") == {"acc": 1.0}
    other = decode_result({"config_hash": "h", "config": {"task": "toy"}})
    assert type(other) is Result and other.task == "toy"  # no schema_version: the task comes from the config


def test_the_aggregate_reads_every_stored_version(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for name in (CURRENT, *OLDER):
        raw = _raw(name)
        job = JobPath.parse(raw["job_dir"])
        assert job is not None
        job.under(runs).mkdir(parents=True, exist_ok=True)
        (job.under(runs) / "result.json").write_text(json.dumps(raw))
    df, results = aggregate_collect.collect_dir(runs)
    assert len(results) == 4 and all(isinstance(r, MdlResult) for r in results)
    assert sorted(df.status) == ["done"] * 4
    for name in (CURRENT, *OLDER):
        raw = _raw(name)
        row = df[df.job_dir.str.endswith(JobPath.parse(raw["job_dir"]).subdir)].iloc[0]  # type: ignore[union-attr]
        assert row.bits_per_sample == raw["mdl"]["bits_per_sample"]
        assert math.isclose(row.n_coded, raw["eraser"]["fit"]["n_coded"])


def test_a_job_directory_writes_and_reads_through_the_codec(tmp_path: Path) -> None:
    from training.app.results import JobDir, read_result

    raw = _raw(CURRENT)
    job = JobDir(tmp_path, raw["config_hash"], spec_of("mdl"))
    job.write_result(decode_result(raw))
    assert json.loads((tmp_path / "result.json").read_text()) == raw
    done = job.finished()
    assert isinstance(done, MdlResult) and encode(done) == raw  # SKIP: the stored result, typed
    (tmp_path / "result.json").write_text(json.dumps({**raw, "schema_version": RESULT_SCHEMA + 1}))
    assert read_result(tmp_path / "result.json", spec_of("mdl")) is None  # a newer schema: not read, never reused
