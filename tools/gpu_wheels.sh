#!/usr/bin/env bash
# Fill .whl/ (git-ignored) with the wheels the GPU machine lacks, for `make gpu-report` there (carry [".whl"]).
# The machine has Python 3.12, torch, torchvision, numpy, scipy, pandas, matplotlib, scikit-learn, tqdm, pyyaml,
# packaging, and timm 1.0.29: below pyproject.toml's floor (its SwinV2 fails at 32×32), so the floor's timm travels
# and, installed ahead on sys.path, shadows it. It lacks hydra/omegaconf/mup/schedulefree/submitit/mlxtend/filelock,
# pytest (+ xdist, at the dev extra's pin) for the test-suite step, and concept-erasure (the CPU reference of the
# eraser benchmark). Same list as ../shared/gpu/prepare-wheels.sh plus the test runner and timm; works in a git worktree (no .git/info/exclude edit:
# .gitignore lists /.whl/). GPU_WHEELS_NUMBA=1 adds numba + llvmlite (~45 MB; the CPU fused-optimizer tests
# need them; without them those tests fail with "No module named 'numba'", which gpu_report reports apart).
set -euo pipefail
cd "$(git rev-parse --show-toplevel 2>/dev/null || dirname "$0"/..)"
mkdir -p .whl
# the versions pyproject.toml asks for: timm's floor (the GPU image's is older), the dev extra's pytest pin
timm=$(grep -o '"timm>=[^"]*"' pyproject.toml | tr -d '"' | sed 's/>=/==/')
pytest=$(grep -o '"pytest>=[^"]*"' pyproject.toml | tr -d '"')
plat=(--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform any)
pure=("hydra-core>=1.3.2,<1.4" "omegaconf>=2.3,<2.4" schedulefree submitit hydra-submitit-launcher
      hydra-joblib-launcher filelock mlxtend "concept-erasure==0.2.4"
      "$timm" "$pytest" pluggy iniconfig pygments "pytest-xdist>=3" execnet cloudpickle)
if [ "${GPU_WHEELS_NUMBA:-0}" = 1 ]; then pure+=(numba llvmlite); fi
python3 -m pip download -q --no-deps --only-binary=:all: "${plat[@]}" -d .whl "${pure[@]}"
# sdist-only packages: build their (pure-Python) wheels here
have() { ls .whl/"$1"-*.whl >/dev/null 2>&1; }
have mup || python3 -m pip wheel -q --no-deps -w .whl mup==1.0.0
have antlr4_python3_runtime || python3 -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
ls -1 .whl
du -sh .whl
