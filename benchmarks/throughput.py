"""Throughput: central large-batch training vs the sequential and batched executors.

    python benchmarks/throughput.py [--device cuda] [--clients 64] [--out bench.json]

Same as ``fedshift bench``; see :mod:`fedshift.tools.bench` for what is measured.
"""

from fedshift.cli import app

if __name__ == "__main__":
    app(["bench", *__import__("sys").argv[1:]])
