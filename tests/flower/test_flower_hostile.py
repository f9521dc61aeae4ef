"""A deployment's server trusts no reply: one node of four rewrites its replies after the real
client code made them; each bad reply is dropped for its round with one warning naming the
node, the client and what was wrong, and the run goes on with the others."""

from __future__ import annotations

import logging

import pytest
import torch

from tests.conftest import require_extra, tiny_config

require_extra("flwr", "flower")

from flwr.app import ConfigRecord  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedshift.config import validate_config  # noqa: E402
from fedshift.core.errors import FedshiftError  # noqa: E402
from fedshift.data.client_folders import export_clients  # noqa: E402
from fedshift.data.scenario import build_scenario  # noqa: E402
from fedshift.flower.client_app import app  # noqa: E402
from fedshift.flower.codec import META, decode_result, encode_result, from_bytes, to_bytes  # noqa: E402
from fedshift.flower.deploy.server_run import serve_deployed  # noqa: E402
from fedshift.flower.experiment import ServerRun  # noqa: E402
from tests.flower.flower_local import InProcessNodes  # noqa: E402

SKEW = {"scenario__label_shift": {"kind": "dirichlet", "alpha": 0.5}, "scenario__num_clients": 4}
BAD = 4  # the tampering node (it holds client 3)


@pytest.fixture
def task_identity():
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    yield
    TaskIdentity._run_id = TaskIdentity._node_id = TaskIdentity._task_id = None


class Tampering(InProcessNodes):
    """Node ``BAD``'s replies of message type ``kind`` rewritten by ``edit`` (in place)."""

    def __init__(self, folders, kind, edit):
        super().__init__(app, {n: {"data": str(f)} for n, f in folders.items()})
        self.kind, self.edit = kind, edit

    def pull_messages(self, message_ids):
        out = super().pull_messages(message_ids)
        for m, reply in self.replies[len(self.replies) - len(out) :]:  # out's, in order
            kind = m.metadata.message_type
            if reply.metadata.src_node_id == BAD and not reply.has_error() and kind == self.kind:
                self.edit(reply.content)
        return out


def _replace(content, new):
    for k in list(content.keys()):
        del content[k]
    for k, v in new.items():
        content[k] = v


def train_edit(change):
    def edit(content):
        index, result = decode_result(content)
        _replace(content, encode_result(change(result), index))

    return edit


def rows_edit(change):
    def edit(content):
        meta = content.config_records[META]
        rows = change(from_bytes(meta["rows"]))
        content[META] = ConfigRecord({**dict(meta), "rows": to_bytes(rows)})

    return edit


def _run(tmp_path, kind=None, edit=None, **over):
    cfg = validate_config(tiny_config(tmp_path, **{**SKEW, **over}))
    data = build_scenario(cfg.scenario, cfg.seed, None)
    export_clients(data, tmp_path / "clients")
    folders = {n: tmp_path / "clients" / f"client_{n - 1}" for n in (1, 2, 3, 4)}
    grid = Tampering(folders, kind, edit or (lambda c: None))
    run = ServerRun(cfg, run_dir=str(tmp_path / f"dep-{kind}"))
    return serve_deployed(grid, run, wait_s=5, resend_s=60).history


@pytest.fixture(scope="module")
def honest(tmp_path_factory):
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    try:
        return _run(tmp_path_factory.mktemp("honest"))[-1]["local_acc"]
    finally:
        TaskIdentity._run_id = TaskIdentity._node_id = TaskIdentity._task_id = None


def _scale(r):
    r.params = [{k: v * 1e4 for k, v in m.items()} for m in r.params]
    return r


def _samples(r):
    r.num_samples = 10**9
    return r


def _shape(r):
    name = next(iter(r.params[0]))
    r.params[0][name] = torch.zeros(3, 3)
    return r


def _extra(r):
    r.params[0]["backdoor"] = torch.zeros(2)
    return r


def _other(r):
    r.cid = 0  # node 1's client
    return r


def _nan(r):
    name = next(iter(r.params[0]))
    r.params[0][name] = r.params[0][name] * float("nan")
    return r


CASES = {
    "scaled": (_scale, "norm"),
    "num_samples": (_samples, "num_samples=1000000000, the client declared"),
    "shape": (_shape, "the server sent"),
    "extra_name": (_extra, "'backdoor', a tensor the server did not send"),
    "other_client": (_other, "it answers for client 0"),
    "nan": (_nan, "non-finite"),
}


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_training_reply_is_dropped_and_the_run_goes_on(tmp_path, caplog, honest, case):
    change, why = CASES[case]
    with caplog.at_level(logging.WARNING, logger="flwr"):
        history = _run(tmp_path, "train", train_edit(change))
    dropped = [r.getMessage() for r in caplog.records if "reply dropped" in r.getMessage()]
    assert len(dropped) == 3  # one a round
    assert all(f"node {BAD}, client 3: reply dropped: " in m and why in m for m in dropped)
    print(case, history[-1]["local_acc"], "honest", honest, dropped[0])
    assert abs(history[-1]["local_acc"] - honest) < 10  # percent


@pytest.mark.usefixtures("task_identity")
def test_a_reply_without_its_model_is_dropped_without_a_traceback(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="flwr"):
        history = _run(tmp_path, "train", lambda content: content.pop("params.0"))
    dropped = [r.getMessage() for r in caplog.records if "reply dropped" in r.getMessage()]
    assert len(dropped) == 3 and "cannot be read (KeyError" in dropped[0]
    assert len(history) == 3


@pytest.mark.usefixtures("task_identity")
@pytest.mark.parametrize(
    "change, why",
    [
        (lambda rows: [{**r, "test_correct": 10 * r["num_test"]} for r in rows], "test_correct"),
        (lambda rows: [{**r, "num_test": 10**6, "test_correct": 10**6} for r in rows], "num_test"),
        (lambda rows: rows + [{**rows[0], "cid": 0}], "rows for clients [3, 0]"),
        (lambda rows: [{**r, "cid": 0} for r in rows], "rows for clients [0]"),
    ],
)
def test_evaluation_counts_out_of_range_or_for_other_clients_are_dropped(
    tmp_path, caplog, change, why
):
    with caplog.at_level(logging.WARNING, logger="flwr"):
        history = _run(tmp_path, "evaluate", rows_edit(change))
    dropped = [r.getMessage() for r in caplog.records if "reply dropped" in r.getMessage()]
    assert len(dropped) == 3  # one per evaluation round
    assert f"node {BAD}, evaluation of clients 3: reply dropped" in dropped[0] and why in dropped[0]
    # node 4's scores are left out, as when its whole reply is unreadable: the same pooled scores
    reference = _run(tmp_path / "ref", "evaluate", lambda content: content.pop(META))
    keys = ("local_acc", "train_acc", "local_acc_client_mean")
    assert [[h.get(k) for k in keys] for h in history] == [
        [h.get(k) for k in keys] for h in reference
    ]
    assert all(0 <= h["local_acc"] <= 100 for h in history)


@pytest.mark.usefixtures("task_identity")
def test_more_dropped_replies_than_the_config_allows_stop_the_run(tmp_path):
    with pytest.raises(FedshiftError, match=r"3 replies dropped, more than flower\.max_dropped"):
        _run(tmp_path, "train", train_edit(_samples), flower__max_dropped_replies=2)


@pytest.mark.usefixtures("task_identity")
def test_a_node_replying_nan_is_named_and_nothing_blames_the_learning_rate(
    tmp_path, caplog, capsys, honest
):
    """NaN parameters from one node are that node's fault, not ``train.lr``'s: its reply is
    dropped each round with a line naming the node, the run ends with the scores of a run whose
    node-4 reply is unreadable (the honest nodes' accuracy), and no message or file of the run
    says to lower train.lr."""
    with caplog.at_level(logging.INFO):
        history = _run(tmp_path, "train", train_edit(_nan))
    messages = [r.getMessage() for r in caplog.records]
    dropped = [m for m in messages if "reply dropped" in m]
    assert len(dropped) == 3, messages
    assert all(f"node {BAD}, client 3: reply dropped: model 0[" in m for m in dropped), dropped
    assert all(m.endswith("holds non-finite values") for m in dropped), dropped
    unreadable = _run(tmp_path / "ref", "train", lambda content: content.pop("params.0"))
    assert [h["local_acc"] for h in history] == [h["local_acc"] for h in unreadable]
    assert abs(history[-1]["local_acc"] - honest) < 10  # percent
    printed = capsys.readouterr()
    files = [p.read_text(errors="replace") for p in (tmp_path / "dep-train").rglob("*.*")
             if p.is_file() and p.suffix in (".json", ".jsonl", ".md", ".txt", ".log")]  # fmt: skip
    assert files
    for text in [*messages, printed.out, printed.err, *files]:
        assert "train.lr" not in text and "diverged" not in text, text[:500]


def _flip(r):
    r.params = [{k: -30.0 * v for k, v in m.items()} for m in r.params]  # within the norm check
    return r


@pytest.mark.usefixtures("task_identity")
def test_norm_bounded_aggregation_holds_a_reply_the_checks_let_through(tmp_path, caplog, honest):
    """A reply of -30 times the model passes the reply checks (its norm is within
    flower.max_norm_ratio) and drags the average away; with ``train.clip_updates`` each update
    is clipped against the nearest model the server sent, and the run keeps the honest
    accuracy."""
    bare = _run(tmp_path / "bare", "train", train_edit(_flip))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        clipped = _run(tmp_path / "clip", "train", train_edit(_flip), train__clip_updates="median")
    assert not [r for r in caplog.records if "reply dropped" in r.getMessage()]  # taken, clipped
    print("honest", honest, "flipped", bare[-1]["local_acc"], "clipped", clipped[-1]["local_acc"])
    assert bare[-1]["local_acc"] < honest - 15
    assert abs(clipped[-1]["local_acc"] - honest) < 10
