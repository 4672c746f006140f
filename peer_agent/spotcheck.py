"""Spot checks: what lets the portal recompute any step a peer says it trained (docs/trust.md).

Three things make every micro-batch of a step checkable after the fact:

- **Micro-batches follow from public seeds.** A session's examples come from the run's data
  streamed with the seed :func:`data_seed` derives from the run and the session, so the stream is
  the same for the agent and for a validator that replays it; a micro-batch is named by its
  *cursor*, the number of micro-batches the session drew before it (:class:`BatchReplay` rebuilds them).
- **A fingerprint of each micro-batch's gradient**, :func:`gradient_fingerprint`: a count sketch
  (every gradient value added, with a random sign, into one of ``FINGERPRINT_WIDTH`` buckets; signs
  and buckets drawn from a seed per run and epoch). It costs one pass over the gradient, is 64
  bytes, and two sketches of nearby gradients are nearby: their distance
  (:func:`fingerprint_distance`) is about the gradients' relative difference. Per micro-batch, not
  per step: the gradient of half of a large step is close to the whole step's (docs/benchmarks.md,
  section 10), that of half a micro-batch is not.
- **A commitment before any challenge**: when an epoch closes, the agent signs the list of its
  micro-batches (cursor, samples, fingerprint, and with each step's first micro-batch a sketch of
  the parameters the step was computed at) with its peer key and sends it with its reports
  (``peer_agent.protocol.EpochCommitment``). The validator picks the ones to recompute only after
  it has the commitment.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedTokenizerFast

from peer_agent.data import batches, dataset_stream
from peer_agent.protocol import FINGERPRINT_WIDTH, EpochCommitment, RunConfig, commitment_message

if TYPE_CHECKING:
    from hivemind.utils.crypto import RSAPrivateKey


def data_seed(run_id: str, session_id: int) -> int:
    """The seed of a session's data stream: public, so that a validator can replay it."""
    return _seed("data", run_id, session_id) % 2**31


def _seed(*parts: object) -> int:
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:8], "little")


class Sketch:
    """The count sketch of one run and epoch: for each parameter, a bucket and a sign per value,
    drawn on the CPU (the same on every machine) and kept on the gradients' device.

    Each value's bucket and sign are held as one *cell*, ``2 * bucket + (sign > 0)``, of
    ``2 * FINGERPRINT_WIDTH``: a gradient is added into its cells as it is (``scatter_add_``, which
    takes int64 indices), and each bucket is then its positive cell minus its negative one. That is
    the same sketch as multiplying every value by its sign (up to float32 summation order), without
    a temporary the size of the gradient, for 8 bytes per parameter instead of 5: it keeps the
    fingerprint under 2% of a small step (docs/benchmarks.md, section 10).
    """

    def __init__(self, run_id: str, epoch: int, params: list[torch.Tensor]):
        self.run_id, self.epoch = run_id, epoch
        self.cells: list[torch.Tensor] = []
        for index, param in enumerate(params):
            generator = torch.Generator().manual_seed(_seed("sketch", run_id, epoch, index) % 2**63)
            count = param.numel()
            bucket = torch.randint(FINGERPRINT_WIDTH, (count,), generator=generator, dtype=torch.int32)
            positive = torch.randint(2, (count,), generator=generator, dtype=torch.int8)  # the sign: +1 if 1, -1 if 0
            self.cells.append(bucket.mul_(2).add_(positive).to(param.device, torch.int64))

    def apply(self, gradients: list[torch.Tensor | None]) -> torch.Tensor:
        """The sketch of a gradient given per parameter (None for a parameter without one)."""
        cells = None
        for gradient, cell in zip(gradients, self.cells, strict=True):
            if gradient is None:
                continue
            if cells is None:
                cells = torch.zeros(2 * FINGERPRINT_WIDTH, dtype=torch.float32, device=gradient.device)
            cells.scatter_add_(0, cell, gradient.detach().flatten().float())
        return torch.zeros(FINGERPRINT_WIDTH) if cells is None else (cells[1::2] - cells[0::2]).cpu()


class Sketcher:
    """The sketch of the current epoch for a model, built once per epoch."""

    def __init__(self, run_id: str):
        self.run_id = run_id
        self._sketch: Sketch | None = None

    def _of(self, params: list[torch.Tensor], epoch: int) -> Sketch:
        if self._sketch is None or self._sketch.epoch != epoch:
            self._sketch = Sketch(self.run_id, epoch, params)
        return self._sketch

    def sketch(self, model: torch.nn.Module, epoch: int) -> torch.Tensor:
        """The sketch of the gradients now in ``model``'s parameters, for a step of ``epoch``."""
        params = list(model.parameters())
        return self._of(params, epoch).apply([param.grad for param in params])

    def fingerprint(self, model: torch.nn.Module, epoch: int) -> str:
        """The fingerprint of the gradients now in ``model``'s parameters, for a step of ``epoch``."""
        return fingerprint_encode(self.sketch(model, epoch))

    def parameters(self, model: torch.nn.Module, epoch: int) -> str:
        """The fingerprint of ``model``'s parameters themselves, with the cells of ``epoch``'s sketch: what
        a step's gradients were computed at. The distance of two such fingerprints is about the relative
        difference of the two models' parameters."""
        params = list(model.parameters())
        return fingerprint_encode(self._of(params, epoch).apply([param.detach() for param in params]))


def parameters_fingerprint(model: torch.nn.Module, run_id: str, epoch: int) -> str:
    """The fingerprint of ``model``'s parameters (see :meth:`Sketcher.parameters`)."""
    return Sketcher(run_id).parameters(model, epoch)


def gradient_fingerprint(model: torch.nn.Module, run_id: str, epoch: int) -> str:
    """The fingerprint of the gradients now in ``model``'s parameters (see :class:`Sketcher`)."""
    return Sketcher(run_id).fingerprint(model, epoch)


def fingerprint_encode(sketch: torch.Tensor) -> str:
    """A sketch as the base64 of its float32 values, as commitments carry it."""
    return base64.b64encode(sketch.to(torch.float32).numpy().tobytes()).decode("ascii")


def commitment_sign(commitment: EpochCommitment, *, run_id: str, session_id: int, key: RSAPrivateKey) -> EpochCommitment:
    """The commitment signed with the peer's key (hivemind's RSA-PSS, as the join proof)."""
    message = commitment_message(run_id=run_id, session_id=session_id, commitment=commitment)
    return commitment.model_copy(update={"signature": key.sign(message).decode()})


def fingerprint_decode(text: str) -> torch.Tensor:
    raw = base64.b64decode(text, validate=True)
    if len(raw) != 4 * FINGERPRINT_WIDTH:
        raise ValueError(f"a fingerprint holds {FINGERPRINT_WIDTH} float32 values")
    return torch.frombuffer(bytearray(raw), dtype=torch.float32).to(torch.float64)


def fingerprint_distance(claimed: str, recomputed: str) -> float:
    """How far a claimed fingerprint is from the recomputed one, relative to the recomputed one's size:
    about the relative difference of the two gradients (0 for the same gradient)."""
    a, b = fingerprint_decode(claimed), fingerprint_decode(recomputed)
    if not torch.isfinite(a).all():
        return float("inf")
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


class BatchReplay:
    """A session's micro-batches, rebuilt in order from the run's data and the session's seed.

    The stream is the agent's own (``peer_agent.data``): the same documents in the same order for
    the same seed, shuffle buffer and micro-batch size. Cursors must be asked for in increasing
    order; an earlier one starts the replay over.
    """

    def __init__(self, config: RunConfig, tokenizer: PreTrainedTokenizerFast, *, seed: int, micro_batch_size: int,
                 data_files: list[str] | None):
        self.config, self.tokenizer, self.seed = config, tokenizer, seed
        self.micro_batch_size, self.data_files = micro_batch_size, data_files
        self._batches: Iterator[dict[str, torch.Tensor]] | None = None
        self.position = 0  # the cursor of the next micro-batch the replay yields

    def micro_batches(self, cursor: int, count: int, *, before_each: Callable[[], None] | None = None
                      ) -> list[dict[str, torch.Tensor]]:
        """The ``count`` micro-batches from ``cursor`` on. ``before_each`` is called before each micro-batch is
        read, skipped ones too, and may raise to stop a long replay: the replay stays where it was stopped."""
        if self._batches is None or cursor < self.position:
            stream = dataset_stream(self.config, data_files=self.data_files, seed=self.seed)
            self._batches = batches(self.tokenizer, self.config, stream, self.micro_batch_size, seed=self.seed)
            self.position = 0
        found = []
        while self.position < cursor + count:
            if before_each is not None:
                before_each()
            batch = next(self._batches)
            self.position += 1
            if self.position > cursor:
                found.append(batch)
        return found


def step_fingerprint(model: torch.nn.Module, micro_batches: list[dict[str, torch.Tensor]], run_id: str,
                     epoch: int) -> str:
    """Recompute micro-batches as the agent runs them (``peer_agent.training.Trainer.step``: the mean loss
    of the micro-batches, backward, before clipping; the agent commits to one micro-batch each) at
    ``model``'s parameters, and fingerprint the gradient."""
    model.train()
    model.zero_grad(set_to_none=True)
    for batch in micro_batches:
        (model(**batch).loss / len(micro_batches)).backward()
    fingerprint = gradient_fingerprint(model, run_id, epoch)
    model.zero_grad(set_to_none=True)
    return fingerprint
