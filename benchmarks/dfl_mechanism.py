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
from statistics import fmean

import yaml

from fedshift.tools.dfl_verdict import (
    dependence,
    digit_from,
    holds,
    invariance_checks,
    mechanism,
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
    order = list(SETTINGS)

    def place(key: str) -> tuple:
        r = runs[key]
        rank = {DEFAULT: 0, CONTROL: 1, FEDAVG: 3}.get(r["variant"], 2)
        where = order.index(r["setting"]) if r["setting"] in order else len(order)
        return where, r["setting"], rank, r["variant"], r["seed"]

    return {key: runs[key] for key in sorted(runs, key=place)}


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
        "| run | what | round | local acc % | mi_s_game | mi_s (after stage 2) |",
        "|---|---|---|---|---|---|",
    ]
    for key, r in runs.items():
        m = r["last"]
        lines.append(
            f"| {key} | {label(r)} | {m.get('round')} | {_f(m.get('local_acc'), '.2f')} | "
            f"{_f(m.get('mi_s_game'))} | {_f(m.get('mi_s'))} |"
        )
    return "\n".join(lines)


def _critic_cells(p: dict) -> str:
    sep, cat = p["critics"]["separable"], p["critics"]["concat"]
    null = max(v["null"]["mean"] for v in p["critics"].values())
    return " | ".join(
        f"{v:.3f}"
        for v in (
            sep["within"]["mean"], cat["within"]["mean"], null, sep["ceiling"]["mean"],
            cat["ceiling"]["mean"], sep["pooled"]["mean"], cat["pooled"]["mean"],
            sep["pooled"]["ceiling"],
        )
    )  # fmt: skip


def _digit_cells(p: dict) -> str:
    d = p["digit"]

    def pair(v):
        return "-" if v is None else f"{v['linear']['mean']:.1f} / {v['mlp']['mean']:.1f}"

    chance = next(iter(next(iter(d.values())).values()))["chance"]
    return f"{pair(d.get('E_s'))} | {pair(d.get('E_c') or d.get('body'))} | {chance:.1f}"


def probes_table(runs: dict) -> str:
    """Within-client critics (both families, null, ceilings), pooled ones and digit probes:
    a row per run and per untrained network."""
    lines = [
        "| run | what | within, separable | within, concat | null | ceiling, separable | "
        "ceiling, concat | pooled, separable | pooled, concat | pooled ceiling | "
        "E_s digit % (linear / MLP) | E_c or body digit % (linear / MLP) | chance % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, r in runs.items():
        for row, what, p in ((key, label(r), r["probe"]), (f"{key} untrained", "untrained network", r["initial"])):  # fmt: skip
            if p is None:
                continue
            critics = _critic_cells(p) if "critics" in p else " | ".join(["-"] * 8)
            lines.append(f"| {row} | {what} | {critics} | {_digit_cells(p)} |")
    return "\n".join(lines)


def attributes_table(runs: dict) -> str:
    lines = [
        "| network | colour / content distance | cross-colour digit drop, points |",
        "|---|---|---|",
    ]
    for key, r in runs.items():
        for prefix, p in (("", r["probe"]), ("untrained ", r["initial"])):
            for net, v in ((p or {}).get("attributes") or {}).items():
                shown = {"inv": "E_c" if prefix else "server's E_c", "body": "body"}.get(net, "E_s")
                lines.append(
                    f"| {key}: {prefix}{shown} | {v['sensitivity']['ratio']:.3f} | "
                    f"{v['transfer']['drop']:.1f} |"
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
    if controls:
        ctrl = fmean(dependence(c) for c in controls)
        digit = fmean(digit_from(c) for c in controls)
        seeds = ", ".join(str(r["seed"]) for r in mine if r["variant"] == CONTROL)
        out.append(
            f"The beta_s = 0 control (seeds {seeds}): within-client Î_s + log 4 {ctrl:.3f} "
            f"(larger family), digit probe from E_s {digit:.1f}% (better probe), means over seeds."
        )
    if invariant_ok:
        yes = [k for k, v in invariant_ok.items() if v]
        out.append(f"E_c colour-invariant: **{'yes, ' + ' and '.join(yes) if yes else 'no'}**.")
    return "\n".join(out)


RUNS_NOTE = (
    "Local accuracy: every client scored with its own model on its test split, pooled over the "
    "20 clients. `mi_s_game`: T_s's estimate of Î(E_s; E_c) + log 4 on the stage-1 batches "
    "right before E_s's steps, the mean over the round's clients (a CLUB run logs CLUB's "
    "estimate, not + log 4); `mi_s`: T_s read after stage 2 (stale)."
)
PROBES_NOTE = (
    "Fresh critics' Î + log 4 (0: independent, at most log 4 = 1.386) of E_s against the "
    "server's E_c on the test split, trained and read within one client (mean over the 20 "
    "clients), per family; null: E_c shuffled within the client (the larger family's); "
    "ceiling: E_c against itself; pooled: one critic over all clients, whose ceiling is what "
    "knowing only the client reads. Digit probes: fitted on a client's train split, scored on "
    "its test split, mean over clients; chance: the client's most frequent digit."
)
COLOURS_NOTE = (
    "One network applied to the same grey test images painted in four clients' colours: the "
    "distance between one image in two colours over that between two digits in one colour "
    "(0: blind to colour), and the points a linear digit probe fitted in one colour loses in "
    "the others."
)
VERDICT_NOTE = (
    "Rules of `fedshift.tools.dfl_verdict` (bounds fixed before the runs); an option is a DFL "
    "run that sets parameters other than beta_s = 0; n/a: the rule does not apply (no control, "
    "or no JSD game read-out)."
)


def report(folder: Path) -> str:
    runs = load(folder)
    settings = list(dict.fromkeys(r["setting"] for r in runs.values()))
    parts = [
        "## The runs (final round)", "", RUNS_NOTE, "", runs_table(runs), "",
        "## Within-client dependence (E_s vs E_c) and digit probes", "", PROBES_NOTE, "",
        probes_table(runs), "",
        "## One network applied to every colour", "", COLOURS_NOTE, "", attributes_table(runs),
        "", "## Verdict", "", VERDICT_NOTE, "",
    ]  # fmt: skip
    parts.append("\n\n".join(verdict(runs, s) for s in settings))
    return "\n".join(parts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder", type=Path, help="a results folder (see above)")
    folder = ap.parse_args().folder
    if not (folder / "probes.json").is_file():
        ap.error(f"{folder} has no probes.json: write it with benchmarks/dfl_probes.py --json")
    keys = json.loads((folder / "probes.json").read_text())
    odd = [k for k in keys if len(k.removesuffix(" (initial network)").split("/")) != 3]
    if odd:
        ap.error(f"probes.json names {odd[0]!r}: runs are named SETTING/VARIANT/seedN (--tail 3)")
    print(report(folder))


if __name__ == "__main__":
    main()
