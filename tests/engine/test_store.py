"""The client store: per-client state under a byte budget, spilled to disk beyond it, given back
exactly, written by checkpoints only where it changed, and changing no number of a run."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from fedshift.algorithms.fedavg import FedAvg
from fedshift.algorithms.registry import ALGORITHMS
from fedshift.config import validate_config
from fedshift.engine import store_writer
from fedshift.engine.metrics import TIMING_KEYS
from fedshift.engine.simulator import sample_clients
from fedshift.engine.store import INLINE_BYTES, ClientStore, compact, nbytes, write_ahead
from fedshift.run.experiment import run_experiment
from tests.conftest import tiny_config

N = INLINE_BYTES // 4 + 1000  # floats of a value just over the inline size
SIZE = N * 4


def big(i: int) -> dict:
    return {"w": torch.full((N,), float(i))}


def value_of(store_value) -> float:
    return float(store_value["w"][0])


def test_values_beyond_the_budget_are_spilled_and_read_back_exactly(tmp_path):
    store = ClientStore(budget=3 * SIZE, folder=tmp_path / "s")
    table = store.table("clients")
    for i in range(5):
        table[i] = big(i)
    assert len(table) == 5 and store.in_memory == 3 and store.resident_bytes == 3 * SIZE
    assert len(list((tmp_path / "s").glob("*.pt"))) == 2
    for i in (4, 0, 2, 1, 3):  # every value comes back as it was, whether in memory or not
        assert torch.equal(table[i]["w"], torch.full((N,), float(i)))
        assert store.resident_bytes <= 3 * SIZE
    assert table.get(99) is None and 3 in table and 99 not in table
    del table[1]
    assert 1 not in table and len(table) == 4
    assert store.peak_resident_bytes <= 4 * SIZE  # at most the one value being loaded over


def test_small_values_are_never_spilled(tmp_path):
    store = ClientStore(budget=0, folder=tmp_path / "s")
    table = store.table("clients")
    for i in range(50):
        table[i] = {"omega": torch.tensor([0.5, 0.5]), "cluster": i}
    assert store.in_memory == 50 and not (tmp_path / "s").exists()


def test_a_cyclic_pass_keeps_the_budget_resident(tmp_path):
    """Rounds visit clients in ascending order: evicting the value used last keeps `budget`
    worth of clients resident from pass to pass (least-recently-used would miss every one)."""
    store = ClientStore(budget=3 * SIZE, folder=tmp_path / "s")
    table = store.table("momentum")
    for i in range(6):
        table[i] = big(i)
    loaded = store.stats["loaded"]
    for i in range(6):  # one round: each client read, then updated
        table[i] = {"w": table[i]["w"] + 1}
    # 3 values stay resident from pass to pass and 3 are read back (the least recently used
    # would be evicted just before its turn: all 6 read back)
    assert store.stats["loaded"] - loaded == 3
    assert [value_of(table[i]) for i in range(6)] == [float(i + 1) for i in range(6)]


def test_views_are_stored_as_copies_of_their_own_size():
    stacked = torch.arange(12.0).reshape(4, 3)
    kept = compact({"row": stacked[1], "col": stacked[:, 0]})
    for t in kept.values():
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size()
    assert torch.equal(kept["row"], torch.tensor([3.0, 4.0, 5.0]))
    assert nbytes({"a": stacked, "b": stacked[0]}) == stacked.numel() * 4  # one storage, once


def test_checkpoints_write_what_changed_and_their_files_survive_until_collected(tmp_path):
    store = ClientStore(budget=2 * SIZE, folder=tmp_path / "s")
    table = store.table("momentum")
    for i in range(4):
        table[i] = big(i)
    store.table("clients")[0] = {"cluster": 7}
    first = store.commit()
    assert store.stats["committed"] == 2  # the 2 in memory; the 2 spilled were written then
    table[1] = big(100)  # one change...
    second = store.commit()
    assert store.stats["committed"] == 3  # ...one file
    restored = ClientStore.from_manifest(first, tmp_path / "s")  # resume from the first
    assert [value_of(restored.table("momentum")[i]) for i in range(4)] == [0.0, 1.0, 2.0, 3.0]
    assert restored.table("clients")[0] == {"cluster": 7}  # small values travel inline
    store.collect()  # after the second checkpoint the first's replaced file may go
    again = ClientStore.from_manifest(second, tmp_path / "s")
    assert [value_of(again.table("momentum")[i]) for i in range(4)] == [0.0, 100.0, 2.0, 3.0]
    assert len(list((tmp_path / "s").glob("*.pt"))) == 4


def test_a_client_has_at_most_its_checkpoints_file_and_its_current_one(tmp_path):
    store = ClientStore(budget=SIZE, folder=tmp_path / "s")
    table = store.table("momentum")
    for i in range(3):
        table[i] = big(i)
    store.commit()
    for _ in range(5):  # rounds without a checkpoint: every state changes and is spilled
        for i in range(3):
            table[i] = {"w": table[i]["w"] + 1}
    for i in range(3):
        assert len(list((tmp_path / "s").glob(f"momentum-{i}.*.pt"))) <= 2
    assert [value_of(table[i]) for i in range(3)] == [5.0, 6.0, 7.0]


def test_an_unbounded_store_keeps_everything_in_memory():
    store = ClientStore()
    table = store.table("clients")
    table[1] = big(1)
    assert dict(table) == {1: table[1]} and store.in_memory == 1
    nowhere = ClientStore(budget=0).table("x")
    nowhere[0] = big(0)  # the value being stored stays, even over the budget
    with pytest.raises(RuntimeError, match="no folder"):
        nowhere[1] = big(1)  # then the other has nowhere to go


# ------------------------------------------------------------------- the background writer

ROOMY = 16 * SIZE  # a budget whose write-ahead share (an eighth) holds two values


def test_a_roomy_store_writes_its_spills_in_the_background_and_gives_them_back_exactly(
    tmp_path, monkeypatch
):
    assert write_ahead(ROOMY, SIZE) == 2 * SIZE and write_ahead(3 * SIZE, SIZE) == 0
    synced: list[str] = []
    real_fsync = store_writer.fsync
    monkeypatch.setattr(store_writer, "fsync", lambda p: (synced.append(p.name), real_fsync(p)))
    store = ClientStore(budget=ROOMY, folder=tmp_path / "s")
    table = store.table("m")
    for i in range(40):
        table[i] = big(i)
        # what stays in memory leaves the write-ahead share free for the values being written,
        # and those never exceed it (a spill waits for the writer instead)
        assert store.resident_bytes <= ROOMY - 2 * SIZE
        assert store._writer.pending_bytes <= 2 * SIZE
    store.flush()
    assert len(list((tmp_path / "s").glob("*.pt"))) == store.stats["spilled"] == 40 - 14
    assert store.stats["bytes_written"] >= 26 * SIZE
    assert [value_of(table[i]) for i in range(40)] == [float(i) for i in range(40)]
    spilled = sorted(p.name for p in (tmp_path / "s").glob("*.pt"))
    assert sorted(synced) == spilled  # the writer flushed each of its files to disk
    manifest = store.commit()  # every file a checkpoint names is whole, and flushed once
    assert sorted(synced) == sorted(p.name for p in (tmp_path / "s").glob("*.pt"))
    assert len(synced) == len(set(synced)) == 40
    again = ClientStore.from_manifest(manifest, tmp_path / "s")
    assert [value_of(again.table("m")[i]) for i in range(40)] == [float(i) for i in range(40)]


def _slow_save(monkeypatch, release: threading.Event, fail: bool = False):
    real = torch.save

    def save(value, path, *a, **k):
        release.wait(10)
        if fail:
            raise OSError(28, "No space left on device")
        return real(value, path, *a, **k)

    monkeypatch.setattr("fedshift.engine.store_writer.torch.save", save)


def test_a_value_read_while_its_file_is_written_comes_back_once_written(tmp_path, monkeypatch):
    store = ClientStore(budget=ROOMY, folder=tmp_path / "s")
    table = store.table("m")
    for i in range(15):
        table[i] = big(i)
    release = threading.Event()
    _slow_save(monkeypatch, release)
    table[15] = big(15)  # spills the value used last (14) to the blocked writer...
    assert not list((tmp_path / "s").glob("m-14.*.pt"))  # ...and goes on before it is written
    threading.Timer(0.2, release.set).start()
    assert value_of(table[14]) == 14.0
    # it waited for the write: the file is there and whole (not read back to give the value)
    files = list((tmp_path / "s").glob("m-14.*.pt"))
    assert len(files) == 1 and value_of(torch.load(files[0], weights_only=True)) == 14.0


def test_a_failed_background_write_is_raised_by_the_next_call(tmp_path, monkeypatch):
    store = ClientStore(budget=ROOMY, folder=tmp_path / "s")
    table = store.table("m")
    release = threading.Event()
    release.set()
    _slow_save(monkeypatch, release, fail=True)
    for i in range(15):
        table[i] = big(i)
    with pytest.raises(OSError, match="writing a spilled client state failed.*No space left"):
        store.flush()
    assert not list((tmp_path / "s").glob("*.pt"))  # nothing half written is left


# ------------------------------------------------------------------- reading ahead


def _spilled_store(tmp_path, background: bool = True) -> tuple[ClientStore, object]:
    store = ClientStore(budget=ROOMY, folder=tmp_path / "s", background=background)
    table = store.table("m")
    for i in range(40):
        table[i] = big(i)
    store.flush()
    return store, table


def test_reading_back_in_order_reads_the_next_client_ahead(tmp_path):
    store, table = _spilled_store(tmp_path)
    assert [value_of(table[i]) for i in range(40)] == [float(i) for i in range(40)]
    loaded, ahead = store.stats["loaded"], store.stats["prefetched"]
    # every spilled client after the first of a run of them was read ahead (the reads evict
    # others, so the count depends on the order; at least most of them)
    assert loaded >= 20 and ahead >= loaded // 2, store.stats
    assert store.resident_bytes <= ROOMY


def test_without_the_background_thread_nothing_is_read_ahead(tmp_path):
    store, table = _spilled_store(tmp_path, background=False)
    assert [value_of(table[i]) for i in range(40)] == [float(i) for i in range(40)]
    assert store.stats["loaded"] >= 20 and store.stats["prefetched"] == 0


def test_a_value_replaced_or_deleted_while_read_ahead_is_never_given_back(tmp_path):
    store, table = _spilled_store(tmp_path)
    on_disk = [i for i in range(40) if store._entries[("m", i)].value is None]
    first, second, third = on_disk[0], on_disk[1], on_disk[2]
    assert [second, third] == [first + 1, first + 2]
    table[first]  # reads `second` ahead
    assert store._prefetch["m"][0] == ("m", second)
    table[second] = big(-1)  # replaced while read ahead, then spilled to a file of its own
    store._spill(("m", second))
    store.flush()
    assert store._entries[("m", second)].value is None
    assert value_of(table[second]) == -1.0 and store.stats["prefetched"] == 0
    assert store._prefetch["m"][0] == ("m", third)
    del table[third]  # deleted while read ahead
    assert "m" not in store._prefetch and third not in table


def test_a_client_passed_over_frees_its_read_ahead_for_the_next(tmp_path):
    """Rounds that sample clients skip some: the read ahead of a skipped client is dropped,
    so the table reads ahead again from the client read instead."""
    store, table = _spilled_store(tmp_path)
    on_disk = [i for i in range(40) if store._entries[("m", i)].value is None]
    a, b, c = on_disk[0], on_disk[1], on_disk[2]
    table[a]  # reads b ahead
    assert store._prefetch["m"][0] == ("m", b)
    assert value_of(table[c]) == float(c)  # b is skipped
    assert store._prefetch["m"][0] == ("m", c + 1)


def test_a_file_missing_under_a_read_ahead_is_reported_as_any_read(tmp_path):
    store, table = _spilled_store(tmp_path)
    on_disk = [i for i in range(40) if store._entries[("m", i)].value is None]
    nxt = on_disk[1]
    path = store._file(("m", nxt), store._entries[("m", nxt)].version)
    path.unlink()
    table[on_disk[0]]
    with pytest.raises(FileNotFoundError, match=f"client state file {path} is missing"):
        table[nxt]


# ----------------------------------------------------------------------------- in a run

strip = lambda h: [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in h]  # noqa: E731


def _over(algorithm: str) -> dict:
    return {
        "algorithm": {
            "name": algorithm,
            "params": {"num_clusters": 2} if algorithm == "fedrc" else {},
        },
        "model__width": 256,  # 0.3 MB of momentum per client and model: spilled as files
        "train__rounds": 4,
        "train__participation": 0.5,
        "train__keep_momentum": True,
    }


@pytest.mark.parametrize("algorithm", ["local", "fedrc"])
@pytest.mark.parametrize("executor", ["sequential", "batched"])
def test_spilling_changes_no_number_and_resumes_exactly(tmp_path, algorithm, executor):
    over = {**_over(algorithm), "executor": executor}
    plain = run_experiment(validate_config(tiny_config(tmp_path, name="plain", **over)))
    small = tiny_config(tmp_path, name="small", **over)
    small["clients_in_memory"] = 1  # at most one client's large state in memory
    bounded = run_experiment(validate_config(small))
    store = json.loads((tmp_path / "runs" / "small" / "summary.json").read_text())["client_store"]
    assert store["spilled"] > 0 and store["loaded"] > 0  # it did spill and read back
    assert strip(bounded.history) == strip(plain.history)
    part = {**small, "name": "part", "train": {**small["train"], "rounds": 2}}
    run_experiment(validate_config(part))  # stopped after 2 rounds, then resumed to 4
    part["train"]["rounds"] = 4
    resumed = run_experiment(validate_config(part), resume=True)
    assert strip(resumed.history) == strip(plain.history)


def test_a_checkpoint_writes_only_the_clients_that_trained(tmp_path):
    cfg = validate_config(tiny_config(tmp_path, output__checkpoint_every=1, **_over("local")))
    run_experiment(cfg)
    summary = json.loads((tmp_path / "runs" / "tiny" / "summary.json").read_text())
    trained = sum(len(sample_clients(6, 0.5, 0, r)) for r in range(1, 5))
    # each round's checkpoint writes the momentum and the model of the round's clients only
    # (Local's state is its model: 2 files a client), not the 6 clients' every time
    assert summary["client_store"]["committed"] == 2 * trained < 2 * 6 * 4


class _KilledMidRound(Exception):
    pass


class DiesInRound3(FedAvg):
    """FedAvg that dies in round 3 after two of its 6 clients were updated (their new momentum
    already spilled past the last checkpoint), as a kill in the middle of a round would."""

    name = "dies-in-round-3"
    armed, updates = False, 0

    def client_update(self, server, client, task, result):
        if DiesInRound3.armed:
            DiesInRound3.updates += 1
            if DiesInRound3.updates > 2 * 6 + 2:
                raise _KilledMidRound
        return super().client_update(server, client, task, result)


def test_killed_in_the_middle_of_a_round_resumes_exactly(tmp_path):
    over = {**_over("fedavg"), "algorithm": {"name": DiesInRound3.name}}
    over["train__participation"] = 1.0
    with ALGORITHMS.temporarily(DiesInRound3.name, DiesInRound3):
        DiesInRound3.armed = False
        full = run_experiment(validate_config(tiny_config(tmp_path, name="full", **over)))
        raw = tiny_config(tmp_path, name="part", **over)
        raw["clients_in_memory"] = 1
        DiesInRound3.armed, DiesInRound3.updates = True, 0
        with pytest.raises(_KilledMidRound):
            run_experiment(validate_config(raw))
        files = list((tmp_path / "runs" / "part" / "store").glob("*.pt"))
        assert files  # the checkpoint's files and those spilled after it
        DiesInRound3.armed = False
        resumed = run_experiment(validate_config(raw), resume=True)
    assert strip(resumed.history) == strip(full.history)
