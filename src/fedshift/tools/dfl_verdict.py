"""Whether DFL's mechanism is at work, decided from the probes of finished runs.

The figures are those ``benchmarks/dfl_probes.py`` writes per run (``--json``): the fresh
within-client critics of ``Î(E_s; E_c) + log 4`` per critic family, their null and ceiling,
the within-client digit probes, and the attribute measures of each shared network. Each rule
is one :class:`Check` with its figure and its bound, so a verdict line always shows what it
rests on. The bounds (:class:`Bounds`) are the project's, fixed before the runs:

- *the MI term works within clients*: the within-client ``Î_s + log 4`` at most 0.15 and at
  most a quarter of the ``beta_s = 0`` control's, read by critics of which one can read above
  1.0 (the E_c-against-itself ceiling); the within-client digit probe from E_s at most 20 % (chance
  about 10 %); and the run's own game read-out ``mi_s_game`` within 0.15 of the fresh critic
  of its own family (so the game's critic is near its optimum, as the paper's analysis takes);
- *E_c is colour-invariant* (only on a test bed where a client holds several colours): its
  colour / content feature distance at most half of FedAvg's body and a cross-colour digit
  drop of at most 2 points.

Each JSD reading is a variational lower bound, so of two critic families the larger reading is
the better estimate of the dependence, and of two probes the better probe: the rules use them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean


@dataclass(frozen=True)
class Bounds:
    """The verdict's bounds (see the module docstring)."""

    within: float = 0.15
    share: float = 0.25
    ceiling: float = 1.0
    digit: float = 20.0
    game: float = 0.15
    colour: float = 0.5
    drop: float = 2.0


@dataclass(frozen=True)
class Check:
    """One rule: its ``name``, the ``value`` it read, the ``bound`` as text and whether it
    holds (``ok`` None: it does not apply, e.g. no game read-out of a JSD critic)."""

    name: str
    value: float | None
    bound: str
    ok: bool | None
    fmt: str = ".3f"

    def line(self) -> str:
        shown = "-" if self.value is None else format(self.value, self.fmt)
        mark = {True: "yes", False: "no", None: "n/a"}[self.ok]
        return f"| {self.name} | {shown} | {self.bound} | {mark} |"


def dependence(probe: dict) -> float:
    """The within-client ``Î(E_s; E_c) + log 4`` of a run: the larger family's mean over
    clients."""
    return max(c["within"]["mean"] for c in probe["critics"].values())


def readable(probe: dict) -> float:
    """The most the within-client critics can read there: the larger family's E_c-against-
    itself ceiling (the family that reads highest decides the dependence too)."""
    return max(c["ceiling"]["mean"] for c in probe["critics"].values())


def digit_from(probe: dict, features: str = "E_s") -> float:
    """The within-client digit probe's test accuracy (%) from ``features``: the better probe's
    mean over clients."""
    return max(v["mean"] for v in probe["digit"][features].values())


def game_gap(probe: dict, game: float | None, family: str) -> float | None:
    """How far the run's game read-out ``game`` (``mi_s_game``, already ``+ log 4``) lies from
    the fresh within-client critic of the game's critic ``family``; None without a JSD game
    read-out (a CLUB run logs CLUB's estimate, another quantity)."""
    if game is None or family not in probe["critics"]:
        return None
    return abs(game - probe["critics"][family]["within"]["mean"])


def within_checks(
    runs: Sequence[dict],
    games: Sequence[float | None],
    family: str,
    controls: Sequence[dict],
    bounds: Bounds = Bounds(),
) -> list[Check]:
    """The rules of "the MI term works within clients" for one variant's ``runs`` (the probe
    figures of each seed; ``games`` their final ``mi_s_game``, None where not a JSD reading),
    against the ``beta_s = 0`` ``controls``. Means over seeds; the game's largest gap."""
    dep = fmean(dependence(r) for r in runs)
    ctrl = fmean(dependence(c) for c in controls) if controls else None
    share = None if not ctrl or ctrl <= 0 else dep / ctrl
    ceiling = min(readable(r) for r in [*runs, *controls])
    digit = fmean(digit_from(r) for r in runs)
    gaps = [
        g for r, v in zip(runs, games, strict=True) if (g := game_gap(r, v, family)) is not None
    ]
    gap = max(gaps) if gaps else None
    return [
        Check("within-client Î_s + log 4 (larger family)", dep, f"≤ {bounds.within}",
              dep <= bounds.within),
        Check("its share of the beta_s = 0 control's", share, f"≤ {bounds.share}",
              None if share is None else share <= bounds.share),
        Check("ceiling the critics read (E_c vs E_c)", ceiling, f"> {bounds.ceiling}",
              ceiling > bounds.ceiling),
        Check("within-client digit probe from E_s %", digit, f"≤ {bounds.digit}",
              digit <= bounds.digit, ".1f"),
        Check(f"\\|mi_s_game − fresh {family} critic\\|", gap, f"≤ {bounds.game}",
              None if gap is None else gap <= bounds.game),
    ]  # fmt: skip


def invariance_checks(dfl: dict, fedavg: dict, bounds: Bounds = Bounds()) -> list[Check]:
    """The rules of "E_c is colour-invariant": the server's E_c of a DFL run (its ``attributes``
    figures) against FedAvg's body in the same scenario."""
    ec, body = dfl["attributes"]["inv"], fedavg["attributes"]["body"]
    ratio = ec["sensitivity"]["ratio"] / max(body["sensitivity"]["ratio"], 1e-12)
    drop = ec["transfer"]["drop"]
    return [
        Check("E_c's colour / content distance over FedAvg's body's", ratio,
              f"≤ {bounds.colour}", ratio <= bounds.colour),
        Check("E_c's cross-colour digit drop, points", drop, f"≤ {bounds.drop}",
              drop <= bounds.drop, ".1f"),
    ]  # fmt: skip


def holds(checks: Sequence[Check]) -> bool:
    """Every rule that applies holds (a rule that does not apply neither helps nor hurts)."""
    return all(c.ok is not False for c in checks)


def mechanism(default: bool, options: dict[str, bool]) -> str:
    """The mechanism's one-word verdict: ``works`` with the paper's objective as it stands,
    ``works only with <option>`` (every option under which it held), or ``not reproduced``."""
    if default:
        return "works"
    good = [name for name, ok in options.items() if ok]
    return f"works only with {' or '.join(good)}" if good else "not reproduced"
