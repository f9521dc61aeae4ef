"""DFL's hyper-parameters (:class:`DFLParams`); the method is :mod:`fedshift.algorithms.dfl`.
Each option the paper leaves open is a field whose description says which reading it is."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from fedshift.algorithms.base import HyperParams


class DFLParams(HyperParams):
    lam: float = Field(default=1.0, ge=0, description="weight λ of diversity transferring")
    beta_s: float = Field(default=1.0, ge=0, description="weight of Î(E_s; E_c), minimised")
    beta_c: float = Field(default=1.0, ge=0, description="weight of Î(E_c; E_c^G), maximised")
    diversity: bool = Field(default=True, description="diversity transferring (False: ablation)")
    aggregation: Literal["invariant", "all", "none"] = Field(
        default="invariant",
        description="what the server averages: E_c, the whole model, or nothing (clients "
        "only exchange E_s for diversity transferring)",
    )
    weighting: Literal["samples", "uniform"] = Field(
        default="samples", description="client weights of the average (Eq. 6, or Alg. 2)"
    )
    dt_num_donors: int | None = Field(
        default=None, ge=1, description="donors per client (None: every other sampled client)"
    )
    specific_steps: int | None = Field(
        default=None, ge=1, description="stage 1 steps (None: the run's local steps/epochs)"
    )
    invariant_steps: int | None = Field(
        default=None, ge=1, description="stage 2 steps (None: the run's local steps/epochs)"
    )
    lr_s: float | None = Field(default=None, gt=0, description="stage 1 lr η_s (None: run lr)")
    lr_c: float | None = Field(default=None, gt=0, description="stage 2 lr η_c (None: run lr)")
    classifier_in_stage2: bool = Field(default=False, description="also train P in stage 2")
    is_in_stage2: bool = Field(default=False, description="add β_s·Î(E_s; E_c) to stage 2")
    eval_invariant: Literal["local", "global"] = Field(
        default="local", description="which E_c scores a client: its own or the global one"
    )
    mi_minimisation: Literal["minimax", "confusion"] = Field(
        default="minimax",
        description="how E_s minimises Î(E_s; E_c) against its critic: minimax = descend Î "
        "itself (the paper's min-max game); confusion = drive the critic's scores to 'cannot "
        "tell joint from shuffled pairs' (bounded, not the paper's; see the module docstring; "
        "JSD critics only)",
    )
    critic_normalise: bool = Field(
        default=True,
        description="scale-free critic inputs: each feature vector to unit L2 norm (separable) "
        "or standardised to zero mean, unit variance (concat, club); without it the critic's "
        "scores grow with the features and the min-max game diverged (not in the paper)",
    )
    critic_lr: float = Field(default=1e-3, gt=0, description="the critics' own Adam lr")
    critic_steps: int = Field(
        default=1,
        ge=1,
        description="critic steps on each mini-batch, before the encoders' step (after the "
        "stage's critic_warmup_steps)",
    )
    critic_optimizer: Literal["adam", "sgd"] = Field(
        default="adam", description="the critics' own optimiser (state fresh every stage)"
    )
    mi_probe_samples: int = Field(
        default=256,
        ge=2,
        description="train samples each client estimates Î_s, Î_c on after "
        "training (logged as mi_s, mi_c); mi_s_refit reads min(this, half the client's train "
        "samples) and fits on the rest",
    )
    critic_hidden: int = Field(default=512, ge=1, description="critic hidden width")
    critic_out: int = Field(default=128, ge=1, description="critic embedding size")
    critic_warmup_steps: int = Field(
        default=0,
        ge=0,
        description="critic-only steps at the start of every stage, before the encoders move "
        "(cycling over the stage's mini-batches): a faithful reading of Alg. 2's inner max at "
        "the stage's new E_c (0: none, the literal alternation)",
    )
    critic_kind: Literal["separable", "concat"] = Field(
        default="separable",
        description="the JSD critics' family (T_c always, T_s with mi_estimator_s jsd): "
        "separable <g(a), h(b)> or concat, an MLP on [a; b] scoring every pair of the batch "
        "(the paper gives no shape: both are readings)",
    )
    mi_estimator_s: Literal["jsd", "club"] = Field(
        default="jsd",
        description="the estimate of the minimised Î(E_s; E_c): jsd (Deep InfoMax, the "
        "paper's) or club (CLUB's variational upper bound, Cheng et al. 2020: NOT in the "
        "paper; its net q(E_c | E_s) is T_s, trained by log-likelihood; needs mi_minimisation "
        "minimax)",
    )
    mi_refit_steps: int = Field(
        default=0,
        ge=0,
        description="Adam steps (lr critic_lr) of the refitted critic logged as mi_s_refit, "
        "from T_s's final weights on the final stage-1 features (0, the default: no refit, "
        "no mi_s_refit; e.g. 200 for a measurement run: about 3 s a client and round on one "
        "CPU core with 1024-d features, as much as the client's training)",
    )
    mi_refit_batch: int = Field(
        default=64, ge=2, description="the refitted critic's batch size (see mi_refit_steps)"
    )

    @field_validator("mi_estimator_s")
    @classmethod
    def _club_is_minimax(cls, v: str, info: ValidationInfo) -> str:
        if v == "club" and info.data.get("mi_minimisation") == "confusion":
            raise ValueError(
                "club is minimised by E_s directly (minimax); confusion is defined on a JSD "
                "critic's scores: set mi_minimisation to minimax or mi_estimator_s to jsd"
            )
        return v
