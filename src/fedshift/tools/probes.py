"""What a trained network's features carry, read by probes trained after the fact on frozen
features (the network is never changed):

- :func:`linear_probe` — the held-out accuracy of a linear classifier from features to a
  label (e.g. a DFL branch to the colour domain or the digit);
- :func:`fresh_critic_mi` — the Deep InfoMax JSD estimate of a *fresh* critic trained well
  (Adam) on two sets of paired features, an independent check of a method's own critics;
- :func:`branch_features` — the features of each branch of a finished run's clients on their
  test splits, with the client id and label of every sample (or of the run's untrained
  initial network, the control a probe needs: a random conv net already carries the colour);
- :func:`train_and_test_accuracy` — the final models' accuracy on the clients' train and test
  splits (the generalisation gap);
- :func:`colour_swap` — on background-coloured images, how much each branch's features and the
  run's predictions change when a client's images are repainted in another client's colour.

``benchmarks/dfl_probes.py`` prints them for DFL and FedAvg runs.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn.functional as F

from fedshift.algorithms.capabilities import FineTunes
from fedshift.algorithms.mi import jsd_mutual_information
from fedshift.config import load_config
from fedshift.core.errors import FedshiftError
from fedshift.data.attributes import client_color
from fedshift.data.scenario import build_scenario
from fedshift.engine.evaluation import client_data, evaluate
from fedshift.engine.simulator import SimState
from fedshift.models.two_branch import SeparableCritic
from fedshift.run.experiment import make_algorithm
from fedshift.run.folder import RunDir

LOG4 = math.log(4.0)


def _halves(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return perm[: n // 2], perm[n // 2 :]


def linear_probe(
    features: torch.Tensor, labels: torch.Tensor, steps: int = 300, seed: int = 0
) -> float:
    """Held-out accuracy (%) of a linear softmax classifier on standardised ``features``:
    trained (Adam, lr 0.01, weight decay 1e-4, full batch) on a random half of the samples,
    scored on the other half."""
    x = features.detach().float()
    x = (x - x.mean(0)) / x.std(0).clamp_min(1e-6)
    y = labels.long()
    tr, te = _halves(len(x), seed)
    torch.manual_seed(seed)
    lin = torch.nn.Linear(x.shape[1], int(y.max()) + 1)
    opt = torch.optim.Adam(lin.parameters(), lr=0.01, weight_decay=1e-4)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(lin(x[tr]), y[tr]).backward()
        opt.step()
    with torch.no_grad():
        return float((lin(x[te]).argmax(1) == y[te]).float().mean() * 100)


def fresh_critic_mi(
    a: torch.Tensor, b: torch.Tensor, steps: int = 400, batch: int = 256, seed: int = 0
) -> float:
    """Î(A; B) + log 4 (0: independent, up to log 4) of a fresh separable critic on
    unit-normalised features, trained with Adam (lr 1e-3) on mini-batches of one half of the
    pairs and read on the other half."""

    a, b = F.normalize(a.detach().float(), dim=1), F.normalize(b.detach().float(), dim=1)
    tr, te = _halves(len(a), seed)
    torch.manual_seed(seed)
    critic = SeparableCritic(a.shape[1], b.shape[1], hidden=512, out=128)
    opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        i = tr[torch.randint(len(tr), (min(batch, len(tr)),), generator=g)]
        opt.zero_grad()
        (-jsd_mutual_information(critic(a[i], b[i]))).backward()
        opt.step()
    with torch.no_grad():
        chunks = te.split(batch)
        vals = [float(jsd_mutual_information(critic(a[i], b[i]))) for i in chunks if len(i) > 1]
    return sum(vals) / len(vals) + LOG4


def _load(run_dir: str | Path, initial: bool = False):
    """A finished run's scenario, algorithm and state (``initial``: the state before round 1,
    the run's own initial network, for a probe's untrained control)."""

    rd = RunDir(run_dir)
    cfg = load_config(rd.path / "config.yaml")
    data = build_scenario(cfg.scenario, cfg.seed, cfg.data_dir)
    data.meta["config"] = cfg
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    if initial:
        server = algo.init_server_state([algo.ops.init(algo.seed)])
        return data, algo, SimState(round=0, server=server, clients={})
    state, _ = rd.load_checkpoint(torch.device("cpu"))
    return data, algo, state


@torch.no_grad()
def branch_features(
    run_dir: str | Path, per_client: int = 300, initial: bool = False
) -> dict[str, torch.Tensor]:
    """Features of a finished run on the first ``per_client`` test samples of every client.

    DFL (a two-branch model): ``inv`` and ``spec``, each client's own branches in eval mode.
    Any other method: ``body``, the global model's extractor. Also ``client`` and ``y``.
    ``initial``: the run's network before any training (the same for every client)."""
    data, algo, state = _load(run_dir, initial)
    algo.ops.module.eval()
    out: dict[str, list[torch.Tensor]] = {}
    two_branch = hasattr(algo.ops.module, "spec")
    for c in data.clients:
        idx = c.test_idx[:per_client]
        x = data.inputs(idx)
        if two_branch:
            cs = state.clients.get(c.cid) or {}
            p = cs.get("params", state.server["params"])
            b = cs.get("buffers", state.server["buffers"])
            feats = {name: algo.ops.call(name, p, b, x) for name in ("inv", "spec")}
        else:
            p, b = algo.global_model(state.server)
            feats = {"body": algo.ops.call("body", p, b, x)}
        feats["client"] = torch.full((len(idx),), c.cid)
        feats["y"] = c.y_test[:per_client]
        for k, v in feats.items():
            out.setdefault(k, []).append(v.flatten(1) if v.ndim > 1 else v)
    return {k: torch.cat(v) for k, v in out.items()}


def train_and_test_accuracy(run_dir: str | Path) -> dict[str, float]:
    """A finished run's final models scored as the run scores them, on every client's train
    split (``train_acc``) and test split (``local_acc``), pooled over clients (%): their
    difference is the generalisation gap of the models the run reports."""

    data, algo, state = _load(run_dir)
    m = evaluate(algo, state.server, state.clients, data, train_metrics=True, eval_batch=512)
    return {"train_acc": float(m["train_acc"]), "local_acc": float(m["local_acc"])}


def recolour(x: torch.Tensor, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Background-coloured images (uint8 ``[N, 3, H, W]``: a white digit on ``source``, RGB in
    [0, 1]) repainted on ``target``: the grey intensity ``m`` of ``x = m + (1 - m) * c`` is
    recovered per pixel (mean over channels) and painted again."""
    xf = x.float() / 255.0
    c = source.view(1, 3, 1, 1)
    m = ((xf - c) / (1.0 - c).clamp_min(1e-3)).mean(dim=1, keepdim=True).clamp(0, 1)
    out = m + (1.0 - m) * target.view(1, 3, 1, 1)
    return (out * 255.0).round().clamp(0, 255).to(torch.uint8)


@torch.no_grad()
def colour_swap(
    run_dir: str | Path, per_client: int = 300, initial: bool = False
) -> dict[str, float]:
    """How much a finished Colored-MNIST run depends on the background colour: every client's
    first ``per_client`` test images repainted with the colour of the client half-way round the
    hue circle, then, per branch (DFL: ``inv``, ``spec``; else ``body``), the mean relative
    change of the features ``||f(x') - f(x)|| / ||f(x)||`` (an invariant branch barely moves),
    and the accuracy of the run's own prediction on the original and on the repainted images
    (``acc``, ``acc_swapped``; not for methods that fine-tune before predicting)."""

    data, algo, state = _load(run_dir, initial)
    att = data.meta["config"].scenario.attributes
    if att is None or att.kind != "color" or att.mode != "background":
        raise FedshiftError(f"{run_dir}: colour_swap needs a background-colour scenario")
    algo.ops.module.eval()
    n = len(data.clients)
    colours = [torch.from_numpy(client_color(k, n, att.saturation, att.value)) for k in range(n)]
    two_branch = hasattr(algo.ops.module, "spec")
    change: dict[str, list[float]] = {}
    hits, hits_swapped, total = 0, 0, 0
    for c in data.clients:
        idx = c.test_idx[:per_client]
        x = data.x[idx]
        x_sw = recolour(x, colours[c.cid], colours[(c.cid + n // 2) % n])
        inputs = [(t.float().div(255.0) - data.mean) / data.std for t in (x, x_sw)]
        if two_branch:
            cs = state.clients.get(c.cid) or {}
            p = cs.get("params", state.server["params"])
            b = cs.get("buffers", state.server["buffers"])
            branches = {name: (name, p, b) for name in ("inv", "spec")}
        else:
            p, b = algo.global_model(state.server)
            branches = {"body": ("body", p, b)}
        for key, (name, pp, bb) in branches.items():
            f0, f1 = (algo.ops.call(name, pp, bb, t).flatten(1) for t in inputs)
            rel = (f1 - f0).norm(dim=1) / f0.norm(dim=1).clamp_min(1e-8)
            change.setdefault(key, []).append(float(rel.mean()))
        if isinstance(algo, FineTunes) or initial:
            continue
        view = client_data(data, c)
        mix = algo.mixture(state.server, state.clients.get(c.cid) or {}, view)
        y = c.y_test[:per_client]
        for t, counter in ((inputs[0], "orig"), (inputs[1], "swap")):
            probs = sum(w * torch.softmax(algo.ops.forward(pp, bb, t), -1) for w, pp, bb in mix)
            right = int((probs.argmax(-1) == y).sum())
            if counter == "orig":
                hits += right
            else:
                hits_swapped += right
        total += len(y)
    out = {f"change_{k}": 100.0 * sum(v) / len(v) for k, v in change.items()}
    if total:
        out["acc"], out["acc_swapped"] = 100.0 * hits / total, 100.0 * hits_swapped / total
    return out
