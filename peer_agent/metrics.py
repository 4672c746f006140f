"""Training metrics each peer publishes in the run's DHT, signed with its own key.

The record is the one hivemind's ALBERT example publishes: key ``f"{run_id}_metrics"``, one
subkey per peer (its public key, ``[owner:ssh-rsa ...]``), value :class:`LocalMetrics`.
``SchemaValidator`` rejects malformed values and ``RSASignatureValidator`` lets only the key's
owner write its subkey, so a reader (the coordinator) can attribute every record to a peer.
A reader must install the same validators (see :func:`metrics_validators`), or ``dht.get``
never returns the signed values.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

from hivemind.dht import DHT
from hivemind.dht.crypto import RSASignatureValidator
from hivemind.dht.schema import BytesWithPublicKey, SchemaValidator
from hivemind.dht.validation import RecordValidatorBase
from hivemind.utils.crypto import RSAPrivateKey
from hivemind.utils.timed_storage import ValueWithExpiration, get_dht_time

# hivemind's SchemaValidator works with pydantic v1 models and requires strict number types.
from pydantic.v1 import BaseModel, StrictFloat, confloat, conint, conlist

METRICS_EXPIRATION_S = 600.0
CLOSED_EPOCHS_KEPT = 16


class LocalMetrics(BaseModel):
    """One peer's training since its previous record, published once per collaboration epoch."""

    step: conint(ge=0, strict=True)  # the collaboration epoch the peer is in
    samples_per_second: confloat(ge=0.0, strict=True)
    samples_accumulated: conint(ge=0, strict=True)  # samples processed since the previous record
    loss: StrictFloat  # mean training loss over those samples
    mini_steps: conint(ge=0, strict=True)  # local steps since the previous record
    # (local epoch, samples this peer accumulated in it) for its last epochs, oldest first. The
    # coordinator may miss records (one poll every few seconds, a record replaced every epoch); with
    # these it still knows each epoch's count. Agents before 0.3.0 do not send it.
    closed_epochs: conlist(tuple[conint(ge=0, strict=True), conint(ge=0, strict=True)],
                           max_items=CLOSED_EPOCHS_KEPT) = []


class MetricSchema(BaseModel):
    """DHT schema: ``{run_id}_metrics`` maps each peer's public key to its metrics."""

    metrics: dict[BytesWithPublicKey, LocalMetrics]


def metrics_key(run_id: str) -> str:
    """The DHT key under which a run's peers publish metrics."""
    return f"{run_id}_metrics"


def metrics_validators(run_id: str, private_key: RSAPrivateKey | None = None) -> list[RecordValidatorBase]:
    """Validators for a DHT that writes or reads a run's metrics.

    Give the peer's own ``private_key``: a DHT signs with the key of the first
    ``RSASignatureValidator`` it receives and ignores later ones, so this one decides whose
    records the peer can write (the progress tracker must use the same key).
    """
    return [SchemaValidator(MetricSchema, prefix=run_id), RSASignatureValidator(private_key)]


def owner_subkey(private_key: RSAPrivateKey) -> bytes:
    """The subkey a peer writes its signed records under: ``[owner:<its public key>]``."""
    return RSASignatureValidator(private_key).local_public_key


def metrics_publish(dht: DHT, run_id: str, private_key: RSAPrivateKey, metrics: LocalMetrics,
                    expiration_s: float = METRICS_EXPIRATION_S):
    """Store this peer's metrics without waiting; returns the store's future."""
    return dht.store(key=metrics_key(run_id), subkey=owner_subkey(private_key), value=metrics.dict(),
                     expiration_time=get_dht_time() + expiration_s, return_future=True)


class MetricsPublisher:
    """This peer's local metrics: its good steps tallied per local epoch and published, signed, as each
    epoch ends. ``samples_per_second`` reads the peer's throughput at the moment of publishing."""

    def __init__(self, dht: DHT, run_id: str, private_key: RSAPrivateKey, *, epoch: int,
                 samples_per_second: Callable[[], float]):
        self.dht, self.run_id, self.private_key = dht, run_id, private_key
        self.samples_per_second = samples_per_second
        self.published_epoch = epoch
        self._unpublished = dict(samples=0, loss_sum=0.0, steps=0)
        self._closed_epochs: deque[tuple[int, int]] = deque(maxlen=CLOSED_EPOCHS_KEPT)

    def step_add(self, *, loss: float, samples: int, epoch: int) -> None:
        """Count a good step, after which the peer is at local ``epoch``; publish when that is a new one."""
        self._unpublished["samples"] += samples
        self._unpublished["loss_sum"] += loss
        self._unpublished["steps"] += 1
        if epoch != self.published_epoch:
            self.publish(epoch)

    def publish(self, epoch: int) -> None:
        """Publish the steps since the last record as this peer's metrics at ``epoch``."""
        done = self._unpublished
        # Every sample since the last record went into the local epoch of that record, even when
        # this step moved the epoch on by more than one (hivemind's catch-up to the swarm).
        self._closed_epochs.append((self.published_epoch, done["samples"]))
        metrics = LocalMetrics(
            step=epoch, samples_per_second=self.samples_per_second(), samples_accumulated=done["samples"],
            loss=done["loss_sum"] / done["steps"], mini_steps=done["steps"], closed_epochs=list(self._closed_epochs))
        metrics_publish(self.dht, self.run_id, self.private_key, metrics)
        self.published_epoch = epoch
        self._unpublished = dict(samples=0, loss_sum=0.0, steps=0)


def metrics_read(dht: DHT, run_id: str) -> dict[bytes, LocalMetrics]:
    """Every peer's latest metrics, by owner subkey; records that do not parse are skipped."""
    return signed_records_read(dht, metrics_key(run_id), LocalMetrics)


SWARM_READ_TIMEOUT_S = 10.0


def dht_result(dht: DHT, future, timeout: float = SWARM_READ_TIMEOUT_S) -> Any:
    """What a call to ``dht`` made with ``return_future=True`` returns, waiting at most ``timeout`` s.

    A DHT process that died (a SIGTERM to the whole process group ends it first) never resolves the
    futures it was handed: then this raises TimeoutError within half a second instead of waiting.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            return future.result(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
        except TimeoutError:
            if not dht.is_alive() or time.monotonic() >= deadline:
                raise


def signed_records_read(dht: DHT, key: str, schema: type) -> dict[bytes, Any]:
    """Every peer's latest record under ``key`` parsed with the pydantic ``schema``, by owner
    subkey; cleared records and records that do not parse are skipped."""
    found = dht_result(dht, dht.get(key, latest=True, return_future=True))
    if found is None or not isinstance(found.value, dict):
        return {}
    records = {}
    for subkey, entry in found.value.items():
        if isinstance(entry, ValueWithExpiration) and isinstance(entry.value, dict):
            try:
                records[subkey] = schema.parse_obj(entry.value)
            except ValueError:
                continue
    return records
