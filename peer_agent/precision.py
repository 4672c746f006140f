"""The numeric precision a peer computes its steps in: autocast, and loss scaling for fp16."""

from __future__ import annotations

import contextlib
import math

import torch

from peer_agent.model import precision_choose


class Precision:
    """One of "fp32", "bf16" or "fp16" on a device: the autocast a forward pass runs under and, for
    fp16, the loss scale its backward pass and optimizer step go through.

    torch's own GradScaler, not hivemind's: that one defers unscaling to the global step and is made
    for reuse_grad_buffers=True; with separate accumulators (needed to clip and zero gradients every
    step) it would feed still-scaled gradients to LAMB.
    """

    def __init__(self, device: torch.device, name: str):
        self.device, self.name = device, name
        self.scaler = torch.amp.GradScaler(device.type) if name == "fp16" else None

    @classmethod
    def choose(cls, device: torch.device, policy: str) -> Precision:
        """The precision the run's ``policy`` grants on ``device`` (``peer_agent.model.precision_choose``)."""
        return cls(device, precision_choose(device, policy))

    def autocast(self):
        """The context a forward pass runs in."""
        if self.name == "fp32":
            return contextlib.nullcontext()
        dtype = torch.float16 if self.name == "fp16" else torch.bfloat16
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def backward(self, loss: torch.Tensor) -> None:
        """Backpropagate ``loss``, scaled under fp16."""
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    @property
    def loss_scale(self) -> float:
        """What the gradients now accumulated are multiplied by (1 unless fp16)."""
        return self.scaler.get_scale() if self.scaler else 1.0

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the accumulated gradients by the loss scale, before they are clipped."""
        if self.scaler:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer, grad_norm: torch.Tensor) -> bool:
        """Hand the step to ``optimizer`` unless its gradients are not finite; True if it went in. Under
        fp16 the scaler decides (it skips a step whose scaled gradients overflowed, and lowers its scale)."""
        if self.scaler:
            scale = self.scaler.get_scale()
            self.scaler.step(optimizer)
            self.scaler.update()
            return self.scaler.get_scale() >= scale
        if torch.isfinite(grad_norm):
            optimizer.step()
            return True
        return False

    def overflowed(self, loss: float) -> bool:
        """Whether a step with this finite ``loss`` that did not go in was an fp16 overflow in the gradients:
        the scaler has lowered the loss scale, and the parameters are unharmed."""
        return self.scaler is not None and math.isfinite(loss)
