"""What the branches of finished DFL runs (and FedAvg's extractor) carry, one markdown table a run.

    python benchmarks/dfl_probes.py RUN [RUN ...] [--per-client 1000] [--initial] [--inv own]
        [--steps 400] [--batch 128] [--colours 0,5,10,15] [--json F] [--tail N]
        [--features-out DIR]
    python benchmarks/dfl_probes.py --from-json F      # the tables again, from the figures
    python benchmarks/dfl_probes.py --merge A.json B.json --json F   # several runs' figures in one

A RUN is a run directory (its ``checkpoint.pt`` and ``config.yaml``; a ``beta_s=0`` run is just
another run) or a ``.pt`` file of features written by ``--features-out`` (then no attribute
measures: they need the network). ``--initial`` adds, per run directory, the same probes on
its untrained initial network (rebuilt from the run's config and seed).

Rows of a run's table (``fedshift.tools.critics``, ``fedshift.tools.probes``):

- *Î(E_s; E_c) + log 4 within client*, per critic family (separable: DFL's own critic on
  unit-norm features; concat: an MLP on standardised ``[E_s; E_c]``): one fresh critic per
  client on that client's test features only, the mean and sd over clients; *null*: the same
  with E_c shuffled within the client (about 0); *ceiling*: E_c against itself (the family's
  most on these samples). This is the dependence DFL's I_s term is about (it reads one
  client's batch). "climbing": clients whose critic was still rising at its last check.
- *between clients (pooled)*: one critic on every client's pairs pooled; its *ceiling* is what
  knowing only the client reads (``client_only_ceiling``: 1.185 for 20 equal clients). Not a
  measure of DFL's objective: E_s and E_c of one client share its colour and its networks.
- *digit probe within client*: a linear (logistic) and a one-hidden-layer (128) probe fitted
  on a client's training features, scored on its test features, mean and sd over clients;
  chance: always the client's most frequent training digit.
- *colour / content distance* and *cross-colour digit drop*, on ONE network applied to every
  colour (DFL's server E_c, FedAvg's body, the untrained network): the same grey test images
  rendered in each of ``--colours``; the first is the mean feature distance between one image
  in two colours over that between two different digits in one colour (0: blind to colour);
  the second, a linear digit probe fitted in one colour, scored in the same and in the others
  (points lost).

E_c is the client's own (``--inv own``, the one it is scored with) or the server's
(``--inv server``, the one a client receives; its specific stage's I_s term reads the E_c
received at the round's start). Nothing is trained in the runs; the probes read checkpoints.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import torch

from fedshift.reporting.tables import run_names
from fedshift.tools.critics import (
    FAMILIES,
    pooled_critic,
    shuffled_within_clients,
    within_client_critic,
)
from fedshift.tools.probes import (
    client_features,
    colour_sensitivity,
    cross_colour_transfer,
    load_run,
    scenario_images,
    shared_extractors,
    within_client_probe,
)

NAMES = {"spec": "E_s", "inv": "E_c", "body": "body"}


def run_features(run: Path, per_client: int, initial: bool, inv: str) -> dict:
    """Both splits' features of a run directory (or a ``.pt`` features file) and, for a run
    directory, the loaded run for the attribute measures."""
    if run.suffix == ".pt":
        return {**torch.load(run, weights_only=True), "loaded": None}
    loaded = load_run(run, initial)
    splits = {
        s: client_features(*loaded, split=s, per_client=per_client, inv=inv)
        for s in ("train", "test")
    }
    return {**splits, "loaded": loaded}


def critic_rows(test: dict, settings: dict) -> dict:
    """Within-client critics (measured, null, ceiling) and pooled ones, per family."""
    a, b, client = test["spec"], test["inv"], test["client"]
    out = {}
    for fam in FAMILIES:
        out[fam] = {
            "within": within_client_critic(a, b, client, fam, **settings).as_dict(),
            "null": within_client_critic(
                a, shuffled_within_clients(b, client), client, fam, **settings
            ).as_dict(),
            "ceiling": within_client_critic(b, b, client, fam, **settings).as_dict(),
            "pooled": pooled_critic(a, b, client, fam, **settings).as_dict(),
        }
    return out


def attribute_rows(loaded, colours: list[int] | None, images: int, steps: int) -> dict:
    """Colour / content distance and cross-colour drop of each shared network of the run
    (``colours`` None: four clients' colours evenly round the hue circle)."""
    data, algo, state = loaded
    att = data.meta["config"].scenario.attributes
    if att is None or att.kind != "color":
        return {}
    n = len(data.clients)
    colours = colours or sorted({k * n // 4 for k in range(4)})
    m_te, y_te, render = scenario_images(data, "test", images)
    m_tr, y_tr, _ = scenario_images(data, "train", images)
    out = {}
    for name, extract in shared_extractors(algo, state).items():
        out[name] = {
            "sensitivity": colour_sensitivity(extract, render, m_te, y_te, colours),
            "transfer": cross_colour_transfer(
                extract, render, (m_tr, y_tr), (m_te, y_te), colours, steps
            ),
        }
    return out


def own_critics(run: Path) -> dict:
    """The round and the run's own critics' last logged ``mi_s``, ``mi_c`` and game read-out
    ``mi_s_game`` (T_s on the stage-1 batches, against the received E_c)."""
    path = run / "metrics.jsonl"
    if not path.exists():
        return {}
    last = [json.loads(line) for line in path.read_text().splitlines()]
    return {k: last[-1].get(k) for k in ("round", "mi_s", "mi_c", "mi_s_game")} if last else {}


def probe_run(run: Path, args, initial: bool = False) -> dict:
    f = run_features(run, args.per_client, initial, args.inv)
    if args.features_out and f["loaded"] is not None:
        args.features_out.mkdir(parents=True, exist_ok=True)
        stem = "-".join(run.parts[-3:]) + ("-initial" if initial else "")
        keep = {**{k: f[k] for k in ("train", "test")}, "inv": args.inv}
        keep["round"] = f["loaded"][2].round
        torch.save(keep, args.features_out / f"{stem}.pt")
    settings = {"steps": args.steps, "batch": args.batch, "hidden": args.hidden}
    out: dict = {
        "inv": f.get("inv", args.inv),
        "clients": int(f["test"]["client"].unique().numel()),
    }
    out["round"] = f["loaded"][2].round if f["loaded"] else f.get("round")
    if "spec" in f["test"]:
        out["critics"] = critic_rows(f["test"], settings)
    out["digit"] = {
        NAMES[k]: {
            kind: asdict(
                within_client_probe(f["train"], f["test"], k, hidden=h, steps=args.probe_steps)
            )
            for kind, h in (("linear", 0), ("mlp", 128))
        }
        for k in ("spec", "inv", "body")
        if k in f["test"]
    }
    if f["loaded"] is not None:
        out["attributes"] = attribute_rows(
            f["loaded"], args.colours, args.colour_images, args.probe_steps
        )
    if not initial and run.is_dir():
        out["own"] = own_critics(run)
    return out


def _f(v, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v, fmt)


HEADER = (
    "| measure | features | family / probe | reading | sd over clients | null | ceiling | "
    "chance | note |\n|---|---|---|---|---|---|---|---|---|"
)


def run_table(name: str, r: dict) -> str:
    """One run's markdown table (``probe_run``'s figures)."""
    ec = "E_c (client's own)" if r.get("inv") == "own" else "E_c (server's)"
    lines = [f"### {name} (round {_f(r.get('round'), '')}, {r['clients']} clients)", "", HEADER]
    for fam, c in r.get("critics", {}).items():
        w, n, top, p = c["within"], c["null"], c["ceiling"], c["pooled"]
        lines.append(
            f"| Î + log 4 within client | E_s vs {ec} | {fam} | {w['mean']:.3f} | "
            f"{w['sd']:.3f} | {n['mean']:.3f} | {top['mean']:.3f} | - | "
            f"{len(w['values'])} critics, {w['climbing']} climbing at the end |"
        )
        lines.append(
            f"| Î + log 4 between clients (pooled) | E_s vs {ec} | {fam} | {p['mean']:.3f} | "
            f"- | - | {p['ceiling']:.3f} | - | ceiling: the client alone |"
        )
    own = r.get("own") or {}
    if own.get("mi_s") is not None:
        lines.append(
            f"| Î + log 4, the run's own critics (last log) | mi_s / mi_c | DFL's | "
            f"{own['mi_s']:.3f} / {_f(own.get('mi_c'))} | - | - | - | - | - |"
        )
    for feat, kinds in r.get("digit", {}).items():
        shown = ec if feat == "E_c" else feat
        for kind, v in kinds.items():
            lines.append(
                f"| digit probe within client % | {shown} | {kind} | {v['mean']:.1f} | "
                f"{v['sd']:.1f} | - | - | {v['chance']:.1f} | train split -> test split |"
            )
    prefix = "untrained" if r.get("round") == 0 else "shared"
    for net, v in r.get("attributes", {}).items():
        s, t = v["sensitivity"], v["transfer"]
        shown = f"{prefix} {NAMES[net]}" + (
            " (server)" if net == "inv" and prefix == "shared" else ""
        )
        lines.append(
            f"| colour / content feature distance | {shown} | - | {s['ratio']:.3f} | - | - | - | "
            f"- | colour {s['colour']:.3g}, content {s['content']:.3g} |"
        )
        lines.append(
            f"| cross-colour digit drop, points | {shown} | linear | {t['drop']:.1f} | - | - | "
            f"- | - | same colour {t['same']:.1f}%, other colours {t['other']:.1f}% |"
        )
    return "\n".join(lines)


LEGACY_HEADER = (
    "| run | round | train acc % | test acc % | gap | acc, colours swapped % | branch | "
    "colour probe % | digit probe % | feature change, colours swapped % | "
    "fresh critic Î_s+log4 | run's mi_s / mi_c |\n|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def legacy_table(every: dict) -> str:
    """The table of the figures an earlier version of this script wrote (pooled probes and a
    pooled critic), so that published ``--json`` files still render as they were published."""
    lines = [LEGACY_HEADER]
    for name, r in every.items():
        fresh = _f(r.get("fresh_mi_s"))
        own = "-" if r.get("run_mi_s") is None else f"{r['run_mi_s']:.3f} / {r['run_mi_c']:.3f}"
        gap = None if r.get("train_acc") is None else r["train_acc"] - r["local_acc"]
        for branch, v in r["branches"].items():
            lines.append(
                f"| {name} | {r['round']} | {_f(r.get('train_acc'), '.2f')} | "
                f"{_f(r.get('local_acc'), '.2f')} | {_f(gap, '.2f')} | "
                f"{_f(r.get('acc_swapped'), '.2f')} | {branch} | {v['colour']:.1f} | "
                f"{v['digit']:.1f} | {v['swap_change']:.1f} | {fresh} | {own} |"
            )
    return "\n".join(lines)


def tables(every: dict) -> str:
    """Every run's table; a ``--json`` file of the earlier version as its one table."""
    if any("branches" in r for r in every.values()):
        return legacy_table(every)
    return "\n\n".join(run_table(name, r) for name, r in every.items())


def merge_json(files: list[Path]) -> dict:
    """The runs of several ``--json`` files in one dict (a run named twice is refused)."""
    merged: dict = {}
    for f in files:
        for name, r in json.loads(f.read_text()).items():
            if name in merged:
                raise SystemExit(f"error: {name!r} is in two of the files; probe it once")
            merged[name] = r
    return merged


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="*", type=Path)
    ap.add_argument("--per-client", type=int, default=1000, help="images a client and split")
    ap.add_argument("--initial", action="store_true", help="also probe each initial network")
    ap.add_argument("--inv", choices=("own", "server"), default="own", help="which E_c")
    ap.add_argument("--steps", type=int, default=400, help="Adam steps of each critic")
    ap.add_argument("--batch", type=int, default=128, help="a critic's mini-batch")
    ap.add_argument("--hidden", type=int, default=256, help="a critic's hidden width")
    ap.add_argument(
        "--probe-steps", type=int, default=300, help="full-batch Adam steps of each digit probe"
    )
    ap.add_argument(
        "--colours",
        type=lambda s: [int(c) for c in s.split(",")],
        help="the clients whose colours the attribute measures render (default: four, evenly "
        "round the hue circle: 0,5,10,15 of 20)",
    )
    ap.add_argument("--colour-images", type=int, default=25, help="images a client, per split")
    ap.add_argument("--json", type=Path, help="also write every figure to this file")
    ap.add_argument(
        "--tail",
        type=int,
        help="name each run by the last N parts of its path (default: the fewest that tell "
        "the runs apart)",
    )
    ap.add_argument("--features-out", type=Path, help="also save each run's features here")
    ap.add_argument(
        "--from-json", type=Path, help="print the tables of a --json file, probe nothing"
    )
    ap.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        help="write the runs of these --json files into the --json file, probe nothing",
    )
    args = ap.parse_args()
    if args.merge:
        if not args.json:
            ap.error("--merge writes into the --json file: give --json F")
        merged = merge_json(args.merge)
        args.json.write_text(json.dumps(merged, indent=2) + "\n")
        print(f"{len(merged)} runs from {len(args.merge)} files -> {args.json}")
        return
    if args.from_json:
        print(tables(json.loads(args.from_json.read_text())))
        return
    every = {}
    names = run_names(args.runs)
    if args.tail:
        names = {run: "/".join(run.parts[-args.tail :]) for run in args.runs}
    for run in args.runs:
        for initial in (False, True) if args.initial and run.is_dir() else (False,):
            name = f"{names[run]} (initial network)" if initial else names[run]
            every[name] = probe_run(run, args, initial)
    print(tables(every))
    if args.json:
        args.json.write_text(json.dumps(every, indent=2) + "\n")


if __name__ == "__main__":
    main()
