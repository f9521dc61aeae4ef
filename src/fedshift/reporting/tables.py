"""Tables across runs: one row per run, the metrics of the round chosen by a protocol."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from fedshift.core.errors import FedshiftError
from fedshift.reporting.drift_report import drift_table
from fedshift.reporting.protocols import PROTOCOLS, select_round
from fedshift.reporting.summary import Table, markdown


def fmt_value(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return f"{v:.2f}" if isinstance(v, float) else str(v)


def table_rows(runs: dict[str, list[dict[str, Any]]], protocol: str) -> list[dict[str, Any]]:
    """For each run: its entry at the protocol's round, with the per-concept global accuracy."""
    rows = []
    for name, hist in runs.items():
        e = select_round(hist, protocol)
        row = {
            "run": name,
            "round": e["round"],
            "global_acc": e.get("global_acc"),
            "local_acc": e.get("local_acc"),
            "train_acc": e.get("train_acc"),
            "elapsed_s": hist[-1].get("elapsed_s"),
        }
        row.update(
            {
                k: e[k]
                for k in ("val_acc", "ari_concept", "ari_label", "ari_noise", "forgetting")
                if k in e
            }
        )
        row.update({k: v for k, v in e.items() if k.startswith("global_acc_c")})
        rows.append(row)
    return rows


COLUMN_TITLES = {
    "run": "algorithm",
    "round": "round",
    "global_acc": "global acc %",
    "local_acc": "local acc %",
    "train_acc": "train acc %",
    "val_acc": "val acc %",
    "ari_concept": "ARI vs concept",
    "ari_label": "ARI vs label",
    "ari_noise": "ARI vs noisy",
    "elapsed_s": "time s",
}


def columns(rows: list[dict[str, Any]]) -> list[str]:
    keys = ["run", "global_acc"]
    keys += sorted({k for r in rows for k in r if k.startswith("global_acc_c")})
    keys += ["local_acc", "train_acc"] + (["val_acc"] if any("val_acc" in r for r in rows) else [])
    keys += [k for k in ("ari_concept", "ari_label", "ari_noise") if any(k in r for r in rows)]
    return keys + ["round", "elapsed_s"]


def title_of(key: str) -> str:
    if key.startswith("global_acc_c"):
        return f"global c{key.removeprefix('global_acc_c')} %"
    return COLUMN_TITLES.get(key, key)


def metrics_table(rows: list[dict[str, Any]], protocol: str, title: str = "") -> Table:
    """The runs' metrics at the protocol's round (rows of :func:`table_rows`), one row a run."""
    cols = columns(rows)
    cells = [[fmt_value(r.get(c)) for c in cols] for r in rows]
    title = title or f"metrics at the {PROTOCOLS[protocol]}"
    return Table([title_of(c) for c in cols], cells, title, (title_of("run"),), bold_title=True)


def to_markdown(rows: list[dict[str, Any]], protocol: str, note: str = "") -> str:
    """:func:`metrics_table` as markdown, under a line naming the protocol (and ``note``)."""
    head = f"Metrics at the {PROTOCOLS[protocol]}." + (f" {note}" if note else "")
    return markdown(head, metrics_table(rows, protocol))


def rich_table(rows: list[dict[str, Any]], protocol: str, title: str = ""):
    """:func:`metrics_table` for the console."""
    return metrics_table(rows, protocol, title).to_rich()


def run_names(paths: list[Path]) -> dict[Path, str]:
    """The shortest path tails (1, 2, ... parts) that name every run apart."""
    for depth in range(1, max((len(p.parts) for p in paths), default=1) + 1):
        tails = {p: "/".join(p.parts[-depth:]) for p in paths}
        if len(set(tails.values())) == len(tails):
            return tails
    return {p: str(p) for p in paths}


def scenario_table(data, limit: int = 40):
    """A rich table of a scenario's clients: concept, label map, style, sizes, top labels (and,
    with label noise, each client's flipped training labels)."""
    from rich.table import Table

    t = Table(
        title=f"{data.name} ({data.source}): {len(data.clients)} clients + "
        f"{len(data.test_clients)} test-only clients"
    )
    noise = "label_noise" in data.meta
    cols = (
        "client",
        "concept",
        "label map",
        "feature style",
        "train",
        "test",
        "top labels (count)",
    ) + (("label noise (flipped)",) if noise else ())
    for col in cols:
        t.add_column(col, justify="right" if col in ("train", "test") else "left")
    for c in [*data.clients[:limit], *data.test_clients]:
        top = c.label_hist.argsort()[::-1][:3]
        row = [
            f"{c.cid}{' (test-only)' if c.test_only else ''}",
            str(c.concept),
            c.label_map.name,
            c.style.label(),
            str(c.num_train),
            str(c.num_test),
            ", ".join(f"{y}({c.label_hist[y]})" for y in top if c.label_hist[y]),
        ]
        if noise:
            row.append("clean" if c.noise is None else f"noisy ({len(c.noise)})")
        t.add_row(*row)
    return t


def noise_table(data):
    """A rich table summing up the scenario's label noise (None without label noise)."""
    s = data.meta.get("label_noise")
    if not s:
        return None
    cols = ["kind", "rate", "noisy clients", "their training labels", "flipped", "flipped %"]
    cells = [
        [
            s["kind"],
            f"{s['rate']:g}",
            f"{len(s['noisy_clients'])} of {len(data.clients)}",
            str(sum(s["train_samples"])),
            str(sum(s["flipped"])),
            f"{100 * s['flipped_share']:.1f}",
        ]
    ]
    title = "Label noise on training labels (test splits and test-only clients are clean)"
    return Table(cols, cells, title, left=("kind",)).to_rich()


def audit_table(data):
    """A rich table of the scenario's leakage audit per time step (None: nothing to audit)."""
    entries = data.meta.get("audit") or []
    if not entries:
        return None
    cells = [
        [
            str(a["step"]) if a["step"] else "all",
            f"{a['test_leak']:.1f}",
            f"{a['test_leak_exact']:.1f}",
            f"{a['single_model_bound']:.1f}",
        ]
        for a in entries
    ]
    cols = [
        "step",
        "test images trained on before, same label (%)",
        "same input (%)",
        "single-model bound on unseen images (%)",
    ]
    return Table(cols, cells, "Local test splits: leakage audit", left=("step",)).to_rich()


BENCH_COLUMNS = (
    "model", "loss", "plain PyTorch (p)", "central (a)", "sequential (b)", "batched (c)",
    "a/p", "c/p", "b/a", "c/a", "c/b", "peak MB",
)  # fmt: skip


def bench_cells(rows: list[dict]) -> list[list[str]]:
    """Cells of throughput measurements (``BenchRow`` fields; a JSON written before the
    plain-PyTorch column has none of its values: n/a)."""

    def num(r: dict, key: str, fmt: str) -> str:
        return "n/a" if r.get(key) is None else format(r[key], fmt)

    return [
        [
            r["model"],
            r["loss"],
            *(num(r, k, ",.0f") for k in ("plain_sps", "central_sps", "sequential_sps")),
            num(r, "batched_sps", ",.0f"),
            num(r, "central_over_plain", ".2f"),
            num(r, "batched_over_plain", ".2f"),
            num(r, "seq_over_central", ".2f"),
            num(r, "batched_over_central", ".2f"),
            num(r, "batched_over_seq", ".2f"),
            num(r, "peak_mem_mb", ",.0f"),
        ]
        for r in rows
    ]


def bench_table(rows: list[dict], title: str):
    """A rich table of throughput measurements."""
    return Table(list(BENCH_COLUMNS), bench_cells(rows), title, ("model", "loss")).to_rich()


def bench_markdown(rows: list[dict], title: str) -> str:
    """The same measurements as a markdown table."""
    return markdown(title, Table(list(BENCH_COLUMNS), bench_cells(rows)), end="")


def bench_markdown_file(path: str | Path) -> str:
    """``fedshift bench --from-json``: the markdown table of a JSON that ``fedshift bench``
    wrote, measuring nothing."""
    import json

    if not Path(path).is_file():
        raise FedshiftError(f"--from-json {path}: no such file")
    rows = json.loads(Path(path).read_text())
    r = rows[0]
    title = (
        f"Training throughput (samples/s, a sample counted once per model), {r['device']}, "
        f"{r['clients']} clients x {r['per_client']} samples, batch {r['batch_size']} "
        f"(from {Path(path).name})."
    )
    return bench_markdown(rows, title)


def comparison_tables(res, base) -> list:
    """What ``fedshift compare`` prints: the table at the protocol's round, the notes (training
    settings that differ between the rows) and, on a timeline, the drift table."""

    title = (
        f"{base.name}: {res.data.name}, {len(res.data.clients)} clients, {base.train.rounds} "
        f"rounds — metrics at the {PROTOCOLS[res.protocol]}"
    )
    out: list = [rich_table(res.rows(), res.protocol, title=title)]
    out += ["note: " + line for line in res.notes]
    if res.drift:  # how each method copes with the drift (drift.md says more)
        out.append(drift_table(res.drift, "drift against the true concepts (drift.md)").to_rich())
    return out


def round_info(metrics: dict[str, Any] | None) -> str:
    """The headline metrics of an evaluation, e.g. "global 41.2%  local 60.3%"."""
    if not metrics:
        return ""
    names = {"gm_acc": "GM", "pm_v": "PM(V)", "pm_l": "PM(L)"}
    keys = (
        ("gm_acc", "pm_v", "pm_l")
        if "pm_v" in metrics
        else ("global_acc", "local_acc", "train_acc")
    )
    return "  ".join(
        f"{names.get(k, k.replace('_acc', ''))} {metrics[k]:.1f}%"
        for k in keys
        if isinstance(metrics.get(k), float) and not math.isnan(metrics[k])
    )
