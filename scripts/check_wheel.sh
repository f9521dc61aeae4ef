#!/usr/bin/env bash
# Builds fedshift's wheel, installs it (core dependencies only, at constraints.txt's versions)
# into a new virtual environment outside the source tree, and runs the installed `fedshift`
# from another folder: `fedshift --help` and one tiny run on synthetic data. This catches what
# the editable install of the test suite cannot: a module or data file missing from the wheel,
# a dependency used but not declared. Torch, torchvision and what they require (numpy, pillow,
# jinja2, ...) are linked from the test environment instead of installed again (4 GB with
# their CUDA libraries): a dependency of fedshift that only torch's closure provides would
# not be caught.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "wheel check: building the sdist, and the wheel from it (no stale build/ folder can leak in)"
if ! .venv/bin/python -m build --outdir "$tmp/dist" . >"$tmp/build.log" 2>&1; then
  cat "$tmp/build.log"
  exit 1
fi
wheel=$(ls "$tmp"/dist/fedshift-*.whl)
echo "wheel check: installing $(basename "$wheel") into a clean virtual environment"
"$PY" -m venv "$tmp/venv"
# torch, torchvision and their requirements come from the test environment (linked, not copied);
# pip installs every other dependency the wheel declares
site=$("$tmp/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
.venv/bin/python scripts/lend_torch.py "$tmp/lent" "$site"
if ! "$tmp/venv/bin/pip" install -c "$ROOT/constraints.txt" "$wheel" >"$tmp/pip.log" 2>&1; then
  cat "$tmp/pip.log"
  exit 1
fi
if grep -qiE "^(Collecting|Downloading) torch(vision)?[ =-]" "$tmp/pip.log"; then
  cat "$tmp/pip.log"
  echo "wheel check: pip installed torch again instead of using the lent one"
  exit 1
fi
cd "$tmp"  # not the source tree: the installed package must stand on its own
"$tmp/venv/bin/python" - <<'PY'
import fedshift, pathlib
where = pathlib.Path(fedshift.__file__).resolve()
assert "site-packages" in where.parts, f"fedshift imported from {where}, not the installed wheel"
print(f"wheel check: fedshift {fedshift.__version__} from {where.parent.name}/ in site-packages")
from fedshift.cli.console import find_config  # the paper configs ship inside the package
paper = find_config("configs/papers/fedrc/table1_fmnist.yaml").resolve()
assert "site-packages" in paper.parts, f"the paper config came from {paper}"
PY
"$tmp/venv/bin/fedshift" --help >"$tmp/help.txt"
grep -q "reproduce" "$tmp/help.txt" || { cat "$tmp/help.txt"; exit 1; }
cat >"$tmp/tiny.yaml" <<'YAML'
name: wheel-check
seed: 0
device: cpu
scenario:
  dataset: synthetic
  dataset_options: {n_train: 600, n_test: 200, dim: 16, num_classes: 4}
  num_clients: 4
  label_shift: {kind: dirichlet, alpha: 0.5}
  concepts: [identity]
model: {name: mlp, width: 16}
algorithm: {name: fedavg}
train: {rounds: 2, batch_size: 32, lr: 0.05}
eval: {every: 1}
output: {dir: runs, plots: false}
YAML
"$tmp/venv/bin/fedshift" run "$tmp/tiny.yaml" >"$tmp/run.log" 2>&1 || { cat "$tmp/run.log"; exit 1; }
test -s "$tmp/runs/wheel-check/summary.json" || { cat "$tmp/run.log"; exit 1; }
echo "wheel check: passed (fedshift --help and a 2-round run from the installed wheel)"
