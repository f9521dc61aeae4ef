"""The evaluation's logits read again by the next round's client tasks (ModelOps.keep): read
only for the same model unchanged, over indices the pass holds; the values those of the
model; and a clustered run reads them instead of computing its E-step pass again."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fedshift.algorithms.ops import ModelOps
from fedshift.config import validate_config
from fedshift.engine import evaluation, simulator
from fedshift.run.experiment import run_experiment
from tests.conftest import tiny_config


def _ops() -> tuple[ModelOps, dict, dict]:
    ops = ModelOps(lambda: nn.Sequential(nn.Linear(4, 3)), torch.device("cpu"))
    p, b = ops.init(0)
    return ops, p, b


POOL = torch.randn(12, 4, generator=torch.Generator().manual_seed(0))


def inputs(idx: torch.Tensor) -> torch.Tensor:
    return POOL[idx]


def test_a_kept_pass_answers_the_same_model_over_its_indices():
    ops, p, b = _ops()
    idx = torch.tensor([7, 2, 9, 4])
    marked = torch.arange(12.0).view(4, 3)  # not the model's logits: a read is told apart
    ops.keep(p, b, inputs, idx, marked)
    got = ops.logits(p, b, inputs, torch.tensor([9, 7]))
    assert torch.equal(got, marked[[2, 0]]) and ops.kept_reads == 1
    real = ops._logits(p, b, inputs, torch.tensor([9, 3]), 1024)
    assert torch.equal(ops.logits(p, b, inputs, torch.tensor([9, 3])), real), "3 was not kept"
    assert not torch.equal(ops.logits(p, b, lambda i: POOL[i] + 1, idx), marked[:1])
    p2, b2 = ops.init(0)  # equal values, other objects: another model as far as keeping goes
    assert torch.equal(ops.logits(p2, b2, inputs, idx), ops._logits(p2, b2, inputs, idx, 1024))
    assert ops.kept_reads == 1


def test_a_model_changed_since_is_computed_again():
    ops, p, b = _ops()
    idx = torch.tensor([1, 5])
    ops.keep(p, b, inputs, idx, torch.zeros(2, 3))
    next(iter(p.values())).add_(1.0)  # in place: the pass is stale
    assert not torch.equal(ops.logits(p, b, inputs, idx), torch.zeros(2, 3))
    ops.keep(p, b, inputs, idx, torch.zeros(2, 3))
    key = next(iter(p))
    p[key] = p[key] + 1.0  # a tensor replaced in the dict
    assert not torch.equal(ops.logits(p, b, inputs, idx), torch.zeros(2, 3))
    ops.keep(p, b, inputs, idx, torch.zeros(2, 3))
    ops.forget()
    assert not torch.equal(ops.logits(p, b, inputs, idx), torch.zeros(2, 3))
    assert ops.kept_reads == 0


def test_read_rows_equal_the_recomputed_ones():
    """Rows out of one pass over all indices against each client's own pass: the same model
    and rows, in other batches; equal to float32 rounding (a kernel may block by batch
    size), bit for bit where it does not."""
    ops, p, b = _ops()
    idx = torch.arange(12)
    ops.keep(p, b, inputs, idx, ops._logits(p, b, inputs, idx, 5))
    for part in (torch.tensor([3, 4, 5]), torch.tensor([11, 0])):
        torch.testing.assert_close(
            ops.logits(p, b, inputs, part), ops._logits(p, b, inputs, part, 1024), rtol=1e-5,
            atol=1e-6,
        )  # fmt: skip


@pytest.mark.parametrize("every", [1, 2])
def test_every_task_reads_a_pass_of_the_round(tmp_path, monkeypatch, every):
    """FedRC with K = 2 on 6 clients for 3 rounds: every client's E-step reads both models'
    logits from a pass of the round (the last evaluation's, else the one the engine runs for
    the round's tasks): 3 x 6 x 2 reads, and a pass run only where no evaluation kept one."""
    made, passes = [], []
    init, real_pass = ModelOps.__init__, evaluation.task_logits

    def capture(self, *a, **k):
        init(self, *a, **k)
        made.append(self)

    def counted(*a, **k):
        passes.append(real_pass(*a, **k))
        return passes[-1]

    monkeypatch.setattr(ModelOps, "__init__", capture)
    monkeypatch.setattr(simulator, "task_logits", counted)
    raw = tiny_config(tmp_path, algorithm__name="fedrc", train__rounds=3, eval__every=every)
    raw["algorithm"]["params"] = {"num_clusters": 2}
    run_experiment(validate_config(raw))
    assert sum(ops.kept_reads for ops in made) == 3 * 6 * 2
    # a pass where no evaluation precedes the round: round 1; with every 2, round 2 too
    assert passes == ([2, 0, 0] if every == 1 else [2, 2, 0]), passes
