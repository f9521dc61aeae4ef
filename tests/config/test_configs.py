"""Every shipped config validates, and its feature styles and label maps are known names."""

import os
from pathlib import Path

import numpy as np
import pytest

from fedshift.algorithms import get_algorithm
from fedshift.config import load_config
from fedshift.data.concepts import make_concept, make_label_map
from fedshift.data.features import corruption_names, expand_styles, parse_style
from fedshift.data.sources import load_dataset
from fedshift.models import model_names

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").rglob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(p.parents[2])))
def test_config_is_valid(path):
    cfg = load_config(path)
    get_algorithm(cfg.algorithm.name).parse_params(cfg.algorithm.params)
    assert cfg.model.name in [*model_names(), "auto"]
    for s in expand_styles(cfg.scenario.feature_shift.styles):  # pools and "all" expanded
        style = parse_style(s)  # an unknown name raises
        if style.kind == "corruption":
            assert style.name in corruption_names() and 0 <= style.severity <= 5, s
        else:
            assert style.kind in ("clean", "rotate", "color"), s
    # a generated stream (SEA, SINE, Circle) offers its own concepts: resolved against it (it
    # builds in milliseconds); every other dataset's concepts are label maps
    raw = None
    if cfg.scenario.dataset in ("sea", "sine", "circle"):
        raw = load_dataset(cfg.scenario.dataset, download=False, **cfg.scenario.dataset_options)
    for spec in cfg.scenario.concepts:
        if raw is None:
            make_label_map(spec, 10, np.random.default_rng(0))
        else:
            make_concept(spec, raw.num_classes, np.random.default_rng(0), raw)


def test_every_config_file_is_checked():
    """The parametrisation holds every YAML file under configs/ (listed here another way),
    the quick start and each paper's folder among them."""
    root = ROOT / "configs"
    walked = sorted(
        Path(folder, name)
        for folder, _, names in os.walk(root)
        for name in names
        if name.endswith(".yaml")
    )
    assert walked == CONFIGS
    folders = {str(p.parent.relative_to(root)) for p in CONFIGS}
    papers = {"papers/dfl", "papers/feddaa", "papers/fednh", "papers/fedrc"}
    assert {".", "examples", *papers} <= folders
    assert root / "quickstart.yaml" in CONFIGS
