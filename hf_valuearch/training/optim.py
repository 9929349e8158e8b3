"""The papers' optimizers: parameter groups by role, AdamW or Muon + AdamW, warmup / warmdown schedules.

Groups (every parameter lands in exactly one, `parameter_group`):

* matrices: the 2-D weights of the decoder layers (attention, MLP, KVM merge gate); Muon's group under "muon";
* embeddings, head: the input embedding and (untied) LM head (nanochat: embedding lr 0.3, unembedding 0.008);
* value_tables: BoV tables E_V at their own rate (BoV: AdamW, betas (0.8, 0.995), wd 0.01; spec_value_paths §1.2);
* scalars: gamma / alpha / beta and KVM temperatures, at the scalar rate without weight decay (BoV: scalar_lr 0.5);
* routing: AttnRes / RD-AttnRes pseudo-queries, without weight decay (spec_attnres §2 (f));
* gates: SATFormer's V1 gates W_alpha, without weight decay;
* norms: norm weights and biases, without weight decay.

A recipe (`OptimizerRecipe`, from a config's "training" section or the command line) gives per-group learning
rates, weight decays and betas; unset ones fall back to the run's `--learning_rate` / `--weight_decay` (0 for the
groups above that take none). The schedule is a multiplier of every group's rate: linear warmup, a constant
stretch, then a warmdown over the last `warmdown_fraction` of the steps to `final_lr_fraction`, linear (nanochat,
KVM) or cosine (ResFormer / SATFormer).

`TABLE_OPTIMIZERS` is the hook for the value tables' optimizer: name -> factory(groups) -> torch optimizer.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import torch
from torch import nn

from ..depth_routing import BlockAttnResReadout, BlockAttnResRouter

GROUPS = ("matrices", "embeddings", "head", "value_tables", "scalars", "routing", "gates", "norms")
NO_DECAY = {"scalars", "routing", "gates", "norms"}
OPTIMIZERS = ("adamw", "muon")
SCHEDULE_SHAPES = ("linear", "cosine")


def group_parameters(model: nn.Module) -> dict[str, list[tuple[str, nn.Parameter]]]:
    """{group: [(name, parameter), ...]} over the trainable parameters (tied ones once), groups in GROUPS order."""
    routing = {id(p) for module in model.modules() if isinstance(module, (BlockAttnResRouter, BlockAttnResReadout))
               for p in module.parameters()}
    # a tied head is the embedding: it trains with the embeddings
    special = {id(model.get_output_embeddings().weight): "head", id(model.get_input_embeddings().weight): "embeddings"}
    groups = {group: [] for group in GROUPS}
    for name, parameter in model.named_parameters():
        if not parameter.requires_grad:
            continue
        owner = name.rsplit(".", 2)[-2] if name.count(".") else ""  # the module holding it, e.g. "q_proj"
        if id(parameter) in special:
            group = special[id(parameter)]
        elif owner == "value_table":
            group = "value_tables"
        elif id(parameter) in routing:
            group = "routing"
        elif owner == "v1_gate":
            group = "gates"
        elif "norm" in owner:
            group = "norms"
        else:
            group = "matrices" if parameter.dim() >= 2 else "scalars"
        groups[group].append((name, parameter))
    return {group: members for group, members in groups.items() if members}


@dataclasses.dataclass
class OptimizerRecipe:
    """How to optimise: the optimizer, per-group hyperparameters (None: the run's defaults) and the schedule."""

    optimizer: str = "adamw"
    lr: dict[str, float] = dataclasses.field(default_factory=dict)
    weight_decay: dict[str, float] = dataclasses.field(default_factory=dict)
    betas: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    warmup_steps: int = 0
    warmdown_fraction: float = 1.0
    final_lr_fraction: float = 0.0
    schedule_shape: str = "linear"
    table_optimizer: str = "adamw"

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer={self.optimizer!r} is invalid: allowed values are {list(OPTIMIZERS)}")
        if self.schedule_shape not in SCHEDULE_SHAPES:
            raise ValueError(f"schedule_shape={self.schedule_shape!r} is invalid: allowed {list(SCHEDULE_SHAPES)}")
        if self.table_optimizer not in TABLE_OPTIMIZERS:
            raise ValueError(f"table_optimizer={self.table_optimizer!r} is invalid: allowed {sorted(TABLE_OPTIMIZERS)}")
        for field in ("lr", "weight_decay", "betas"):
            for group in getattr(self, field):
                if group not in GROUPS:
                    raise ValueError(f"{field} names group {group!r}; the groups are {list(GROUPS)}")
        if not (isinstance(self.warmup_steps, int) and self.warmup_steps >= 0):
            raise ValueError(f"warmup_steps={self.warmup_steps!r} is invalid: expected an integer >= 0")
        for field in ("warmdown_fraction", "final_lr_fraction"):
            value = getattr(self, field)
            if not (isinstance(value, (int, float)) and 0.0 <= value <= 1.0):
                raise ValueError(f"{field}={value!r} is invalid: expected a number in [0, 1]")

    def lr_multiplier(self, step: int, total_steps: int) -> float:
        """The schedule at `step` of `total_steps`: warmup, constant, warmdown to `final_lr_fraction`."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        warmdown_steps = round(self.warmdown_fraction * total_steps)
        progress = (step - (total_steps - warmdown_steps)) / max(warmdown_steps, 1)
        if progress <= 0:
            return 1.0
        progress = min(progress, 1.0)
        decay = 1 - progress if self.schedule_shape == "linear" else 0.5 * (1 + math.cos(math.pi * progress))
        return self.final_lr_fraction + (1 - self.final_lr_fraction) * decay


def adamw(groups: list[dict]) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups)


class LazyRowAdamW(torch.optim.Optimizer):
    """AdamW that updates only the rows of a [rows, dim] table whose gradient is non-zero: the rows of the batch's
    tokens (TensorFlow's LazyAdam, with decoupled weight decay). Rows of unseen tokens keep their value and their
    moments, where dense AdamW (the paper's) decays their moments and keeps moving them with the old momentum, and
    decays their weights; bias correction uses the global step. A row's update equals dense AdamW's whenever the
    row was seen at every step so far (tests/test_optim.py)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for table in group["params"]:
                if table.grad is None:
                    continue
                state = self.state[table]
                if not state:
                    state.update(step=0, exp_avg=torch.zeros_like(table), exp_avg_sq=torch.zeros_like(table))
                state["step"] += 1
                rows = table.grad.ne(0).any(dim=-1).nonzero().squeeze(-1)  # [n] rows of the batch's tokens
                grad = table.grad[rows]
                exp_avg = state["exp_avg"][rows].mul_(beta1).add_(grad, alpha=1 - beta1)
                exp_avg_sq = state["exp_avg_sq"][rows].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                state["exp_avg"][rows], state["exp_avg_sq"][rows] = exp_avg, exp_avg_sq
                step_size = group["lr"] / (1 - beta1 ** state["step"])
                denominator = (exp_avg_sq / (1 - beta2 ** state["step"])).sqrt_().add_(group["eps"])
                updated = table[rows].mul_(1 - group["lr"] * group["weight_decay"])
                table[rows] = updated.addcdiv_(exp_avg, denominator, value=-step_size)


# The value tables' optimizer, by name: factory(param groups) -> optimizer. "lazy_adamw" updates only the rows of
# the batch's tokens (`LazyRowAdamW`); the papers' default is dense "adamw".
TABLE_OPTIMIZERS: dict[str, Callable[[list[dict]], torch.optim.Optimizer]] = {"adamw": adamw,
                                                                               "lazy_adamw": LazyRowAdamW}


class CombinedOptimizer(torch.optim.Optimizer):
    """Several optimizers stepped as one (Muon for the matrices, AdamW for the rest): `param_groups` is all of
    theirs, so one LR scheduler drives every group, and the state dict holds each optimizer's."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers
        self.defaults = {}
        self.state = {}  # per-parameter state lives in the member optimizers
        self._optimizer_step_pre_hooks, self._optimizer_step_post_hooks = {}, {}

    @property
    def param_groups(self):
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    def step(self, closure=None):
        for optimizer in self.optimizers:
            optimizer.step()

    def zero_grad(self, set_to_none: bool = True):
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return {"optimizers": [optimizer.state_dict() for optimizer in self.optimizers]}

    def load_state_dict(self, state_dict):
        for optimizer, state in zip(self.optimizers, state_dict["optimizers"]):
            optimizer.load_state_dict(state)


def build_optimizer(model: nn.Module, recipe: OptimizerRecipe, learning_rate: float, weight_decay: float):
    """The optimizer of `model` under `recipe`, and a printable table of its groups."""
    by_optimizer: dict[str, list[dict]] = {}
    rows = []
    for group, members in group_parameters(model).items():
        lr = recipe.lr.get(group, learning_rate)
        decay = recipe.weight_decay.get(group, 0.0 if group in NO_DECAY else weight_decay)
        settings = {"params": [p for _, p in members], "lr": lr, "weight_decay": decay, "group": group}
        if recipe.optimizer == "muon" and group == "matrices":
            kind = "muon"
        else:
            kind = "table" if group == "value_tables" else "adamw"
            settings["betas"] = tuple(recipe.betas.get(group, (0.9, 0.999)))
        by_optimizer.setdefault(kind, []).append(settings)
        rows.append((group, kind if kind != "table" else recipe.table_optimizer, len(members),
                     sum(p.numel() for _, p in members), lr, decay))
    optimizers = []
    if "muon" in by_optimizer:
        optimizers.append(torch.optim.Muon(by_optimizer["muon"]))
    if "adamw" in by_optimizer:
        optimizers.append(adamw(by_optimizer["adamw"]))
    if "table" in by_optimizer:
        optimizers.append(TABLE_OPTIMIZERS[recipe.table_optimizer](by_optimizer["table"]))
    optimizer = optimizers[0] if len(optimizers) == 1 else CombinedOptimizer(optimizers)
    return optimizer, format_groups(rows)


def format_groups(rows) -> str:
    lines = [f"{'group':<13}{'optimizer':<11}{'tensors':>8}{'parameters':>13}{'lr':>11}{'wd':>8}"]
    lines += [f"{group:<13}{kind:<11}{count:>8}{numel:>13,}{lr:>11.4g}{decay:>8.3g}"
              for group, kind, count, numel, lr, decay in rows]
    return "\n".join(lines)
