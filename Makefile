# erasure-mdl: `make demo` and `make test` are the whole set-up (they create .venv on first use).
VENV   ?= .venv
PY     := $(VENV)/bin/python
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (many tests wait on a job they started as a subprocess: a third worker keeps
# both cores busy) and for `make test-slurm` (two groups, each on its own worker with its own cluster)
TEST_WORKERS ?= 3
EXP    ?= offline_table
BENCH_ARGS ?=
# tools/gpu_report.py options, e.g. GPU_REPORT_ARGS="--steps jobs,speed --budget 560 --out $$OUT"
GPU_REPORT_ARGS ?=
# the GPU machine has no .venv (and no registry): there the report runs on python3 with the wheels in .whl/
REPORT_PY = $(if $(wildcard $(PY)),$(PY),python3)
TEST_ENV := OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 WANDB_MODE=disabled
# ARGS reaches /bin/sh as written: an override with parentheses (range, glob, choice) must be quoted inside it,
# ARGS="'seed=range(0,3)'"; unquoted, make refuses it in one line instead of the shell's "Syntax error".
LP := (
CHECK_ARGS = $(if $(findstring $(LP),$(ARGS)),$(if $(findstring ',$(ARGS))$(findstring ",$(ARGS)),,$(error ARGS=$(ARGS) \
  has parentheses that /bin/sh cannot read unquoted: write ARGS="'$(ARGS)'" (each such override in single quotes))))

.PHONY: help setup test test-heavy test-slurm test-all demo calibrate lint docs clean reproduce plan tables bench gpu-report gpu-wheels slurm-up slurm-down

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F ':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --upgrade pip
	$(VENV)/bin/pip install -e '.[dev,launchers]'
	touch $@

setup: $(VENV)/.installed  ## create .venv and install the package with dev + launcher extras

test: setup  ## the test suite without the heavy and SLURM tests (`make test-heavy`, `make test-slurm`; CI runs all three)
	$(TEST_ENV) $(PY) -m pytest -m "not slow and not gpu and not slurm and not heavy" -n $(TEST_WORKERS) \
	  --dist loadgroup --durations=15 $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; rc=0; fi; \
	  exit $$rc

test-heavy: setup  ## the tests measured at 8 s or more (tests/heavy_tests.txt): end-to-end sweeps, kills, packs, benches
	$(TEST_ENV) $(PY) -m pytest -m "heavy and not slow and not gpu and not slurm" -n $(TEST_WORKERS) --dist loadgroup \
	  --durations=15 $(PYTEST_ARGS); rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; rc=0; fi; exit $$rc

test-slurm: setup  ## the SLURM launcher against one-machine clusters the tests start (root + Debian packages, else skipped saying why)
	$(TEST_ENV) $(PY) -m pytest -m "slurm and not slow" -n 2 --dist loadgroup --durations=15 $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "no tests collected"; rc=0; fi; exit $$rc

test-all: setup  ## run every test including slow ones (gpu/slurm skip themselves when unavailable)
	$(TEST_ENV) $(PY) -m pytest $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

demo: setup  ## every eraser on MNIST-5k, MLP, a cell of 3 seeds each + a permuted-label null, quick MDL; prints the table (offline)
	OMP_NUM_THREADS=1 WANDB_MODE=$${WANDB_MODE:-offline} $(PY) -m training.run -m experiment=demo logger=none \
	  hydra/launcher=parallel hydra.launcher.n_jobs=2
	OMP_NUM_THREADS=1 WANDB_MODE=$${WANDB_MODE:-offline} $(PY) -m training.run -m experiment=demo logger=none \
	  hydra/launcher=parallel hydra.launcher.n_jobs=2 dataset.permute_labels=true seed=0
	$(PY) -m scripts.aggregate outputs/runs/mnist5k --name demo

CAL_OUT ?= outputs/calibrate
# where the sweep wrote: paths.out_dir in ARGS wins over CAL_OUT (the last override on the command line)
CAL_READ = $(or $(lastword $(patsubst paths.out_dir=%,%,$(filter paths.out_dir=%,$(ARGS)))),$(CAL_OUT))
CAL_RUN = OMP_NUM_THREADS=1 WANDB_MODE=disabled $(PY) -m training.run -m experiment=calibrate hydra/launcher=parallel \
	  hydra.launcher.n_jobs=2 paths.out_dir=$(CAL_OUT)
calibrate: setup  ## known answers: MDL of erased generator data beside the population eraser on the same rows (own sweep in CAL_OUT; ARGS="k=v ...")
	$(CAL_RUN) $(ARGS)
	$(CAL_RUN) eraser=control eraser.fit_on=self $(ARGS)
	$(CAL_RUN) dataset.cov_gap=1 dataset.mean_gap=0 $(ARGS)
	$(CAL_RUN) dataset.cov_gap=1 dataset.mean_gap=0 eraser=control eraser.fit_on=self $(ARGS)
	$(CAL_RUN) eraser.fit_on=self,holdout eraser.fit_labels=shuffled $(ARGS)
	$(CAL_RUN) dataset.cov_gap=1 dataset.mean_gap=0 eraser.fit_on=self,holdout \
	  eraser.fit_labels=shuffled $(ARGS)
	$(CAL_RUN) dataset=mixture dataset.dim=4 dataset.num_classes=2 dataset.mean_gap=0 dataset.cov_gap=0 \
	  dataset.rows_per_dim=256 eraser=qleace $(ARGS)
	$(PY) -m scripts.calibrate $(CAL_READ)/runs

reproduce: setup  ## run a preset, then aggregate it (also after failed jobs): make reproduce EXP=<name> [ARGS="k=v ..."]
	$(CHECK_ARGS)$(PY) -m training.run -m experiment=$(EXP) $(ARGS); rc=$$?; \
	  $(PY) -m scripts.aggregate --experiment $(EXP) --name $(EXP) $(addprefix --override ,$(ARGS)) || rc=1; \
	  exit $$rc

plan: setup  ## a sweep's jobs, cells, done/remaining and CPU/GPU hours, without running it: make plan EXP=<name> [ARGS="k=v ..."] (quote k=range(..): ARGS="'k=range(0,3)'")
	$(CHECK_ARGS)$(PY) -m scripts.plan $(EXP) $(ARGS)

tables: setup  ## aggregate whatever is in outputs/runs into outputs/tables/
	$(PY) -m scripts.aggregate outputs/runs --name all

bench: setup  ## speed: MDL ours vs naive loop (ratios, peak memory), eraser cache cold vs warm, a 5-seed cell vs 5 processes, engine counts (syncs/ops per step, graph breaks, occupancy); BENCH_ARGS=--device cuda
	mkdir -p outputs/bench
	WANDB_MODE=disabled $(PY) -m tools.bench_mdl --fused --json outputs/bench/bench_mdl.json $(BENCH_ARGS)
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} WANDB_MODE=disabled $(PY) -m tools.bench_cache
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} WANDB_MODE=disabled $(PY) -m tools.bench_sweep --json outputs/bench/bench_sweep.json
	OMP_NUM_THREADS=1 WANDB_MODE=disabled $(PY) -m tools.bench_engine --json outputs/bench/bench_engine.json

gpu-report:  ## GPU checks (tests, one job per arch, erasers, speed, sweep cost) → outputs/gpu_report/*.json|md; CPU toy sizes without CUDA
	WANDB_MODE=disabled $(REPORT_PY) tools/gpu_report.py $(GPU_REPORT_ARGS)

gpu-wheels:  ## fill .whl/ with what the GPU machine lacks (hydra, mup, schedulefree, pytest, ...) for gpu-report there
	tools/gpu_wheels.sh

slurm-up:  ## start a one-machine SLURM cluster with accounting (root, Debian packages); prints SLURM_CONF
	python3 tools/slurm_cluster.py install
	python3 tools/slurm_cluster.py up $(if $(SLURM_DIR),--dir $(SLURM_DIR))

slurm-down:  ## stop that cluster (its jobs, then the daemons it started, by pid) and remove its directory
	python3 tools/slurm_cluster.py down $(if $(SLURM_DIR),--dir $(SLURM_DIR))

lint: setup  ## ruff, mypy ([tool.mypy] in pyproject.toml), then lint-imports (the import contracts: [tool.importlinter])
	$(VENV)/bin/ruff check atomicio erasure models training scripts tools tests hydra_plugins
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

docs: setup  ## build the documentation site (docs/ → build/site) with mkdocs --strict: a broken link fails
	$(VENV)/bin/mkdocs build --strict

clean:  ## remove caches (keeps .venv and outputs/)
	rm -rf .pytest_cache .ruff_cache .mypy_cache build *.egg-info
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
