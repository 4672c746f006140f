"""LAMB, the optimizer sahajBERT trained with, and its learning-rate schedule.

No maintained LAMB ships with the packages the agent depends on (``torch_optimizer`` and apex
are not among them), so this is a small implementation with ``torch_optimizer.Lamb``'s
semantics (``debias=True``), the variant the hivemind ALBERT example used.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from transformers import get_linear_schedule_with_warmup

NO_DECAY_NAMES = ("bias", "LayerNorm.weight")


class Lamb(torch.optim.Optimizer):
    """Layer-wise Adaptive Moments for large batches (You et al., 2019, arXiv:1904.00962).

    Each tensor takes an Adam step (with decoupled weight decay added to it) rescaled by the
    trust ratio ``min(||w||, clamp_value) / ||adam step||`` (1 where either norm is zero).
    With ``debias`` the learning rate is multiplied by ``sqrt(1 - beta2^t) / (1 - beta1^t)``.

    Optimizer state is created up front rather than on the first step, so that
    ``hivemind.Optimizer`` can share it with newcomers from the start without running the
    "virtual" zero-gradient step it otherwise uses to create it (which would decay the weights).
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.0, clamp_value: float = 10.0, debias: bool = True):
        if lr < 0 or eps < 0 or weight_decay < 0 or clamp_value <= 0:
            raise ValueError("lr, eps and weight_decay must be non-negative and clamp_value positive")
        if not all(0.0 <= beta < 1.0 for beta in betas):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        clamp_value=clamp_value, debias=debias)
        super().__init__(params, defaults)
        for group in self.param_groups:
            for param in group["params"]:
                self.state[param] = dict(
                    step=torch.zeros((), dtype=torch.float32),
                    exp_avg=torch.zeros_like(param, memory_format=torch.preserve_format),
                    exp_avg_sq=torch.zeros_like(param, memory_format=torch.preserve_format),
                )

    def load_state_dict(self, state_dict: dict) -> None:
        """Load ``state_dict`` into the state tensors this optimizer already has, not new ones.

        With an offloaded optimizer hivemind's state averager averages the very tensors of the state it
        was built with (``reuse_tensors``), and every state download and checkpoint resume loads through
        here: torch's own ``load_state_dict`` puts new tensors in their place, and the averager would go on
        averaging the old ones, which the optimizer no longer reads (peer_agent/training.py,
        AVERAGED_OPTIMIZER_STATISTICS)."""
        kept = {param: dict(state) for param, state in self.state.items()}
        super().load_state_dict(state_dict)
        with torch.no_grad():
            for param, state in self.state.items():
                for key, tensor in kept.get(param, {}).items():
                    loaded = state.get(key)
                    if isinstance(loaded, torch.Tensor) and loaded is not tensor and loaded.shape == tensor.shape:
                        tensor.copy_(loaded)
                        state[key] = tensor

    @torch.no_grad()
    def step(self, closure=None):
        """Update every parameter that has a gradient; returns the closure's loss, if any."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                if param.grad.is_sparse:
                    raise RuntimeError("Lamb does not support sparse gradients")
                self._update(param, param.grad, group, beta1, beta2)
        return loss

    def _update(self, param: torch.Tensor, grad: torch.Tensor, group: dict, beta1: float, beta2: float) -> None:
        state = self.state[param]
        state["step"] += 1
        step = state["step"].item()
        exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)

        step_size = group["lr"]
        if group["debias"]:
            step_size *= math.sqrt(1 - beta2**step) / (1 - beta1**step)

        adam_step = exp_avg / exp_avg_sq.sqrt().add_(group["eps"])
        if group["weight_decay"]:
            adam_step.add_(param, alpha=group["weight_decay"])

        weight_norm = param.norm().clamp(max=group["clamp_value"])
        adam_norm = adam_step.norm()
        usable = (weight_norm > 0) & (adam_norm > 0)
        trust_ratio = torch.where(usable, weight_norm / adam_norm, 1.0)
        param.sub_(adam_step.mul_(trust_ratio * step_size))


def parameter_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """The model's parameters in two groups: with weight decay, and without it for biases and
    LayerNorm weights (as BERT, ALBERT and sahajBERT train)."""
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if any(part in name for part in NO_DECAY_NAMES) else decay).append(param)
    return [dict(params=decay, weight_decay=weight_decay), dict(params=no_decay, weight_decay=0.0)]


def flat_params(param_groups: list[dict]) -> list[torch.Tensor]:
    """The parameters of an optimizer's ``param_groups``, in order."""
    return [param for group in param_groups for param in group["params"]]


def schedule_build(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int):
    """Linear warm-up from 0 to the peak learning rate over ``warmup_steps``, then linear decay to 0
    at ``total_steps``. hivemind steps it once per collaboration epoch."""
    return get_linear_schedule_with_warmup(optimizer, num_warmup_steps=warmup_steps, num_training_steps=total_steps)
