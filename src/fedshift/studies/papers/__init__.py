"""The reference papers' tables: which runs make a table, and the numbers the paper prints.

Each entry names the configs and algorithm variants of a table, so ``fedshift reproduce`` can
run them and print our numbers beside the paper's. Numbers are copied from the papers (see
the specs); "±" spreads are kept as printed.

Where the authors' code behaves differently from what the paper says (or where the paper is
silent and the code decides), a table lists the code's behaviour as a *profile*:
``code_params`` (algorithm hyper-parameters, given to every row whose algorithm has them) and
``code_overrides`` (config overrides of given rows). ``reproduce --follow code`` applies them,
``--follow paper`` leaves the paper's reading, ``--follow both`` runs each row both ways; each
table says which is its default (``default_follow``: the code's where the printed numbers come
from that code, the paper's for FedDAA, whose code is told the true number of concepts); the
report prints, per row, which options it ran with, and a code-profile row's name says what the
profile changes (``code_suffix``, ``code_labels``).
"""

from __future__ import annotations

from fedshift.studies.papers.baselines import BASELINES
from fedshift.studies.papers.dfl import DFL_TABLE1, DFL_TABLE2
from fedshift.studies.papers.drift_bench import DRIFT_BENCH
from fedshift.studies.papers.drift_streams import DRIFT_STREAMS
from fedshift.studies.papers.feddaa import (
    FEDDAA_TABLE1,
    FEDDAA_TABLE2,
    FEDDAA_TABLE3,
    FEDDAA_TABLE4,
    FEDDAA_TABLE5,
)
from fedshift.studies.papers.fednh import FEDNH_TABLE1, FEDNH_TABLE2, FEDNH_TABLE3
from fedshift.studies.papers.fedrc import (
    FEDRC_TABLE1,
    FEDRC_TABLE7,
    FEDRC_TABLE8,
    FEDRC_TABLE9,
    FEDRC_TABLE10,
    FEDRC_TABLE11,
    FEDRC_TABLE12,
    FEDRC_TABLE13,
    FEDRC_TABLE14,
    FEDRC_TABLE15,
)
from fedshift.studies.papers.table import PaperTable, Variant

TABLES = {
    t.key: t
    for t in (
        FEDRC_TABLE1,
        FEDRC_TABLE7,
        FEDRC_TABLE8,
        FEDRC_TABLE9,
        FEDRC_TABLE10,
        FEDRC_TABLE11,
        FEDRC_TABLE12,
        FEDRC_TABLE13,
        FEDRC_TABLE14,
        FEDRC_TABLE15,
        FEDNH_TABLE1,
        FEDNH_TABLE2,
        FEDNH_TABLE3,
        FEDDAA_TABLE1,
        FEDDAA_TABLE2,
        FEDDAA_TABLE3,
        FEDDAA_TABLE4,
        FEDDAA_TABLE5,
        DFL_TABLE1,
        DFL_TABLE2,
        BASELINES,
        DRIFT_BENCH,
        DRIFT_STREAMS,
    )
}

__all__ = ["TABLES", "PaperTable", "Variant"]
