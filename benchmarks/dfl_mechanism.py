"""DFL's mechanism, measured where its loss acts, and the verdict: markdown from a results folder.

    python benchmarks/dfl_mechanism.py DIR

DIR holds ``probes.json`` (``benchmarks/dfl_probes.py --json``, keyed ``SETTING/VARIANT/seedN``,
the untrained network ``... (initial network)``) and, per run, ``SETTING/VARIANT/seedN/``
with its ``config.yaml`` and ``metrics.jsonl`` (``benchmarks/collect_runs.py``). A VARIANT is
``dfl`` (the paper's objective, DFL's defaults), ``dfl-beta_s-0`` (the control: the I_s term
off), ``fedavg`` (FedAvg's body, for the attribute measures) or any other DFL run, an *option*,
shown with the parameters its config sets. The rules of the verdict are
``fedshift.tools.dfl_verdict``'s. Nothing is trained or probed here.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import yaml

from fedshift.tools.dfl_verdict import (
    holds,
    invariance_checks,
    mechanism,
    readable,
    within_checks,
)

DEFAULT, CONTROL, FEDAVG = "dfl", "dfl-beta_s-0", "fedavg"
SETTINGS = {
    "colored-mnist": "Colored-MNIST as in DFL's Table 1 (one colour a client)",
    "two-colours": "test bed, two colours a client (not the paper's set-up)",
}


HEAD = "| rule | figure | bound | holds |\n|---|---|---|---|"


def _f(v, fmt: str = ".3f") -> str:
    return "-" if v is None else format(v, fmt)


def load(folder: Path) -> dict:
    """Every run of the folder: key ``SETTING/VARIANT/seedN`` -> its probe figures, the
    parameters its config sets, its final metrics line and the untrained network's probes."""
    probes = json.loads((folder / "probes.json").read_text())
    runs = {}
    for key, fig in probes.items():
        if key.endswith("(initial network)"):
            continue
        setting, variant, seed = key.split("/")
        cfg = yaml.safe_load((folder / key / "config.yaml").read_text())
        lines = (folder / key / "metrics.jsonl").read_text().splitlines()
        runs[key] = {
            "setting": setting,
            "variant": variant,
            "seed": int(seed.removeprefix("seed")),
            "probe": fig,
            "initial": probes.get(f"{key} (initial network)"),
            "params": (cfg.get("algorithm") or {}).get("params") or {},
            "last": json.loads(lines[-1]) if lines else {},
        }
    return runs


def label(run: dict) -> str:
    """A run's variant as read: the paper's objective, the control, or the options it sets."""
    if run["variant"] == DEFAULT:
        return "DFL, the paper's objective"
    if run["variant"] == FEDAVG:
        return "FedAvg"
    shown = ", ".join(f"`{k}={v}`" for k, v in sorted(run["params"].items()))
    return f"DFL, {shown}" + (" (control)" if run["variant"] == CONTROL else "")


def runs_table(runs: dict) -> str:
    lines = [
        "| setting | run | seed | round | local acc % | mi_s_game | mi_s (after stage 2) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in runs.values():
        m = r["last"]
        lines.append(
            f"| {r['setting']} | {label(r)} | {r['seed']} | {m.get('round')} | "
            f"{_f(m.get('local_acc'), '.2f')} | {_f(m.get('mi_s_game'))} | {_f(m.get('mi_s'))} |"
        )
    return "\n".join(lines)


def _critic_cells(p: dict) -> str:
    c = p["critics"]
    null = max(v["null"]["mean"] for v in c.values())
    return (
        f"{c['separable']['within']['mean']:.3f} | {c['concat']['within']['mean']:.3f} | "
        f"{null:.3f} | {readable(p):.3f} | {c['separable']['pooled']['mean']:.3f} | "
        f"{c['separable']['pooled']['ceiling']:.3f}"
    )


def _digit_cells(p: dict) -> str:
    d = p["digit"]
    es, ec = d.get("E_s"), d.get("E_c")

    def pair(v):
        return "-" if v is None else f"{v['linear']['mean']:.1f} / {v['mlp']['mean']:.1f}"

    chance = next(iter((es or ec or d["body"]).values()))["chance"]
    return f"{pair(es)} | {pair(ec)} | {chance:.1f}"


def probes_table(runs: dict) -> str:
    lines = [
        "| setting | run | seed | within, separable | within, concat | null | ceiling | "
        "pooled, separable | pooled ceiling | E_s digit % (linear / MLP) | "
        "E_c digit % (linear / MLP) | chance % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs.values():
        for name, p in ((label(r), r["probe"]), ("untrained network", r["initial"])):
            if p is None or "critics" not in p:
                continue
            lines.append(
                f"| {r['setting']} | {name} | {r['seed']} | {_critic_cells(p)} | "
                f"{_digit_cells(p)} |"
            )
    return "\n".join(lines)


def attributes_table(runs: dict) -> str:
    lines = [
        "| setting | network | colour / content distance | cross-colour digit drop, points |",
        "|---|---|---|---|",
    ]
    for r in runs.values():
        for prefix, p in (("", r["probe"]), ("untrained ", r["initial"])):
            for net, v in ((p or {}).get("attributes") or {}).items():
                shown = {"inv": "server's E_c", "body": "body", "spec": "E_s"}[net]
                lines.append(
                    f"| {r['setting']} | {prefix}{shown} of {label(r)}, seed {r['seed']} | "
                    f"{v['sensitivity']['ratio']:.3f} | {v['transfer']['drop']:.1f} |"
                )
    return "\n".join(lines)


def verdict(runs: dict, setting: str) -> str:
    """Per DFL variant of ``setting`` its checks, then the verdict line."""
    mine = [r for r in runs.values() if r["setting"] == setting]
    controls = [r["probe"] for r in mine if r["variant"] == CONTROL]
    fedavg = next((r["probe"] for r in mine if r["variant"] == FEDAVG), None)
    variants: dict[str, list[dict]] = {}
    for r in mine:
        if r["variant"] not in (CONTROL, FEDAVG):
            variants.setdefault(r["variant"], []).append(r)
    out, ok, invariant_ok = [f"### {SETTINGS.get(setting, setting)}"], {}, {}
    for group in variants.values():
        family = group[0]["params"].get("critic_kind", "separable")
        jsd = group[0]["params"].get("mi_estimator_s", "jsd") == "jsd"
        games = [r["last"].get("mi_s_game") if jsd else None for r in group]
        checks = within_checks([r["probe"] for r in group], games, family, controls)
        ok[label(group[0])] = holds(checks)
        seeds = ", ".join(str(r["seed"]) for r in group)
        out += ["", f"{label(group[0])} (seeds {seeds}; means over seeds):", "", HEAD]
        out += [c.line() for c in checks]
        if fedavg is not None and setting != "colored-mnist":  # one colour a client: no claim
            invariant = invariance_checks(group[0]["probe"], fedavg)
            out += [c.line() for c in invariant]
            invariant_ok[label(group[0])] = holds(invariant)
    paper = label({"variant": DEFAULT})
    options = {k: v for k, v in ok.items() if k != paper}
    out += ["", f"The MI term within clients: **{mechanism(ok.get(paper, False), options)}**."]
    if invariant_ok:
        yes = [k for k, v in invariant_ok.items() if v]
        out.append(f"E_c colour-invariant: **{'yes, ' + ' and '.join(yes) if yes else 'no'}**.")
    return "\n".join(out)


def report(folder: Path) -> str:
    runs = load(folder)
    order = list(SETTINGS)
    settings = sorted(
        {r["setting"] for r in runs.values()},
        key=lambda s: (order.index(s) if s in order else len(order), s),
    )
    parts = [
        "## The runs (final round)", "", runs_table(runs), "",
        "## Within-client dependence (E_s vs E_c) and digit probes", "", probes_table(runs), "",
        "## One network applied to every colour", "", attributes_table(runs), "",
        "## Verdict", "",
    ]  # fmt: skip
    parts.append("\n\n".join(verdict(runs, s) for s in settings))
    return "\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a results folder (see above)")
    print(report(ap.parse_args().folder))


if __name__ == "__main__":
    main()
