"""Gradient averaging that keeps a small share of the vector on every peer able to aggregate.

hivemind partitions the vector among a group by a linear program over the declared bandwidths
(``load_balance_peers``). With three peers at 100 Mbit/s and one at 20, the LP gives the slow
peer no share: it should only send its gradients and read the averages back, both at once. But
hivemind makes a zero-share peer read nothing until it has sent everything
(``AllReduceRunner.should_delay_results``), so its upload and download run one after the other
and the round takes twice what the LP planned (docs/benchmarks.md, section 6). A share of
``MIN_SHARE`` keeps the slow peer's transfers overlapped for a few percent more traffic on it.

Every peer of a group must compute the same partition, so every peer of a run runs this agent.
A firewalled peer (client mode) accepts no connections and keeps its share of 0.
"""

import math
from collections.abc import Sequence

from hivemind.averaging.allreduce import AveragingMode
from hivemind.averaging.load_balancing import hagenbach_bishoff
from hivemind.optim.grad_averager import GradientAverager

MIN_SHARE = 0.01


def shares_with_floor(parts: Sequence[int], can_aggregate: Sequence[bool], floor: float = MIN_SHARE) -> tuple[int, ...]:
    """Raise every aggregating peer's part to ``floor`` of the vector, taking the difference from
    the larger parts in proportion to their size; the parts still sum to the vector's size."""
    total = sum(parts)
    minimum = math.ceil(floor * total)
    aggregators = [index for index, able in enumerate(can_aggregate) if able]
    raised = [index for index in aggregators if parts[index] < minimum]
    if not raised or minimum * len(aggregators) > total:
        return tuple(parts)
    donors = [index for index in range(len(parts)) if index not in raised]
    donated = sum(parts[index] for index in donors)
    scale = (total - minimum * len(raised)) / donated
    scores = [minimum if index in raised else parts[index] * scale for index in range(len(parts))]
    return tuple(int(part) for part in hagenbach_bishoff(total, scores))


class FlooredGradientAverager(GradientAverager):
    """hivemind's ``GradientAverager`` with :func:`shares_with_floor` applied to each group's
    partition (the peers' declared bandwidths and modes travel in ``group_info.gathered``)."""

    async def _run_allreduce_inplace_(self, tensors, group_info, group_id=None, **kwargs):
        parts = kwargs.get("peer_fractions")
        if parts is not None:
            bandwidths, mode_ids, _ = zip(*map(self.serializer.loads, group_info.gathered))
            can_aggregate = [AveragingMode(mode) == AveragingMode.NODE and (bandwidth is None or bandwidth > 0)
                             for bandwidth, mode in zip(bandwidths, mode_ids)]
            kwargs["peer_fractions"] = shares_with_floor(parts, can_aggregate)
        return await super()._run_allreduce_inplace_(tensors, group_info, group_id, **kwargs)
