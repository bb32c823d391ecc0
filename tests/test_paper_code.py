"""The public code's protocol as options: `optim=adamw` (torch's AdamW with a schedule, evaluated as trained),
`mdl.stopping=backtrack`, `mdl.batch_order=fixed`, `mdl.split=redraw`, the `mdl=paper_code` /
`experiment=paper_code` presets, their refusals and their place in the job hash (only away from their defaults)."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import training.tasks.mdl.trainer as trainer_mod
from models import build_model
from tests.helpers import ENV, REPO, TINY, fit_settings, job_config, result_of
from tests.test_vectorized import SHAPE, K, _arch, _data
from training.app.schema import ConfigError, semantic
from training.app.tasks import job_hash, load_job
from training.engine.fit import FitResult, Member, TrainData, cross_entropy_sum, fit, fit_temperature
from training.engine.group import why_not_vectorized
from training.engine.optim import OptimSettings
from training.engine.seeding import generator, seeded_global_rng
from training.inputs.fit_settings import resolve_optim
from training.tasks.mdl.code import partition_logspace
from training.tasks.mdl.job import run_job
from training.tasks.mdl.refusals import check_one_at_a_time
from training.tasks.mdl.splits import MdlSplit, make_split, smallest_block
from training.tasks.mdl.trainer import Trainer, split_of

NEW_KEYS = {"optim": ("name", "schedule"), "mdl": ("stopping", "batch_order", "split")}


def _member(name: str, lr: float, schedule: str = "constant", **fit_given: object) -> Member:
    with seeded_global_rng(0, "init", 1):
        model = build_model(_arch("mlp"), SHAPE, K)
    settings = OptimSettings(lr_base=lr, lr=lr, depth_lr_multiplier=1.0, beta1=0.9, beta2=0.999, weight_decay=0.01,
                             warmup_steps=0, batch_size=40, name=name, schedule=schedule)
    cfg = fit_settings(**{"batch_size": 40, "patience": 3, "max_epochs": 6, "lr_schedule": schedule, **fit_given})
    return Member(model, settings.build(model), torch.arange(80, 400), generator(0, "b", 1), cfg)


def _fit(member: Member) -> tuple[dict[str, torch.Tensor], FitResult]:
    data, y, xv, yv = _data()
    init = {k: v.clone() for k, v in member.model.state_dict().items()}
    return init, fit(member, TrainData(data, y, xv, yv))


def _losses(member: Member) -> list[float]:
    return [v for _, v in _fit(member)[1].curve]


# ---- optim=adamw -----------------------------------------------------------------------------------------------
def _rates(m: Member) -> list[float]:
    """The learning rate of every optimizer step of `m`'s fit (its last group: vector-like, unscaled by μP)."""
    rates: list[float] = []
    m.optimizer.register_step_pre_hook(lambda opt, args, kwargs: rates.append(opt.param_groups[-1]["lr"]))
    _fit(m)
    return rates


def test_adamw_is_torch_adamw_evaluated_as_trained_with_a_cosine_schedule_per_epoch() -> None:
    """torch's AdamW (no averaged iterate, no modes): the model fit returns scores its best validation loss."""
    m = _member("adamw", 3e-3)
    assert isinstance(m.optimizer, torch.optim.AdamW) and not hasattr(m.optimizer, "eval")
    assert {g["betas"] for g in m.optimizer.param_groups} == {(0.9, 0.999)}  # (μP scales lr and weight decay)
    _, res = _fit(m)
    _, _, xv, yv = _data()
    assert not m.model.training
    assert cross_entropy_sum(m.model, xv, yv) / len(yv) == res.best_val_loss
    # `optim.schedule=cosine`: epoch e (1-based) trains at lr·(1 + cos(π (e-1) / max_epochs)) / 2 (torch's
    # CosineAnnealingLR stepped once per epoch); `constant` trains every step at lr
    lr, epochs, spe = 2e-3, 5, 8  # 320 rows in batches of 40
    rates = _rates(_member("adamw", lr, "cosine", max_epochs=epochs, patience=100))
    assert len(rates) == epochs * spe
    for e in range(epochs):
        want = lr * (1 + math.cos(math.pi * e / epochs)) / 2
        assert rates[e * spe: (e + 1) * spe] == pytest.approx([want] * spe, rel=1e-12), e
    assert set(_rates(_member("adamw", lr, "constant", max_epochs=epochs, patience=100))) == {lr}


# ---- mdl.stopping=backtrack, mdl.batch_order=fixed -------------------------------------------------------------
@pytest.mark.parametrize("name", ["adamw", "schedulefree"])
def test_backtracking_replays_the_best_state(name: str) -> None:
    """A rate too high to improve on the untrained model: backtracking reloads the untrained model and its (empty)
    optimizer state after every epoch, so with the batches in a fixed order every epoch is the same epoch again
    (equal validation losses, bitwise); it stops after `patience` of them with the untrained model (best epoch 0,
    validated at step 0), as the public code's first chunks can. Shuffled batches, or no backtracking, differ."""
    m = _member(name, 1.0, stopping="backtrack", batch_order="fixed", patience=3, max_epochs=20)
    init, res = _fit(m)
    losses = [v for _, v in res.curve]
    assert res.curve[0][0] == 0 and res.best_epoch == 0 and res.epochs == 3 and res.stop_reason == "patience"
    assert losses[1] > losses[0] and losses[1:] == [losses[1]] * 3
    assert all(torch.equal(v, init[k]) for k, v in m.model.state_dict().items())
    shuffled = _losses(_member(name, 1.0, stopping="backtrack", batch_order="shuffled", patience=3, max_epochs=20))
    assert shuffled[0] == losses[0] and len(set(shuffled[1:])) == 3
    plain = _losses(_member(name, 1.0, batch_order="fixed", patience=3, max_epochs=20))
    assert len(set(plain)) == len(plain) > 3


def test_backtracking_changes_nothing_while_the_model_improves() -> None:
    """On epochs with a new best nothing is reloaded: up to the first epoch without one, backtracking's validation
    losses equal the plain rule's bitwise (after its extra validation of the untrained model)."""
    a = _losses(_member("adamw", 3e-3, stopping="backtrack", batch_order="fixed", patience=3, max_epochs=30))
    b = _losses(_member("adamw", 3e-3, batch_order="fixed", patience=3, max_epochs=30))
    first_worse = next((i for i in range(2, len(a)) if a[i] >= min(a[:i])), len(a))
    assert first_worse >= 3 and a[1: first_worse + 1] == b[:first_worse]


# ---- one model at a time ---------------------------------------------------------------------------------------
def test_adamw_and_backtracking_train_one_model_at_a_time(tmp_path: Path) -> None:
    """The lockstep group steps schedule-free AdamW and never reloads a state: a group takes neither (the trainer
    trains such models with `fit`), and an explicit stacked engine or fused step is refused in one line."""
    m = _member("adamw", 1e-3)
    assert why_not_vectorized(m.model, m.optimizer) is not None
    assert _member("schedulefree", 1e-3, stopping="backtrack").cfg.one_at_a_time() is not None
    assert _member("schedulefree", 1e-3).cfg.one_at_a_time() is None
    for extra in (["training.engine=stacked"], ["training.fused_optimizer=true"]):
        for why in (["optim=adamw"], ["mdl.stopping=backtrack"]):
            with pytest.raises(ConfigError, match=r"is not allowed with (optim.name=adamw|mdl.stopping=backtrack): "):
                check_one_at_a_time(load_job(job_config(tmp_path, [*why, *extra])))
    check_one_at_a_time(load_job(job_config(tmp_path, ["optim=adamw", "training.engine=loop"])))
    check_one_at_a_time(load_job(job_config(tmp_path, ["training.engine=stacked"])))


# ---- refusals --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("overrides", "match"), [
    (["optim=adamw", "optim.schedule=linear"], r"^optim.schedule='linear' is not allowed: optim.schedule must be one "),
    (["mdl=paper_code", "mdl.patience=0"], r"^mdl.patience=0 is not allowed: mdl.patience must be an integer ≥ 1"),
    (["mdl.stopping=backtracking"], r"^mdl.stopping='backtracking' is not allowed: mdl.stopping must be one of"),
    (["optim=adamw", "optim.warmup_steps=1000"],
     r"^optim.warmup_steps=1000 is not allowed: optim.warmup_steps is read only with optim.name=schedulefree"),
    (["optim.schedule=cosine"], r"^optim.schedule=cosine is not allowed: optim.schedule is read only with "
                                r"optim.name=adamw"),
    (["mdl.split=redraw"], r"^mdl.split=redraw is not allowed: mdl.split is read only with mdl.protocol=paper \(here "
                           r"prequential\); leave it at once or set mdl.protocol=paper$"),
    (["mdl=paper", "mdl.split=each"], r"^mdl.split='each' is not allowed: mdl.split must be one of once, redraw"),
])
def test_bad_values_are_refused_in_one_line(tmp_path: Path, overrides: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as err:
        load_job(job_config(tmp_path, overrides))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("overrides", "line"), [
    (["optim=adamw", "optim.warmup_steps=5"], "optim.warmup_steps=5 is not allowed"),
    (["mdl.split=redraw"], "mdl.split=redraw is not allowed: mdl.split is read only with mdl.protocol=paper"),
])
def test_a_refused_key_exits_2_and_writes_nothing(tmp_path: Path, overrides: list[str], line: str) -> None:
    """Through the command line: one line, exit 2, no job directory."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "training.run", *TINY, *overrides, f"paths.out_dir={out}",
                           "logger=none"], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and line in lines[0], proc.stderr
    assert not (out / "runs").exists()


# ---- presets and the job hash ----------------------------------------------------------------------------------
def test_new_keys_enter_the_hash_only_away_from_their_defaults(tmp_path: Path) -> None:
    plain = job_config(tmp_path)
    sem = semantic(load_job(plain))
    assert not any(k in sem[g] for g, keys in NEW_KEYS.items() for k in keys)
    base = job_hash(plain)
    for override in ("optim=adamw", "mdl.stopping=backtrack", "mdl.batch_order=fixed"):
        assert job_hash(job_config(tmp_path, [override])) != base, override
    at_default = job_config(tmp_path, ["optim.name=schedulefree", "mdl.stopping=patience", "mdl.batch_order=shuffled",
                                       "mdl.split=once"])
    assert job_hash(at_default) == base
    paper = job_hash(job_config(tmp_path, ["mdl=paper"]))  # mdl.split is read with the paper protocol only
    assert paper == job_hash(job_config(tmp_path, ["mdl=paper", "mdl.split=once"])) != job_hash(
        job_config(tmp_path, ["mdl=paper", "mdl.split=redraw"]))


def test_the_paper_code_preset_sets_the_public_codes_defaults(tmp_path: Path) -> None:
    """experiment=paper_code: EleutherAI/mdl (quad-mlp) as experiments/cli.py ran it: mdl/sweep.py (validation
    min(2048, 0.2 N), 10 chunks scored on the last), mdl/probe.py `fit` (early_stop_epochs 4, max_epochs 50,
    backtracking, batches in order, cosine over max_epochs: reduce_lr_on_plateau=False), mdl/mlp_probe.py
    `SeqMlpProbe` (2 hidden ReLU layers of 128, torch's init, torch.optim.AdamW's defaults), batches of 128; the
    split redrawn for every chunk (mdl/sweep.py)."""
    cfg = load_job(job_config(tmp_path, ["experiment=paper_code"]))
    o, m, a = cfg.optim, cfg.mdl, cfg.arch
    assert (o.name, o.schedule, o.lr, o.beta1, o.beta2, o.weight_decay, o.warmup_steps, o.batch_size) == (
        "adamw", "cosine", 1e-3, 0.9, 0.999, 0.01, 0, 128)
    assert (m.protocol, m.split, m.num_blocks, m.val_size, m.val_frac, m.patience, m.max_epochs, m.stopping,
            m.batch_order, m.full_run) == ("paper", "redraw", 10, 2048, 0.2, 4, 50, "backtrack", "fixed", False)
    assert (m.stop_after_warmup, m.min_steps, m.patience_min_steps) == (False, 0, 0)
    assert (a.name, a.width, a.depth, a.parametrization, a.options.activation) == ("mlp", 128, 2, "sp", "relu")
    assert (cfg.dataset.name, resolve_optim(o, a).lr, m.min_block) == ("mnist5k", 1e-3, "paper_code")


@pytest.mark.parametrize(("k", "d", "want"), [(10, 784, 1024), (10, 3072, 1024), (10, 64, 128), (2, 2, 64),
                                              (100, 3, 200)])
def test_the_public_codes_chunk_rule(tmp_path: Path, k: int, d: int, want: int) -> None:
    """mdl.min_block=paper_code: min(1024, 2·max(32, K, d)) (mdl/sweep.py), shrunk as any other where the data is too
    small (MNIST-5k: 4000 rows to code in 10 blocks start at 200); an integer is taken as given."""
    assert smallest_block("paper_code", k, d) == want and smallest_block(300, k, d) == 300
    assert partition_logspace(4000, 10, smallest_block("paper_code", 10, 784))[0] == 200
    with pytest.raises(ConfigError, match=r"^mdl.min_block='auto' is not allowed: mdl.min_block must be an integer ≥ 1 "
                                          r"or paper_code"):
        load_job(job_config(tmp_path, ["mdl.min_block=auto"]))


# ---- mdl.split=redraw ------------------------------------------------------------------------------------------
def _redrawn(seed: int) -> MdlSplit:
    split = make_split(1797, seed, val_size=2048, val_frac=0.2, num_blocks=6, min_block=128)
    return dataclasses.replace(split, redraw_seed=seed)


def test_redraw_gives_each_block_model_its_own_split_drawn_from_the_seed() -> None:
    """Block model i of a redrawn split: a permutation of all the rows of its own (validation rows, then the blocks
    cut as the job's), the same for the same seed and tag, another for another block or seed; the full-data model
    and a split drawn once keep the job's split."""
    once = make_split(1797, 3, val_size=2048, val_frac=0.2, num_blocks=6, min_block=128)
    redraw = _redrawn(3)
    assert once.of_model(("block", 2)) is once and redraw.of_model("full") is redraw
    models = [redraw.of_model(("block", i)) for i in range(1, 6)]
    for i, s in enumerate(models, 1):
        assert s.block_sizes == once.block_sizes and len(s.val_idx) == len(once.val_idx) == 359
        assert torch.equal(torch.cat([s.val_idx, s.order]).sort().values, torch.arange(1797))
        assert len(s.prefix(i)) == once.cumsizes[i - 1] and len(s.block(6)) == once.block_sizes[-1]
        again = _redrawn(3).of_model(("block", i))
        assert torch.equal(s.val_idx, again.val_idx) and torch.equal(s.order, again.order)
    vals = {tuple(sorted(s.val_idx.tolist())) for s in [once, *models]}
    assert len(vals) == 6  # every block model validates on rows of its own
    assert not torch.equal(_redrawn(4).of_model(("block", 1)).val_idx, models[0].val_idx)


REDRAW_JOB = ["dataset=digits", "mdl=paper_code", "optim=adamw", "arch.width=16", "mdl.max_epochs=2",
              "certificate=false"]


def test_a_redraw_job_trains_validates_and_codes_each_block_model_on_its_own_draw(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the job: block model i trains on the first i blocks of its own draw (cumsize_i rows), validates on
    its own validation rows (no shared validation set), is coded on its own last block, with the temperature fitted
    on its own validation rows (`mdl.calibrate_temperature`); the same seed gives the same numbers again."""
    fits: list[tuple[torch.Tensor, torch.Tensor | None, bool]] = []
    coded: list[torch.Tensor] = []
    temps: list[tuple[float, float]] = []
    real_code = Trainer.code_bits
    cfg = job_config(tmp_path / "a", [*REDRAW_JOB, "mdl.calibrate_temperature=true"])
    split = split_of(load_job(cfg).mdl, 0, 1797, 10, (1, 8, 8))

    def spy_fit(member: Member, data: TrainData, *args: Any, **kwargs: Any) -> FitResult:
        fits.append((member.idx.cpu(), member.val_idx, data.x_val is None))
        return fit(member, data, *args, **kwargs)

    def spy_code(self: Trainer, model: torch.nn.Module, idx: torch.Tensor, split: MdlSplit) -> tuple[float, float]:
        coded.append(idx.cpu())
        ce, t = real_code(self, model, idx, split)
        rows = split.of_model(("block", len(coded))).val_idx  # this model's own validation rows
        temps.append((t, fit_temperature(model, self.data.all(rows), self.y[rows])))
        return ce, t

    monkeypatch.setattr(trainer_mod, "fit", spy_fit)
    monkeypatch.setattr(Trainer, "code_bits", spy_code)
    result = result_of(run_job(cfg))
    assert split.redraw_seed == 0 and all(t == want != 1.0 for t, want in temps) and len(fits) == len(coded) == 9
    for i, ((idx, val, own_val), code) in enumerate(zip(fits, coded, strict=True), 1):
        mine = split.of_model(("block", i))
        assert own_val and val is not None and torch.equal(val, mine.val_idx)
        assert torch.equal(idx, mine.prefix(i)) and len(idx) == split.cumsizes[i - 1]
        assert torch.equal(code, mine.block(10))
    assert [b["train_size"] for b in result["mdl"]["blocks"]] == split.cumsizes[:-1]
    assert len({tuple(sorted(v.tolist())) for _, v, _ in fits if v is not None}) == 9
    again = result_of(run_job(job_config(tmp_path / "b", [*REDRAW_JOB, "mdl.calibrate_temperature=true"])))
    assert again["mdl"]["block_ce_bits"] == result["mdl"]["block_ce_bits"]


def test_a_redrawn_cell_in_one_lockstep_group_equals_each_seed_one_model_at_a_time(tmp_path: Path) -> None:
    """Schedule-free AdamW with the split redrawn: a 2-seed cell trains its 12 models in one lockstep group (loop
    engine), each on its own validation rows; every seed's numbers are bitwise those of its models one at a time."""
    from tests.test_cell import _alone, _cell, _seed_numbers

    extra = ("mdl.protocol=paper", "mdl.split=redraw", "training.engine=loop")
    one_at_a_time = _alone(tmp_path / "one", *extra, "training.parallel_models=1", seeds=2)
    outcomes = _cell(tmp_path / "cell", *extra, seeds=2)
    assert {o.result["provenance"]["numerics"]["models_together"] for o in outcomes if o.result} == {12}
    assert _seed_numbers(outcomes) == one_at_a_time
