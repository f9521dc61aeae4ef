"""Break DFL on purpose and see which tests fail: each mutation is a one-line change applied to
a copy of the tree (``src``, ``tests``, ``configs``) in a temporary folder; the DFL tests run on
the copy and the failing ones are printed. A mutation no test catches is a missing test.

    python scripts/mutate_dfl.py                 # every mutation
    python scripts/mutate_dfl.py Ic_sign all_noop
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DFL = "src/fedshift/algorithms/dfl.py"
TESTS = [
    "tests/algorithms/test_dfl.py",
    "tests/algorithms/test_dfl_mechanism.py",
    "tests/algorithms/test_adversary.py",
    "tests/algorithms/test_dfl_options.py",
    "tests/engine/test_training.py",
    "tests/models/test_models.py",
]
#: name -> (file, the line's text, its mutated text)
MUTATIONS = {
    "Ic_sign": (DFL, 'loss = loss - self.hp.beta_c * self._mi("critic_c"',
                'loss = loss + self.hp.beta_c * self._mi("critic_c"'),
    "Is_sign": (DFL, "loss = loss + self.hp.beta_s * term", "loss = loss - self.hp.beta_s * term"),
    "critic_s_descends": (DFL, 'return -self._mi("critic_s"', 'return self._mi("critic_s"'),
    "critic_c_descends": (DFL, 'return -self._mi("critic_c"', 'return self._mi("critic_c"'),
    "EcG_is_Ec": (DFL, 'zg = self._frozen(*extras["global_inv"], batch.x).detach()\n'
                  "            loss = loss - self.hp.beta_c",
                  "zg = zc.detach()\n            loss = loss - self.hp.beta_c"),
    "all_noop": (DFL, 'return entries if mode == "all" else _sub(entries, "inv")',
                 'return _sub(entries, "inv") if mode in ("invariant", "all") else _sub(entries, "inv")'),
    "global_eval_noop": (DFL, 'if self.hp.eval_invariant == "global" and', "if False and"),
    "pairhead_swap": ("src/fedshift/models/two_branch.py",
                      "h = self.first_a(a) + self.first_b(b)", "h = self.first_a(b) + self.first_b(a)"),
    "adam_no_bias_corr": ("src/fedshift/engine/training.py", "value=-(lr / (1 - b1**step))",
                          "value=-lr"),
    # issue 41: the refit read-out on the E_c after stage 2 (stale), the warm-up skipped
    "refit_post_stage2": (DFL, 'e_c = (_strip(task.params[0], "inv"), _strip(task.buffers[0], "inv"))',
                          'e_c = (_strip(p, "inv"), _strip(b, "inv"))'),
    "warmup_skipped_seq": ("src/fedshift/engine/executors/base.py",
                           "for w in range(adversary.adv.warmup_steps):", "for w in range(0):"),
    "warmup_skipped_batched": ("src/fedshift/engine/executors/stage.py",
                               "for w in range(adversary.adv.warmup_steps):", "for w in range(0):"),
    "warmup_batch0_batched": ("src/fedshift/engine/executors/stage.py",
                              "stage.batch_at(w % n.clamp_min(1), sched)", "stage.batch_at(0 * n, sched)"),
    "records_unmasked": ("src/fedshift/engine/executors/stage.py", "ch.records.add(values, act)",
                         "ch.records.add(values, torch.ones_like(act))"),
    "game_unshifted": (DFL, 'seen = est.detach() + (0.0 if self.hp.mi_estimator_s == "club" else LOG4)',
                       "seen = est.detach()"),
}  # fmt: skip


def mutate(name: str) -> list[str]:
    """The tests that fail with mutation ``name`` applied."""
    path, old, new = MUTATIONS[name]
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp)
        for d in ("src", "tests", "configs"):
            shutil.copytree(ROOT / d, copy / d, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(ROOT / "pyproject.toml", copy)
        text = (copy / path).read_text()
        if text.count(old) != 1:
            raise SystemExit(f"{name}: the line to mutate is not in {path} exactly once")
        (copy / path).write_text(text.replace(old, new))
        env = {**os.environ, "PYTHONPATH": f"{copy / 'src'}{os.pathsep}{copy}"}
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS],
            cwd=copy, env=env, capture_output=True, text=True,
        )  # fmt: skip
    return [
        line.split(" - ")[0][7:] for line in out.stdout.splitlines() if line.startswith("FAILED")
    ]


def main() -> None:
    names = sys.argv[1:] or list(MUTATIONS)
    for name in names:
        failed = mutate(name)
        print(f"{name}: {len(failed)} test(s) fail" + ("" if failed else "  <- NOT CAUGHT"))
        for test in failed:
            print(f"    {test}")


if __name__ == "__main__":
    main()
