"""Robust aggregation of the gradient all-reduce: CenteredClip on each part, so that one peer sending
bad gradients cannot steer the model.

In hivemind's all-reduce every peer of a group owns a part of the flattened gradient; the others
send it their slices of that part and it returns the average (``TensorPartReducer``). A peer that
sends sign-flipped or huge gradients moves that mean as far as it likes. With ``centered_clip`` the
owner of each part combines the slices it received with CenteredClip instead (Karimireddy, He and
Jaggi, 2021; applied per part of the all-reduce as in BTARD's ButterflyClip, Gorbunov et al., 2022):

    v ← v + Σᵢ wᵢ·(xᵢ − v)·min(1, τ / ‖xᵢ − v‖) / Σᵢ wᵢ

starting from the coordinate-wise median, with τ the median distance of the slices to that start,
for ``CLIP_ITERATIONS`` rounds. Slices that agree are averaged as before; one far away moves the
result by at most τ/n per round. A part left with two slices (a group of two, or a third sender that
timed out) has no majority. In the gradients' all-reduce both are cut to the smaller norm before their
mean: an attacker can cancel one round's update, never outweigh it. In the parameters' all-reduce
(the state averager's) a slice of zeros would cut the honest one to zero and zero the part, so there
the owner keeps its own slice: peers still leave the round holding the same parameters, part by part
their owners'. Every peer of a run uses the run's choice, so each part is combined the same way
whoever owns it.

It holds each sender's slice of the current part (group size × part size) instead of one running sum.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from hivemind.averaging.allreduce import AllReduceRunner, AveragingMode
from hivemind.averaging.averager import DecentralizedAverager
from hivemind.averaging.partition import TensorPartReducer
from hivemind.utils.asyncio import as_aiter, azip
from hivemind.utils.timed_storage import get_dht_time

CLIP_ITERATIONS = 10


def centered_clip(slices: Sequence[torch.Tensor], weights: Sequence[float], *, iterations: int = CLIP_ITERATIONS,
                  own: int | None = None) -> torch.Tensor:
    """The CenteredClip combination of equal-shaped ``slices`` weighted by ``weights``; ``own``, the index
    of the owner's own slice where two slices of parameters leave the owner's to decide."""
    stacked = torch.stack([slice_.float() for slice_ in slices])
    if own is not None and len(slices) <= 2:
        return stacked[own]
    weight = torch.tensor([float(w) for w in weights], dtype=torch.float32)
    flat = stacked.reshape(len(slices), -1)
    if len(slices) <= 2 or weight.sum() <= 0:
        # Two slices cannot outvote each other, and a part has two whenever a third sender timed out.
        # Their mean would be the attacker's to steer, so each is first cut to the smaller norm: an
        # attacker can cancel the honest slice, never outweigh it. A zero-weight slice sets no bound.
        norms = flat.norm(dim=1)
        bound = norms[weight > 0].min() if bool((weight > 0).any()) else norms.min()
        bounded = flat * (bound / norms.clamp_min(1e-12)).clamp(max=1.0).unsqueeze(1)
        return ((weight @ bounded) / weight.sum().clamp_min(1e-12)).reshape(stacked.shape[1:])
    center = flat.median(dim=0).values
    tau = (flat - center).norm(dim=1).median().clamp_min(1e-12)
    for _ in range(iterations):
        offsets = flat - center
        scale = (tau / offsets.norm(dim=1).clamp_min(1e-12)).clamp(max=1.0)
        center = center + (weight * scale) @ offsets / weight.sum()
    return center.reshape(stacked.shape[1:])


class _SliceCollector:
    """Stands in for ``TensorPartReducer``'s running sum: hivemind calls ``add_`` once per sender and
    ``div_`` once all have sent (hivemind 1.1.12, hivemind/averaging/partition.py); here ``add_``
    keeps the slice and ``div_`` returns their CenteredClip."""

    def __init__(self, reducer: CenteredClipReducer) -> None:
        self.reducer = reducer
        self.slices: list[torch.Tensor] = []
        self.weights: list[float] = []
        self.senders: list[int] = []

    def add_(self, tensor: torch.Tensor, alpha: float = 1.0) -> _SliceCollector:
        self.slices.append(tensor.detach().clone())
        self.weights.append(alpha)
        self.senders.append(self.reducer.sender_of[id(tensor)])
        return self

    def div_(self, denominator: float) -> torch.Tensor:
        own = self.reducer.own_sender
        return centered_clip(self.slices, self.weights, own=self.senders.index(own) if own in self.senders else None)


class CenteredClipReducer(TensorPartReducer):
    """hivemind's part reducer, combining each part's slices by :func:`centered_clip`; ``own_sender``, the
    owner's own index among the senders where two slices leave the part to its owner (parameters)."""

    def __init__(self, part_shapes, num_senders: int, *, own_sender: int | None = None):
        self.own_sender = own_sender
        self.sender_of: dict[int, int] = {}  # a slice being handed in (by id) → its sender's index
        super().__init__(part_shapes, num_senders)

    async def accumulate_part(self, sender_index: int, part_index: int, tensor_part: torch.Tensor,
                              weight: float = 1.0) -> torch.Tensor:
        # hivemind's accumulate_part hands the slice alone to ``add_``, after waiting for earlier parts.
        self.sender_of[id(tensor_part)] = sender_index
        try:
            return await super().accumulate_part(sender_index, part_index, tensor_part, weight)
        finally:
            self.sender_of.pop(id(tensor_part), None)

    def reset_accumulators(self):
        super().reset_accumulators()
        if not self.finished.is_set():
            self.accumulator = _SliceCollector(self)


class CenteredClipAllReduceRunner(AllReduceRunner):
    """hivemind's all-reduce, with the parts this peer owns combined by :func:`centered_clip`."""

    own_slice_decides_two = False

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        own = self.sender_peer_ids.index(self.peer_id) if (
            self.own_slice_decides_two and self.peer_id in self.sender_peer_ids) else None
        self.tensor_part_reducer = CenteredClipReducer(
            tuple(part.shape for part in self.parts_for_local_averaging), len(self.sender_peer_ids), own_sender=own)


class CenteredClipParametersRunner(CenteredClipAllReduceRunner):
    """The parameters' all-reduce (the state averager's): a part left with two slices is its owner's."""

    own_slice_decides_two = True


RUNNERS: dict[str, type[AllReduceRunner]] = {"mean": AllReduceRunner, "centered_clip": CenteredClipAllReduceRunner}
# Where the parameters' all-reduce combines otherwise than the gradients' (read before RUNNERS).
PARAMETERS_RUNNERS: dict[str, type[AllReduceRunner]] = {"centered_clip": CenteredClipParametersRunner}


class AggregatingAverager(DecentralizedAverager):
    """A hivemind averager whose all-reduce combines parts by ``aggregation`` ("mean", hivemind's own,
    or "centered_clip"). Mix it in last, before hivemind's ``DecentralizedAverager``; an averager of
    parameters sets ``runners`` to ``PARAMETERS_RUNNERS``, read before ``RUNNERS``."""

    runners: dict[str, type[AllReduceRunner]] = {}

    def __init__(self, *args, aggregation: str = "mean", **kwargs):
        # Set before hivemind's constructor, which may start (fork) the averager's process.
        self._runner_class = self.runners.get(aggregation) or RUNNERS[aggregation]
        super().__init__(*args, **kwargs)

    async def _run_allreduce_inplace_(self, tensors, group_info, group_id=None, **kwargs):
        # hivemind 1.1.12's DecentralizedAverager._run_allreduce_inplace_ (hivemind/averaging/averager.py),
        # which names its runner class inline, with the run's runner class instead.
        group_id = group_info.group_id if group_id is None else group_id
        declared = [AveragingMode(self.serializer.loads(data)[1]) for data in group_info.gathered]
        if "modes" not in kwargs and AveragingMode.AUX in declared:
            # hivemind 1.1.12 does not pass the members' modes on (each declares its own in its gathered
            # data: [bandwidth, mode, its own data]), and its runner guesses them from the parts: a member
            # without a part is a client, one with a part a node. An auxiliary (an aggregator) taken for a
            # node sends a zero-weight vector, and every member downloads a useless slice from it.
            guessed = (AveragingMode.CLIENT if part == 0 else AveragingMode.NODE for part in kwargs["peer_fractions"])
            kwargs["modes"] = tuple(mode if mode == AveragingMode.AUX else guess for mode, guess in zip(declared, guessed))
        runner = self._runner_class(p2p=self._p2p, servicer_type=type(self), prefix=self.prefix, tensors=tensors,
                                    group_id=group_id, ordered_peer_ids=group_info.peer_ids, **kwargs)
        assert group_id in self._running_groups, f"Group id {group_id} was not registered in _register_allreduce_group"
        self._running_groups[group_id].set_result(runner)
        if runner.modes[group_info.peer_ids.index(self.peer_id)] != AveragingMode.AUX:
            async for tensor, update in azip(as_aiter(*tensors), runner):
                tensor.add_(update, alpha=self._averaging_alpha)
                self.last_updated = get_dht_time()
                self._state_updated.set()
        else:
            async for _ in runner:
                raise ValueError("aux peers should not receive averaged tensors")
