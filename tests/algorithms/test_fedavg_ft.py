"""FedAvg + FT: FedAvg's training, clients scored after fine-tuning the global model on their
own data (the locally scored baseline of personalised methods)."""

import torch

from fedshift.algorithms.base import RoundContext
from fedshift.config import validate_config
from fedshift.data.scenario import build_scenario
from fedshift.engine.evaluation import client_data
from fedshift.run.experiment import make_algorithm, run_experiment
from tests.conftest import tiny_config


def _cfg(tmp_path, name, **params):
    return validate_config(
        tiny_config(
            tmp_path,
            name=name,
            algorithm={"name": name, "params": params},
            scenario={
                "dataset": "synthetic",
                "dataset_options": {"n_train": 1200, "n_test": 400, "dim": 16, "num_classes": 4},
                "num_clients": 6,
                "label_shift": {"kind": "pathological", "classes_per_client": 1},
            },
            train={"rounds": 2, "batch_size": 32, "lr": 0.05},
        )
    )


def test_the_fine_tuning_task_starts_from_the_global_model(tmp_path):
    cfg = _cfg(tmp_path, "fedavg-ft", ft_steps=7)
    data = build_scenario(cfg.scenario, cfg.seed)
    algo = make_algorithm(cfg, data, torch.device("cpu"))
    server = algo.init_server_state([algo.ops.init(0)])
    task = algo.fine_tune_task(server, {}, client_data(data, data.clients[0]))
    assert task.params[0] is server["params"] and task.phases[0].steps == 7
    # training is FedAvg's
    view = client_data(data, data.clients[0])
    assert algo.client_task(server, {}, view, RoundContext(1)).params[0] is server["params"]


def test_clients_scored_after_fine_tuning_beat_the_global_model_under_label_skew(tmp_path):
    """One class per client: a few local steps make the global model predict that class."""
    plain = run_experiment(_cfg(tmp_path, "fedavg")).history[-1]
    tuned = run_experiment(_cfg(tmp_path, "fedavg-ft", ft_steps=10)).history[-1]
    assert tuned["local_loss"] == plain["local_loss"]  # the same training
    assert tuned["local_acc"] > plain["local_acc"] + 20
