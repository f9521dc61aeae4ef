"""What a trained network's features carry, read by probes trained after the fact on frozen
features (the network is never changed). The fresh critics of two branches' dependence live in
:mod:`fedshift.tools.critics`.

- :func:`within_client_probe` — a label probe (linear, or one hidden layer) fitted on one
  client's training features and scored on its test features, per client (DFL's E_s is a
  different network on every client: a probe pooled over clients reads which network made a
  feature as much as the feature); :func:`linear_probe` — the pooled version;
- :func:`load_run`, :func:`client_features` — a finished run (or its untrained initial
  network) and its clients' features on their train or test splits; :func:`shared_extractors`
  — its networks that are one network for every client (DFL's server E_c, a global body);
- :func:`colour_sensitivity`, :func:`cross_colour_transfer` — on ONE network applied to every
  colour of a Colored-MNIST scenario (:func:`scenario_images` renders the same grey images in
  each client's colour): how far its features move with the colour against the digit, and how
  much a digit probe fitted in one colour loses in the others;
- :func:`train_and_test_accuracy` — the final models' accuracy on the clients' train and test
  splits (the generalisation gap);
- :func:`colour_swap` — on background-coloured images, how much each branch's features and the
  run's predictions change when a client's images are repainted in another client's colour.

``benchmarks/dfl_probes.py`` prints them for DFL and FedAvg runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fedshift.algorithms.capabilities import FineTunes
from fedshift.config import load_config
from fedshift.core.errors import FedshiftError
from fedshift.data.attributes import client_color, color_pair, hue_colors
from fedshift.data.scenario import build_scenario
from fedshift.engine.evaluation import client_data, evaluate
from fedshift.engine.simulator import SimState
from fedshift.run.experiment import make_algorithm
from fedshift.run.folder import RunDir

#: a network as a function of model inputs to flat features
Extractor = Callable[[torch.Tensor], torch.Tensor]
#: grey intensities ``[N, 1, H, W]`` and a colour index to model inputs in that colour
Renderer = Callable[[torch.Tensor, int], torch.Tensor]


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


def fit_classifier(
    x: torch.Tensor, y: torch.Tensor, classes: int, hidden: int = 0, steps: int = 300, seed: int = 0
) -> torch.nn.Module:
    """A softmax classifier from ``x`` to ``y`` (``hidden`` 0: linear, i.e. multinomial logistic
    regression; else one hidden ReLU layer of that width) trained full batch with Adam (lr
    0.01, weight decay 1e-4) for ``steps`` steps."""
    torch.manual_seed(seed)
    d = x.shape[1]
    if hidden:
        net = torch.nn.Sequential(
            torch.nn.Linear(d, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, classes)
        )
    else:
        net = torch.nn.Linear(d, classes)
    opt = torch.optim.Adam(net.parameters(), lr=0.01, weight_decay=1e-4)
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
    return net.eval()


def _standardiser(x: torch.Tensor):
    """Standardisation by the statistics of ``x`` (per feature)."""
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    return lambda z: (z.detach().float() - mean) / std


@torch.no_grad()
def _accuracy(net: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((net(x).argmax(1) == y).float().mean() * 100)


@dataclass(frozen=True)
class ProbeReading:
    """A probe's test accuracy (%) per client (``values``), their ``mean`` and ``sd``, and
    ``chance``: the mean over clients of the test accuracy of always answering the client's
    most frequent training label."""

    mean: float
    sd: float
    chance: float
    values: tuple[float, ...]


def within_client_probe(
    train: dict[str, torch.Tensor],
    test: dict[str, torch.Tensor],
    key: str,
    hidden: int = 0,
    steps: int = 300,
    seed: int = 0,
) -> ProbeReading:
    """A label probe fitted per client: for every client, :func:`fit_classifier` from the
    features ``train[key]`` of its training samples (standardised by their statistics) to
    their labels ``train["y"]``, scored on its test samples (``test``; rows told apart by
    ``client``). The probe never mixes clients, so it reads what *that client's* features say
    about the label, not which client's network made them."""
    classes = int(max(train["y"].max(), test["y"].max())) + 1
    accs, chance = [], []
    for k in train["client"].unique().tolist():
        tr, te = train["client"] == k, test["client"] == k
        if not te.any():
            continue
        std = _standardiser(train[key][tr].float())
        y_tr, y_te = train["y"][tr].long(), test["y"][te].long()
        net = fit_classifier(std(train[key][tr]), y_tr, classes, hidden, steps, seed + int(k))
        accs.append(_accuracy(net, std(test[key][te]), y_te))
        chance.append(float((y_te == torch.bincount(y_tr).argmax()).float().mean() * 100))
    t = torch.tensor(accs, dtype=torch.float64)
    sd = float(t.std()) if len(accs) > 1 else 0.0
    return ProbeReading(float(t.mean()), sd, sum(chance) / len(chance), tuple(accs))


def load_run(run_dir: str | Path, initial: bool = False):
    """A finished run's scenario, algorithm (its network in eval mode) and state from its
    ``checkpoint.pt`` (``initial``: the state before round 1, the run's own initial network
    rebuilt from its config and seed, the untrained control of a probe)."""

    rd = RunDir(run_dir)
    cfg = load_config(rd.path / "config.yaml")
    data = build_scenario(cfg.scenario, cfg.seed, cfg.data_dir)
    data.meta["config"] = cfg
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    algo.ops.module.eval()
    if initial:
        server = algo.init_server_state([algo.ops.init(algo.seed)])
        return data, algo, SimState(round=0, server=server, clients={})
    state, _ = rd.load_checkpoint(torch.device("cpu"))
    return data, algo, state


def _client_model(algo, state, cid: int) -> tuple[dict, dict]:
    """A two-branch client's own latest parameters and buffers (the shared initial network
    before it first trains)."""
    cs = state.clients.get(cid) or {}
    return cs.get("params", state.server["params"]), cs.get("buffers", state.server["buffers"])


@torch.no_grad()
def client_features(
    data, algo, state, split: str = "test", per_client: int = 300, inv: str = "own"
) -> dict[str, torch.Tensor]:
    """Features of a loaded run (:func:`load_run`) on the first ``per_client`` samples of every
    client's ``split`` (``train`` or ``test``).

    DFL (a two-branch model): ``spec``, each client's own E_s, and ``inv``, E_c: the client's
    own (``inv="own"``, the one it is scored with) or the server's averaged one
    (``inv="server"``, the E_c a client receives; in a round's specific stage, the I_s term
    reads the E_c received at its start). Any other method: ``body``, the global model's
    extractor. Also ``client`` and ``y``."""
    if split not in ("train", "test") or inv not in ("own", "server"):
        raise FedshiftError(f"client_features: split {split!r} / inv {inv!r} not known")
    out: dict[str, list[torch.Tensor]] = {}
    two_branch = hasattr(algo.ops.module, "spec")
    for c in data.clients:
        idx = (c.train_idx if split == "train" else c.test_idx)[:per_client]
        x = data.inputs(idx)
        if two_branch:
            p, b = _client_model(algo, state, c.cid)
            ps, bs = (
                (state.server["params"], state.server["buffers"]) if inv == "server" else (p, b)
            )
            feats = {"inv": algo.ops.call("inv", ps, bs, x), "spec": algo.ops.call("spec", p, b, x)}
        else:
            p, b = algo.global_model(state.server)
            feats = {"body": algo.ops.call("body", p, b, x)}
        feats["client"] = torch.full((len(idx),), c.cid)
        feats["y"] = (c.y_train if split == "train" else c.y_test)[:per_client]
        for k, v in feats.items():
            out.setdefault(k, []).append(v.flatten(1) if v.ndim > 1 else v)
    return {k: torch.cat(v) for k, v in out.items()}


def shared_extractors(algo, state) -> dict[str, Extractor]:
    """The run's networks that are one network for every client, as model inputs -> features:
    DFL's server E_c (``inv``; before training also E_s, ``spec``, the shared initial one), any
    other method's global extractor (``body``); none for a method without a global model."""
    if hasattr(algo.ops.module, "spec"):
        p, b = state.server["params"], state.server["buffers"]
        names = ("inv", "spec") if state.round == 0 else ("inv",)
    else:
        model = algo.global_model(state.server)
        if model is None:
            return {}
        (p, b), names = model, ("body",)

    def extractor(name: str) -> Extractor:
        return lambda x: algo.ops.call(name, p, b, x).flatten(1)

    return {name: extractor(name) for name in names}


def train_and_test_accuracy(run_dir: str | Path) -> dict[str, float]:
    """A finished run's final models scored as the run scores them, on every client's train
    split (``train_acc``) and test split (``local_acc``), pooled over clients (%): their
    difference is the generalisation gap of the models the run reports."""

    data, algo, state = load_run(run_dir)
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

    data, algo, state = load_run(run_dir, initial)
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


# ----------------------------------------------------------------------------- attributes


def grey_levels(x: torch.Tensor, fg: torch.Tensor, bg: torch.Tensor) -> torch.Tensor:
    """The grey intensity ``m`` in [0, 1] (``[N, 1, H, W]``) of images painted
    ``x = m·fg + (1 − m)·bg`` (uint8 ``[N, 3, H, W]``, colours RGB in [0, 1], one pair or one
    per image as ``[N, 3]``): per pixel the
    least-squares ``m = Σ_c (x_c − bg_c)(fg_c − bg_c) / Σ_c (fg_c − bg_c)²`` (the channels
    where the two colours differ most count most)."""
    fg, bg = fg.reshape(-1, 3, 1, 1).float(), bg.reshape(-1, 3, 1, 1).float()
    diff = fg - bg
    norm = diff.pow(2).sum(1, keepdim=True).clamp_min(1e-6)
    m = ((x.float() / 255.0 - bg) * diff).sum(1, keepdim=True) / norm
    return m.clamp(0, 1)


def paint_grey(m: torch.Tensor, fg: torch.Tensor, bg: torch.Tensor) -> torch.Tensor:
    """Grey intensities ``m`` painted as Colored-MNIST paints them (``attributes.paint``):
    uint8 ``round(255·(m·fg + (1 − m)·bg))``."""
    out = m * fg.view(1, 3, 1, 1).float() + (1.0 - m) * bg.view(1, 3, 1, 1).float()
    return (out * 255.0).round().clamp(0, 255).to(torch.uint8)


def scenario_colours(data) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every client's (foreground, background) colour pair of a colour-attribute scenario."""
    att = data.meta["config"].scenario.attributes
    if att is None or att.kind != "color":
        raise FedshiftError("the attribute measures need a colour-attribute scenario")
    n = len(data.clients)
    pairs = [color_pair(att.mode, client_color(k, n, att.saturation, att.value)) for k in range(n)]
    return [(torch.from_numpy(f), torch.from_numpy(b)) for f, b in pairs]


def _painted_colours(data, idx: torch.Tensor, own: tuple[torch.Tensor, torch.Tensor]):
    """(fg, bg) each ``[len(idx), 3]`` the images ``idx`` were painted in: their recorded hues
    (``meta["attributes"]["hue"]``), or the client's one colour ``own`` when none differs."""
    att = data.meta["config"].scenario.attributes
    if att.colors_per_client == 1 and att.hue_jitter == 0:
        return own
    hues = data.meta["attributes"]["hue"][idx.cpu().numpy()]
    rgb = hue_colors(hues, att.saturation, att.value).reshape(-1, 3)
    fg, bg = (np.broadcast_to(c, rgb.shape) for c in color_pair(att.mode, rgb))
    return torch.tensor(fg), torch.tensor(bg)


def scenario_images(data, split: str = "test", per_client: int = 20):
    """(grey intensities ``[N, 1, H, W]``, labels, renderer) of a colour scenario: the first
    ``per_client`` images of every client's ``split`` with their own colour taken off (each
    image's hue as painted, so also with several colours a client or hue jitter), and a
    :data:`Renderer` painting them in client k's colour (hue k/n) as the run's model inputs."""
    colours = scenario_colours(data)
    grey, ys = [], []
    for c in data.clients:
        idx = (c.train_idx if split == "train" else c.test_idx)[:per_client]
        grey.append(grey_levels(data.x[idx], *_painted_colours(data, idx, colours[c.cid])))
        ys.append((c.y_train if split == "train" else c.y_test)[:per_client])

    def render(m: torch.Tensor, k: int) -> torch.Tensor:
        return (paint_grey(m, *colours[k]).float() / 255.0 - data.mean) / data.std

    return torch.cat(grey), torch.cat(ys), render


@torch.no_grad()
def _in_colours(extract: Extractor, render: Renderer, m: torch.Tensor, colours) -> list:
    return [extract(render(m, k)).flatten(1).float() for k in colours]


def colour_sensitivity(
    extract: Extractor, render: Renderer, m: torch.Tensor, y: torch.Tensor, colours: list[int]
) -> dict[str, float]:
    """How much one network's features move with the colour against with the content, on grey
    images ``m`` (labels ``y``) rendered in each of ``colours``:

    - ``colour``: the mean distance ``||f(x_i in A) − f(x_i in B)||`` between the same image in
      two colours, over images and pairs of colours A ≠ B;
    - ``content``: the mean distance ``||f(x_i in A) − f(x_j in A)||`` between two images of
      different digits (``y_i ≠ y_j``) in the same colour, over such pairs and colours;
    - ``ratio`` = colour / content: 0 for a network blind to the colour, large for one that
      sees mostly the colour; scale-free, so networks can be compared."""
    feats = _in_colours(extract, render, m, colours)
    pairs = [(i, j) for i in range(len(feats)) for j in range(i + 1, len(feats))]
    colour = sum(float((feats[i] - feats[j]).norm(dim=1).mean()) for i, j in pairs)
    colour /= max(len(pairs), 1)
    other = y[:, None] != y[None, :]
    content = sum(float(torch.cdist(f, f)[other].mean()) for f in feats) / len(feats)
    return {"colour": colour, "content": content, "ratio": colour / max(content, 1e-12)}


def cross_colour_transfer(
    extract: Extractor,
    render: Renderer,
    train: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    colours: list[int],
    steps: int = 300,
) -> dict[str, float]:
    """Whether one network's digit features carry over between colours: for every colour A of
    ``colours`` a linear digit probe (:func:`fit_classifier`) fitted on the features of the
    ``train`` grey images (and labels) rendered in A, standardised by their statistics, then
    scored on the ``test`` images rendered in A (``same``, %) and in each other colour B
    (``other``, the mean over B); ``drop`` = same − other in points, averaged over A
    (0: a probe trained in one colour reads every colour as well)."""
    (m_tr, y_tr), (m_te, y_te) = train, test
    f_tr = _in_colours(extract, render, m_tr, colours)
    f_te = _in_colours(extract, render, m_te, colours)
    classes = int(max(y_tr.max(), y_te.max())) + 1
    same, other = [], []
    for a in range(len(colours)):
        std = _standardiser(f_tr[a])
        net = fit_classifier(std(f_tr[a]), y_tr.long(), classes, steps=steps, seed=a)
        same.append(_accuracy(net, std(f_te[a]), y_te))
        rest = [_accuracy(net, std(f_te[b]), y_te) for b in range(len(colours)) if b != a]
        other.append(sum(rest) / max(len(rest), 1))
    s, o = sum(same) / len(same), sum(other) / len(other)
    return {"same": s, "other": o, "drop": s - o}
