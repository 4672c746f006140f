"""The states an agent keeps for the validator (peer_agent.averaging.EpochStates): by epoch and the
parameters' sketch its steps commit to, the last few, exactly as computed. A real peer serves
them over hivemind in tests/runs/swarm/test_checkpoint_swarm.py."""

import base64

import torch

from peer_agent.averaging import EpochStates
from peer_agent.protocol import FINGERPRINT_WIDTH


def sketch(n: int) -> str:
    return base64.b64encode(torch.full((FINGERPRINT_WIDTH,), float(n)).numpy().tobytes()).decode()


def parameters(seed: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(4, 3, generator=generator), torch.randn(5, generator=generator)]


def test_a_kept_state_is_found_by_its_epoch_and_sketch_and_no_other():
    states = EpochStates([torch.Size([4, 3]), torch.Size([5])], slots=3)
    states.keep(7, sketch(1), parameters(1))
    found = states.find(7, sketch(1))
    assert [part.shape for part in found] == [torch.Size([4, 3]), torch.Size([5])]
    assert all(torch.equal(kept, value) for kept, value in zip(found, parameters(1), strict=True)), "exact: fp16 failed checks"
    assert states.find(8, sketch(1)) is None and states.find(7, sketch(2)) is None
    assert states.find(7, "not base64!") is None and states.find(7, base64.b64encode(b"short").decode()) is None


def test_the_oldest_state_makes_room_and_a_repeated_sketch_is_kept_once():
    states = EpochStates([torch.Size([4, 3]), torch.Size([5])], slots=3)
    for epoch in range(4):
        states.keep(epoch, sketch(epoch), parameters(epoch))
        states.keep(epoch, sketch(epoch), parameters(99))  # the epoch's next steps: the same state, not copied again
    assert states.find(0, sketch(0)) is None, "three slots: epoch 0's state made room for epoch 3's"
    for epoch in (1, 2, 3):
        assert torch.equal(states.find(epoch, sketch(epoch))[1], parameters(epoch)[1])
