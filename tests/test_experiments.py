"""Experiment presets: each composes without data, every swept value exists, every job gets its own directory,
and training/common/sweeps.py expands a preset exactly as Hydra's basic sweeper does."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from training.app.schema import duplicate_jobs
from training.app.tasks import load_job, spec_of
from training.common.cells import seed_list
from training.common.sweep_jobs import expand_overrides, fast_expand
from training.common.sweeps import CONF_DIR, expand, presets, sweep_overrides, sweeper_params
from training.errors import UserError
from training.tasks.mdl.claims import CLAIMS, MIN_SEEDS

PAPER = ["paper_table_c", "paper_fig4_width", "paper_fig4_depth", "paper_fig5_width", "paper_fig5_depth",
         "paper_fig6_7_width", "paper_fig6_7_depth", "paper_fig8_width", "paper_fig8_depth", "paper_fig16"]
OFFLINE = ["offline_table", "offline_claims", "sensitivity", "smoke"]
ALL_ERASERS = {"control", "leace", "qleace", "alf_qleace", "gradient", "random"}


def _values(spec: str) -> list[str]:
    ov = OverridesParser.create().parse_overrides([f"k={spec}"])[0]
    return list(ov.sweep_string_iterator()) if ov.is_sweep_override() else [ov.get_value_element_as_str()]


def _is_group(key: str) -> bool:
    return (CONF_DIR / key.lstrip("+")).is_dir()


def test_every_preset_of_the_issue_exists() -> None:
    assert set(PAPER + OFFLINE + ["demo"]) <= set(presets())


@pytest.mark.parametrize("name", sorted(set(PAPER + OFFLINE)))
def test_preset_composes_every_swept_value_exists_and_dirs_differ(name: str, tmp_path: Path) -> None:
    params = sweeper_params(name)
    assert params, f"{name} has no hydra.sweeper.params"
    axes = {k: _values(v) for k, v in params.items()}
    base = {k: v[0] for k, v in axes.items()}
    fixed = [f"experiment={name}", f"paths.out_dir={tmp_path}", f"paths.data_dir={tmp_path / 'no-data'}"]
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for key, values in axes.items():
            # Group choices: each must exist. Plain values: the key must exist (first and last value compose).
            tried = values if _is_group(key) else list(dict.fromkeys([values[0], values[-1]]))
            dirs = set()
            for value in tried:
                combo = {**base, key: value}
                cfg = compose("config", overrides=[*fixed, *(f"{k}={v}" for k, v in combo.items())])
                job = OmegaConf.to_container(cfg, resolve=True)
                assert isinstance(job, dict) and job["experiment_name"] == name
                dirs.add(job["paths"]["job_dir"])
            assert len(dirs) == len(tried), f"{name}: values of {key} share a job directory"


def test_paper_grids_match_the_paper() -> None:
    c = sweeper_params("paper_table_c")
    assert _values(c["+experiment/net"]) == ["mlp_relu", "lenet", "convnext", "swin"]
    assert _values(sweeper_params("paper_fig16")["+experiment/net"]) == ["mlp_relu", "lenet", "convnext", "swin"]
    assert set(_values(c["eraser"])) == {"control", "leace", "alf_qleace_paper", "gradient_paper", "qleace_paper"}
    assert seed_list(OmegaConf.load(Path(CONF_DIR) / "experiment" / "paper_table_c.yaml").seeds) == [0, 1, 2, 3, 4]
    for fig in ("paper_fig4", "paper_fig5"):
        w, d = sweeper_params(f"{fig}_width"), sweeper_params(f"{fig}_depth")
        assert _values(w["arch.width"]) == ["64", "128", "256", "512", "1024", "2048"] and w["arch.depth"] == "2"
        # depth as the paper's code counts it (Linear layers incl. the readout); its depth 1 is a linear probe
        assert _values(d["arch.depth"]) == [str(i) for i in range(2, 9)] and d["arch.width"] == "128"
        assert _values(w["+experiment/net"]) == ["mlp_relu", "mlp_gelu", "mlp_swiglu", "lenet"]
    for grid in ("width", "depth"):  # the MLP/LeNet choices (+experiment/net) count Linear layers themselves
        assert sweeper_params(f"paper_fig8_{grid}")["arch.depth_counts"] == "linear"
    assert set(_values(sweeper_params("paper_fig4_width")["eraser"])) == {"control", "leace"}
    fig5 = set(_values(sweeper_params("paper_fig5_width")["eraser"]))
    assert {"qleace_paper", "alf_qleace_paper", "gradient_paper"} <= fig5
    for grid in ("width", "depth"):  # SVHN augmented, as the text states for every dataset
        assert _values(sweeper_params(f"paper_fig8_{grid}")["dataset"]) == ["cifarnet", "svhn_paper"]
    offline = sweeper_params("offline_table")
    assert set(_values(offline["eraser"])) == ALL_ERASERS and _values(offline["arch"]) == ["mlp", "lenet"]
    assert seed_list(OmegaConf.load(Path(CONF_DIR) / "experiment" / "offline_table.yaml").seeds) == [0, 1, 2]


def test_zscore_preset_has_its_own_directories_and_table_c_its_base_sizes(tmp_path: Path) -> None:
    job = expand("paper_fig16", [f"paths.out_dir={tmp_path}", "seed=0", "+experiment/net=mlp_relu",
                                 "eraser=control"])[0]
    assert job["dataset"]["zscore"] is True and job["dataset"]["zscore_order"] == "before"  # the text's order
    assert job["paths"]["job_subdir"] == f"cifar10_zscore/control/mlp_relu-w128-d2/{job['paths']['cell']}/seed0"
    jobs = expand("paper_table_c", [f"paths.out_dir={tmp_path}", "seed=0", "eraser=control"])
    got = {(j["arch"]["name"], j["arch"]["width"], j["arch"]["depth"], j["arch"].get("size")) for j in jobs}
    assert got == {("mlp", 128, 2, None), ("lenet", 128, 2, None), ("convnext", 40, 2, None),
                   ("swin", 40, 2, None)}  # ConvNeXtV2/SwinV2 atto = width 40, D = 2
    # one base size: MLP and LeNet at depth 2 in Linear layers (1 hidden layer), as the width presets'
    width = expand("paper_fig4_width", [f"paths.out_dir={tmp_path}", "seed=0", "eraser=control", "arch.width=128"])
    for j in (*jobs, *width):
        if j["arch"]["name"] in ("mlp", "lenet"):
            assert (j["arch"]["depth"], j["arch"]["depth_counts"]) == (2, "linear"), j["arch"]
    assert all(j["dataset"]["name"] == "cifar10" and j["mdl"]["num_blocks"] == 10 for j in jobs)


def test_expansion_follows_hydra_order_and_command_line_overrides(tmp_path: Path) -> None:
    combos = sweep_overrides("smoke")  # a job per cell; its seeds (the preset's `seeds: 2`) train in it
    assert combos == [[f"eraser={e}", "experiment=smoke"] for e in ("control", "leace")]
    cells = expand("smoke", [f"paths.out_dir={tmp_path}"])
    assert [(j["eraser"]["name"], j["seed"]) for j in cells] == [("control", 0), ("control", 1), ("leace", 0),
                                                                  ("leace", 1)]
    # A command-line sweep of the seed makes one-seed cells (as `python -m training.run -m experiment=smoke seed=5,6`).
    jobs = expand("smoke", ["seed=5,6", f"paths.out_dir={tmp_path}"])
    assert [(j["eraser"]["name"], j["seed"]) for j in jobs] == [("control", 5), ("control", 6), ("leace", 5),
                                                                 ("leace", 6)]
    assert len(sweep_overrides("smoke", ["seed=5,6"])) == 4
    assert all(j["paths"]["out_dir"] == str(tmp_path) for j in jobs)


def test_the_default_launcher_is_local() -> None:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for name in ("smoke", "paper_table_c"):
            cfg = compose("config", overrides=[f"experiment={name}"], return_hydra_config=True)
            assert cfg.hydra.launcher._target_.endswith("BasicLauncher")
            assert cfg.hydra.callbacks.job_status._target_ == "training.cli.ledger.JobStatusCallback"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(set(PAPER + OFFLINE)))
def test_full_expansion_gives_distinct_job_dirs(name: str, tmp_path: Path) -> None:
    jobs = expand(name, [f"paths.out_dir={tmp_path}"])
    dirs = [j["paths"]["job_dir"] for j in jobs]
    assert len(set(dirs)) == len(dirs)


def test_presets_that_make_claims_run_enough_seeds_for_a_claim_to_hold() -> None:
    """A claim holds only on ≥ claims.MIN_SEEDS seeds: a preset with `claims` that runs fewer could never say so."""
    with_claims = []
    for name in presets():
        cfg = OmegaConf.load(CONF_DIR / "experiment" / f"{name}.yaml")
        assert isinstance(cfg, DictConfig)
        if cfg.get("claims"):
            with_claims.append(name)
            assert set(cfg.claims) <= set(CLAIMS), name
            assert len(seed_list(cfg.seeds)) >= MIN_SEEDS, f"{name} runs fewer than {MIN_SEEDS} seeds"
            if "leace_raises_mdl" in cfg.claims and not name.startswith("paper_"):  # its control runs beside it
                assert "leace_shuffled" in _values(sweeper_params(name)["eraser"]), name
    assert {"offline_claims", "sensitivity"} <= set(with_claims)


def test_sensitivity_preset_covers_parametrization_rank_handling_and_zscore_order(tmp_path: Path) -> None:
    jobs = fast_expand("sensitivity", [f"paths.out_dir={tmp_path}"])  # == Hydra's: tests/test_plan.py
    seen = {(j["arch"]["parametrization"], j["dataset"]["zscore_order"], j["dataset"]["zscore"],
             j["eraser"]["options"].get("rank_deficient")) for j in jobs if j["eraser"]["name"] == "qleace"}
    assert seen == {(p, z, True, r) for p in ("mup", "sp") for z in ("before", "after")
                    for r in ("coupling", "shrinkage")}
    assert len(jobs) == 120 and len({j["paths"]["job_dir"] for j in jobs}) == 120
    shuffled = [j for j in jobs if j["eraser"]["fit_labels"] == "shuffled"]
    assert len(shuffled) == 20 and {j["eraser"]["name"] for j in shuffled} == {"leace"}


@pytest.mark.parametrize("name", presets())
def test_no_job_of_any_preset_is_refused(name: str) -> None:
    """Every job a preset expands to passes the config check, and no preset's sweep is refused (a refusal added for one
    case must not refuse a paper preset: `eraser.after_augment=true` without augmentation is what paper_fig8 runs on
    SVHN). The first seed's jobs only: a seed refuses nothing the first seed's jobs would not, and two jobs the sweep
    refuses as one measurement have the same seed."""
    combos = sweep_overrides(name, [])
    first = [line for line in combos[0] if line.startswith("seed=")]
    jobs = expand_overrides([c for c in combos if not first or first[0] in c])
    assert jobs
    refused = []
    if (same := duplicate_jobs([(i, cfg, spec_of(cfg)) for i, cfg in enumerate(jobs)])) is not None:
        refused.append(f"{name} (the sweep): {same}")  # the sweep's own refusal (training/cli)
    for cfg in jobs:
        try:
            load_job(cfg)
        except UserError as err:
            refused.append(f"{name}: {str(err).splitlines()[0]}")
    assert not refused, f"{len(refused)} refused, e.g. {refused[:3]}"
