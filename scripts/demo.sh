#!/usr/bin/env bash
# The demo: set up, then compare FedAvg, FedProx and Local on a shifted Fashion-MNIST scenario.
# Prints a results table; writes runs/quickstart/comparison.{md,png}.
# Fashion-MNIST is found through FEDSHIFT_DATA (or --data-dir), system locations
# (/usr/share/datasets/fashion-mnist from Debian's dataset-fashion-mnist), or a download.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/fedshift compare configs/quickstart.yaml --algorithms fedavg,fedprox,local "$@"
