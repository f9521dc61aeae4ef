"""Throughput benchmark: the physical limit, central large-batch training, the sequential and
the batched executor, for FedAvg and a K=3 multi-model loss, on random data.

- (p) *plain PyTorch*, the limit: the same model as an ``nn.Module`` trained with
  ``torch.optim.SGD`` at a large batch on float inputs already on the device, nothing of
  fedshift in the loop (K=3: three modules, three optimisers);
- (a) fedshift's own central path: one client holding the data, the same large batch, through
  the sequential executor (functional calls, uint8 images normalised per batch);
- (b), (c): many clients at the FL batch size on the sequential and the batched executor.

Figures are training samples per second, counting a sample once per model it passes through
(so a K=3 client step on 128 samples counts 384): the arithmetic done, comparable across K. The
ratios against (p) say how far from the limit each path is. Run through ``fedshift bench`` or
``python benchmarks/throughput.py``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from fedshift.algorithms.base import (
    Batch,
    ClientData,
    LocalTask,
    ModelOps,
    RoundContext,
    TrainDefaults,
)
from fedshift.algorithms.fedavg import FedAvg
from fedshift.core.errors import FedshiftError, did_you_mean
from fedshift.core.files import atomic_write_text
from fedshift.data.concepts import identity_map
from fedshift.data.federated import CLEAN, Client, FederatedData
from fedshift.engine.evaluation import client_data
from fedshift.engine.executors.base import RoundWork, SequentialExecutor
from fedshift.engine.executors.batched import BatchedExecutor
from fedshift.models import build_model
from fedshift.reporting.tables import bench_table
from fedshift.run.experiment import resolve_device

MODELS = {"fmnist_cnn": ((1, 28, 28), 1024), "resnet18": ((3, 32, 32), 512)}


class KModelLoss(FedAvg):
    """K models per client trained on a per-sample-weighted loss (FedRC's shape of work):
    loss = sum_k mean_b(w[b, k] * CE(model_k(x_b), y_b)); weights are a per-client extra."""

    name = "bench-kmodel"
    K = 3

    def num_initial_models(self) -> int:
        return self.K

    def init_server_state(self, init):
        return {"models": [{"params": p, "buffers": b} for p, b in init]}

    def client_task(self, server, client, data: ClientData, ctx=None) -> LocalTask:
        gen = torch.Generator().manual_seed(data.cid)
        w = torch.rand(data.num_train, self.K, generator=gen).to(data.train_idx.device)
        return LocalTask(
            params=[m["params"] for m in server["models"]],
            buffers=[m["buffers"] for m in server["models"]],
            extras={"weights": w / w.sum(1, keepdim=True)},
        )

    def local_loss(self, params, buffers, batch: Batch, extras):
        w = extras["weights"][batch.pos]
        total = 0.0
        for k in range(len(params)):
            ce = F.cross_entropy(
                self.ops.forward(params[k], buffers[k], batch.x), batch.y, reduction="none"
            )
            total = total + batch.mean(ce * w[:, k])
        return total


def random_data(
    num_clients: int, per_client: int, shape: tuple[int, ...], device, seed: int = 0
) -> FederatedData:
    """Random uint8 images and labels, ``per_client`` training samples per client."""
    gen = torch.Generator().manual_seed(seed)
    n = num_clients * per_client
    x = torch.randint(0, 256, (n, *shape), generator=gen, dtype=torch.uint8)
    y = torch.randint(0, 10, (n,), generator=gen)
    clients = []
    for i in range(num_clients):
        idx = torch.arange(i * per_client, (i + 1) * per_client)
        clients.append(
            Client(
                cid=i,
                concept=0,
                label_map=identity_map(10),
                style=CLEAN,
                train_idx=idx,
                test_idx=idx[:0],
                y_train=y[idx],
                y_test=y[idx][:0],
                label_hist=np.bincount(y[idx].numpy(), minlength=10),
            )
        )
    c = shape[0]
    return FederatedData(
        name="random",
        x=x,
        num_classes=10,
        input_shape=shape,
        mean=torch.full((1, c, 1, 1), 0.5),
        std=torch.full((1, c, 1, 1), 0.25),
        clients=clients,
        test_clients=[],
        concepts=[identity_map(10)],
        source="random",
    ).to(device)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _time(fn: Callable[[], Any], device: torch.device, repeats: int) -> float:
    fn()  # warm-up (kernels, allocator)
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    _sync(device)
    return (time.perf_counter() - t0) / repeats


def plain_pytorch_sps(
    model: str, k_models: int, device: torch.device, batch: int, steps: int, repeats: int
) -> float:
    """Samples/s (per model) of a plain PyTorch loop: ``k_models`` modules with their own
    ``torch.optim.SGD`` (momentum 0.9, weight decay 5e-4), ``steps`` steps at ``batch`` on
    random float inputs already on the device: the limit for this arithmetic."""
    shape, _ = MODELS[model]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(steps, batch, *shape, generator=gen).to(device)
    y = torch.randint(0, 10, (steps, batch), generator=gen).to(device)
    nets = [build_model(model, 10, shape).to(device).train() for _ in range(k_models)]
    opts = [torch.optim.SGD(n.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4) for n in nets]

    def epoch() -> None:
        for s in range(steps):
            for net, opt in zip(nets, opts, strict=True):
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(net(x[s]), y[s]).backward()
                opt.step()

    return steps * batch * k_models / _time(epoch, device, repeats)


@dataclass
class BenchRow:
    model: str
    loss: str
    device: str
    clients: int
    per_client: int
    batch_size: int
    plain_sps: float
    central_sps: float
    sequential_sps: float
    batched_sps: float
    seq_over_central: float
    batched_over_central: float
    batched_over_seq: float
    central_over_plain: float
    batched_over_plain: float
    peak_mem_mb: float | None


def bench_one(
    model: str,
    k_models: bool,
    device: torch.device,
    clients: int,
    per_client: int,
    batch_size: int,
    chunk_size: int,
    repeats: int,
) -> BenchRow:
    shape, big_batch = MODELS[model]
    if device.type == "cpu":
        big_batch = min(big_batch, 256)
    common = {"lr": 0.01, "momentum": 0.9, "weight_decay": 5e-4, "drop_last": True}
    cls = KModelLoss if k_models else FedAvg

    def make(data):
        ops = ModelOps(lambda: build_model(model, 10, shape), device)
        algo = cls(cls.Params(), ops, 10, seed=0, train=TrainDefaults())
        server = algo.init_server_state([ops.init(k) for k in range(algo.num_initial_models())])
        return algo, server

    # (a) the limit: one client holding the data, trained at a large batch
    central_data = random_data(1, big_batch * 4, shape, device)
    algo, server = make(central_data)
    view = client_data(central_data, central_data.clients[0])
    task = algo.client_task(server, {}, view, RoundContext(1))
    big = RoundWork.of(batch_size=big_batch, **common)
    seq = SequentialExecutor()
    t = _time(lambda: list(seq.train(algo, [(task, view)], big)), device, repeats)
    k_count = KModelLoss.K if k_models else 1
    central = big_batch * 4 * k_count / t
    plain = plain_pytorch_sps(model, k_count, device, big_batch, 4, repeats)

    # (b), (c): many clients at the FL batch size
    data = random_data(clients, per_client, shape, device)
    algo, server = make(data)
    jobs = [
        (algo.client_task(server, {}, v, RoundContext(1)), v)
        for v in (client_data(data, c) for c in data.clients)
    ]
    fl = RoundWork.of(batch_size=batch_size, **common)
    work = clients * (per_client // batch_size) * batch_size * k_count
    t_seq = _time(lambda: list(seq.train(algo, jobs, fl)), device, repeats)
    bat = BatchedExecutor(chunk_size=chunk_size)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    t_bat = _time(lambda: list(bat.train(algo, jobs, fl)), device, repeats)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None
    s, b = work / t_seq, work / t_bat
    return BenchRow(
        model,
        "K=3 weighted" if k_models else "FedAvg",
        str(device),
        clients,
        per_client,
        batch_size,
        round(plain),
        round(central),
        round(s),
        round(b),
        round(s / central, 3),
        round(b / central, 3),
        round(b / s, 2),
        round(central / plain, 3),
        round(b / plain, 3),
        None if peak is None else round(peak, 1),
    )


def run_throughput(
    device: str = "auto",
    models: list[str] | None = None,
    clients: int = 64,
    per_client: int = 512,
    batch_size: int = 128,
    chunk_size: int = 64,
    repeats: int = 2,
    out: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
) -> list[BenchRow]:
    """Run the benchmark grid (models x {FedAvg, K=3}); optionally write JSON to ``out``."""
    dev = torch.device(
        "cuda"
        if device == "auto" and torch.cuda.is_available()
        else ("cpu" if device == "auto" else device)
    )
    rows = []
    for model in models or list(MODELS):
        for k in (False, True):
            if progress:
                progress(f"{model} {'K=3' if k else 'FedAvg'} on {dev}")
            rows.append(
                bench_one(model, k, dev, clients, per_client, batch_size, chunk_size, repeats)
            )
    if out:
        atomic_write_text(Path(out), json.dumps([asdict(r) for r in rows], indent=2))
    return rows


def memory_scaling(
    device: str,
    client_counts: list[int],
    per_client: int = 200,
    chunk_size: int = 64,
    model: str = "fmnist_cnn",
) -> list[dict[str, Any]]:
    """Peak device memory of one batched FedAvg round for each number of clients."""
    dev = torch.device(device)
    shape, _ = MODELS[model]
    out = []
    for m in client_counts:
        data = random_data(m, per_client, shape, dev)
        ops = ModelOps(lambda: build_model(model, 10, shape), dev)
        algo = FedAvg(FedAvg.Params(), ops, 10, seed=0, train=TrainDefaults())
        server = algo.init_server_state([ops.init(0)])
        jobs = [
            (algo.client_task(server, {}, v, RoundContext(1)), v)
            for v in (client_data(data, c) for c in data.clients)
        ]
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        results = BatchedExecutor(chunk_size).train(
            algo,
            jobs,
            RoundWork.of(lr=0.01, momentum=0.9, weight_decay=5e-4, batch_size=128, drop_last=True),
        )
        algo.aggregate(server, results, 1)
        torch.cuda.synchronize()
        out.append(
            {
                "clients": m,
                "data_and_jobs_mb": round(base / 2**20, 1),
                "peak_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1),
                "peak_above_base_mb": round((torch.cuda.max_memory_allocated() - base) / 2**20, 1),
            }
        )
        del data, jobs, results
        torch.cuda.empty_cache()
    return out


def run_bench(
    device: str,
    models: str,
    clients: int,
    per_client: int,
    batch_size: int,
    chunk_size: int,
    repeats: int,
    out: str,
    memory: str | None,
    console,
) -> list:
    """``fedshift bench``: the throughput grid (and optionally memory scaling), as printable
    items (a rich table, then text lines); writes the JSON results."""
    import json

    resolve_device(device)  # a mistyped or missing device: one line before anything runs
    names = [m.strip() for m in models.split(",") if m.strip()]
    bad = [m for m in names if m not in MODELS]
    if bad:
        hint = did_you_mean(bad[0], MODELS)
        raise FedshiftError(f"--models: unknown {bad[0]!r}{hint}; allowed: {', '.join(MODELS)}")
    if per_client < batch_size:
        raise FedshiftError(
            f"--per-client {per_client} is below --batch-size {batch_size}: a client would take "
            "no step; give each client at least one batch"
        )
    rows = run_throughput(
        device,
        names,
        clients,
        per_client,
        batch_size,
        chunk_size,
        repeats,
        out,
        progress=lambda m: console.print(f"[dim]measuring {m}[/dim]"),
    )
    title = (
        f"training throughput (samples/s, a sample counted once per model), {rows[0].device}, "
        f"{clients} clients x {per_client} samples, batch {batch_size}"
    )
    items: list = [bench_table([asdict(r) for r in rows], title), f"results: {out}"]
    if memory:
        mem = memory_scaling(
            rows[0].device, [int(x) for x in memory.split(",")], chunk_size=chunk_size
        )
        items += [
            f"memory, {m['clients']} clients: peak {m['peak_mb']} MB (data+jobs "
            f"{m['data_and_jobs_mb']} MB, training above that {m['peak_above_base_mb']} MB)"
            for m in mem
        ]
        atomic_write_text(Path(out).with_name("memory.json"), json.dumps(mem, indent=2))
    return items
