"""The run configuration and the wire messages shared by the portal and the peer agent.

The portal validates organizers' edits with these classes and stores
``config.model_dump(mode="json")``; the agent parses what the portal sends with the same classes.
This module imports only pydantic and the standard library so that both sides can afford it.
"""

import base64
import hashlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    FiniteFloat,
    StrictInt,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

MODEL_PRESETS: dict[str, dict[str, int]] = {
    # ~2M parameters at an 8k vocabulary: trains on a laptop CPU.
    "tiny": dict(hidden_size=256, num_hidden_layers=2, num_attention_heads=4,
                 intermediate_size=1024, embedding_size=128, max_position_embeddings=512),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                 intermediate_size=3072, embedding_size=128, max_position_embeddings=512),
    # sahajBERT: ALBERT-large, 24 layers sharing one set of weights, ~18M parameters at 32k vocab.
    "large": dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                  intermediate_size=4096, embedding_size=128, max_position_embeddings=512),
    "xlarge": dict(hidden_size=2048, num_hidden_layers=24, num_attention_heads=16,
                   intermediate_size=8192, embedding_size=128, max_position_embeddings=512),
}

MODEL_DIMENSIONS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "embedding_size",
                    "max_position_embeddings")

MID_RUN_EDITABLE: frozenset[str] = frozenset({
    "averaging.matchmaking_time", "averaging.averaging_timeout", "averaging.min_bandwidth_mbps", "averaging.client_mode",
    "averaging.checkpoint_every_epochs", "averaging.checkpoint_every_minutes", "averaging.keep_last_checkpoints",
    "averaging.keep_every_nth_checkpoint", "averaging.backbone_aggregates", "data.shuffle_buffer",
    "training.per_device_batch_size", "training.gradient_accumulation_steps", "training.precision",
    "verification.spot_checks", "verification.checks_per_epoch", "verification.tolerance",
    "verification.failures_to_suspend",
})
"""Dotted config paths that peers may pick up while a run is active: they change how a peer
computes or meets others, not what the collaboration optimizes."""

# A report carries at most one epoch's commitment of MAX_COMMITTED_STEPS steps: up to ~150 characters
# each, ~255 with the parameters' sketch that the first micro-batch of a step carries (every one, when
# a step is one micro-batch). tests/peer_agent/test_protocol.py checks that the largest report fits.
MAX_FRAME_CHARS = 393_216
FINGERPRINT_WIDTH = 16  # float32 values in a gradient fingerprint (peer_agent.spotcheck)
MAX_COMMITTED_STEPS = 1024

# Agents from 0.3.0 on split a group's vector alike (the share floor of peer_agent.averaging) and
# send their membership proofs next to their gathered data, for gradients and parameters; an older
# agent in the same group would compute other parts or be refused, and the round would fail for
# everyone. From 0.4.0 on they sign their joins with their peer key (JoinRequest.key_proof). From
# 0.5.0 on they read averaging.aggregation and combine their parts of the all-reduce by it (an older
# agent refuses a configuration that names it). From 0.6.0 on they draw their data from the session's
# public seed and commit to their steps (EpochCommitment), without which no work of theirs could be
# spot-checked and confirmed. From 0.7.0 on they pass each peer's mode to the all-reduce, so that an
# auxiliary aggregator in a group is a receiver and not a sender (an older agent would download a
# useless part from it and fail the round), and reach NATed peers through the backbones' relays.
# From 0.8.0 on they pass the modes in parameter averaging too, which aggregators now join.
# The portal refuses joins from older agents. 0.9.0 adds the sketch of the parameters each step was
# computed at to its commitments (StepCommitment.parameters). From 0.10.0 on they average LAMB's first
# moments with the parameters (peer_agent/training.py, AVERAGED_OPTIMIZER_STATISTICS): a parameter averaging
# round carries more tensors, and an older agent could average parameters with none of them.
# From 0.12.0 on they read a list of hub sources (DataConfig.hub) and leave out the held-out documents
# (DataConfig.holds_out); an older agent cannot parse such a config, and would train on held-out text.
# They also start from a run's checkpoint of epoch 0 (its start: another run's weights or a Hugging Face
# model, runs/setup/start.py), where an older one would train from random weights beside them.
# From 0.16.0 on they serve the parameters of their current state alone (rpc_download_parameters), which the
# validator holds each epoch's state from (runs/swarm/spotcheck.py): an older agent's states could not be held,
# and the epochs it alone served would earn nothing for anyone.
SWARM_COMPATIBLE_SINCE = "0.16.0"

# A run's special tokens: the portal trains tokenizers with them (runs/setup/tokenization.py) and the
# agent declares them to transformers (peer_agent/tokenizer.py).
PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = [PAD, UNK, CLS, SEP, MASK]  # ids 0..4 after training, in this order

Compression = Literal["none", "fp16", "uniform8bit"]
Seq = Annotated[StrictInt, Field(ge=1, le=2**31 - 1)]
_SEQ = TypeAdapter(Seq)
StrictFiniteFloat = Annotated[FiniteFloat, Field(strict=True)]
OpenSSHPublicKey = Annotated[str, StringConstraints(max_length=4096, pattern=r"^ssh-rsa [A-Za-z0-9+/]+={0,2}$")]


def _problem(kind: str, template: str, **context: Any) -> PydanticCustomError:
    """A cross-field problem of type ``kind``: a reader's language can word it again from the type
    and the context (runs/setup/forms.py), as it does pydantic's own errors."""
    return PydanticCustomError(kind, template, context)


def _raise_field_errors(model: BaseModel, problems: dict[str, str | PydanticCustomError]) -> None:
    """Raise one ValidationError whose entries sit at the dotted paths in ``problems``.

    pydantic keeps the ``loc`` of a ValidationError raised inside a validator and prefixes the
    enclosing location, so cross-field errors land beside the field a form should highlight.
    """
    if not problems:
        return
    line_errors = []
    for path, reason in problems.items():
        value: Any = model
        for part in path.split("."):
            value = getattr(value, part)
        line_errors.append(InitErrorDetails(
            type=reason if isinstance(reason, PydanticCustomError)
            else PydanticCustomError("config_conflict", "{reason}", {"reason": reason}),
            loc=tuple(path.split(".")),
            input=value,
        ))
    raise ValidationError.from_exception_data(type(model).__name__, line_errors)


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class ModelConfig(_Schema):
    """ALBERT shape (``transformers.AlbertForPreTraining``); the vocabulary follows the tokenizer."""

    preset: Literal["tiny", "base", "large", "xlarge", "custom"] = Field(
        "large", description='Model size; "large" is sahajBERT. Choose "custom" to set every dimension.')
    hidden_size: int | None = Field(None, ge=16, le=8192, description="Width of each layer (custom preset).")
    num_hidden_layers: int | None = Field(None, ge=1, le=96, description="Layers; ALBERT shares one set of weights.")
    num_attention_heads: int | None = Field(None, ge=1, le=128, description="Attention heads; must divide hidden_size.")
    intermediate_size: int | None = Field(None, ge=16, le=65536, description="Width of each feed-forward block.")
    embedding_size: int | None = Field(None, ge=16, le=8192, description="Width of the factorized token embeddings.")
    max_position_embeddings: int | None = Field(None, ge=16, le=8192, description="Longest input, in tokens.")

    @model_validator(mode="after")
    def _check_dimensions(self) -> "ModelConfig":
        problems = {}
        if self.preset == "custom":
            for name in MODEL_DIMENSIONS:
                if getattr(self, name) is None:
                    problems[name] = _problem("custom_preset_required", 'required when the preset is "custom"')
        else:
            for name, preset_value in MODEL_PRESETS[self.preset].items():
                value = getattr(self, name)
                if value is not None and value != preset_value:
                    problems[name] = _problem("preset_fixed", 'preset "{preset}" has {name} {value}; choose preset '
                                              '"custom" to change it', preset=self.preset, name=name, value=preset_value)
                # Stored configs name the shape through the preset only, so equal configs compare equal.
                setattr(self, name, None)
        if not problems:
            dims = self.dimensions()
            if dims["hidden_size"] % dims["num_attention_heads"]:
                problems["hidden_size"] = _problem(
                    "heads_divide", "hidden_size {hidden} is not divisible by num_attention_heads {heads}",
                    hidden=dims["hidden_size"], heads=dims["num_attention_heads"])
        _raise_field_errors(self, problems)
        return self

    def dimensions(self) -> dict[str, int]:
        """The model's dimensions, taken from the preset unless the preset is "custom"."""
        if self.preset == "custom":
            return {name: getattr(self, name) for name in MODEL_DIMENSIONS}
        return dict(MODEL_PRESETS[self.preset])


class TokenizerConfig(_Schema):
    """A SentencePiece-style Unigram tokenizer, trained on the run's data or uploaded."""

    source: Literal["train", "upload"] = Field(
        "train", description='"train" on a sample of the run\'s data, or "upload" a tokenizer.json.')
    vocab_size: int = Field(32000, ge=100, le=256000, description="Number of tokens in the vocabulary.")
    sample_size: int = Field(1_000_000, ge=100, le=100_000_000, description="Lines of data the tokenizer trains on.")
    lowercase: bool = Field(False, description="Lowercase text before tokenizing.")
    strip_accents: bool = Field(False, description="Remove accents (keep off for Bengali vowel signs).")


class HubSource(_Schema):
    """One Hugging Face dataset that agents stream documents from, as ``datasets`` 5 reads it: a
    repository of Parquet or Arrow files (no loading script), or a local folder laid out alike."""

    path: str = Field(min_length=1, max_length=500,
                      description="Hugging Face dataset id, or a folder laid out as the Hub lays one.")
    name: str | None = Field(None, max_length=200, description="Dataset configuration, if any.")
    split: str = Field("train", min_length=1, max_length=100, description="Dataset split to stream.")
    text_column: str = Field("text", min_length=1, max_length=100, description="Column holding the text.")
    probability: float = Field(1.0, gt=0, le=1, description="Share of the documents drawn from this source.")


def _default_hub_sources() -> list[HubSource]:
    # Parquet files on the Hub: datasets 4 and later no longer run OSCAR's loading script.
    return [HubSource(path="wikimedia/wikipedia", name="20231101.bn")]


class DataConfig(_Schema):
    """Where agents stream text from and how they build masked-LM + sentence-order examples."""

    source: Literal["hub", "files"] = Field(
        "hub", description='"hub" streams Hugging Face datasets; "files" uses text files uploaded to the run.')
    hub: list[HubSource] = Field(default_factory=_default_hub_sources, max_length=8, description=(
        'One dataset a line: id | configuration | split | text column | probability, e.g. "wikimedia/wikipedia | '
        '20231101.bn | train | text | 1". Datasets stored as Parquet or Arrow files; the probabilities add up to 1.'))
    heldout: Literal["hash", "validation_split"] = Field("hash", description=(
        '"hash": a share of the documents, chosen by a hash of their text, that no agent is sent; '
        '"validation_split": the sources\' validation split.'))
    heldout_share: float = Field(0.01, gt=0, le=0.5, description="Share of the documents held out by hash.")
    shuffle_buffer: int = Field(10000, ge=1, le=1_000_000, description="Examples held in memory to shuffle.")
    max_seq_length: int = Field(512, ge=16, le=4096, description="Tokens per training example.")
    mlm_probability: float = Field(0.15, gt=0, lt=1, description="Share of tokens masked for masked-LM.")
    short_seq_probability: float = Field(0.1, ge=0, le=1, description="Chance of a shorter example, as in BERT.")

    @model_validator(mode="after")
    def _check_source(self) -> "DataConfig":
        if self.source == "hub" and not self.hub:
            _raise_field_errors(self, {"hub": _problem("hub_sources_required", 'required when the source is "hub"')})
        total = sum(source.probability for source in self.hub)
        if self.hub and abs(total - 1) > 1e-6:
            _raise_field_errors(self, {"hub": _problem(
                "probabilities_sum", "the sources' probabilities add up to {total}; they must add up to 1",
                total=round(total, 6))})
        return self

    def holds_out(self, text: str) -> bool:
        """Whether a hub document is held out for the evaluation: agents never train on it. By a
        stable hash of its text (not Python's ``hash``, which changes between processes), so that
        the agents, the spot-check replay and the evaluation agree without sharing anything."""
        if self.source != "hub" or self.heldout != "hash":
            return False
        digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
        return int.from_bytes(digest, "big") < self.heldout_share * 2**64


class TrainingConfig(_Schema):
    """The collaborative optimizer (LAMB) and each peer's share of a global batch."""

    target_batch_size: int = Field(4096, ge=1, le=10_000_000, description="Samples all peers gather per optimizer step.")
    per_device_batch_size: int = Field(4, ge=1, le=4096, description="Samples per forward pass on one peer.")
    gradient_accumulation_steps: int = Field(1, ge=1, le=1024, description="Forward passes accumulated per local step.")
    optimizer: Literal["lamb"] = Field("lamb", description="Optimizer; LAMB as in sahajBERT.")
    learning_rate: float = Field(0.00176, gt=0, le=1, description="Peak learning rate.")
    warmup_steps: int = Field(5000, ge=0, le=10_000_000, description="Optimizer steps of linear warm-up.")
    total_steps: int = Field(125000, ge=1, le=10_000_000, description="Optimizer steps in the schedule.")
    weight_decay: float = Field(0.01, ge=0, le=1, description="LAMB weight decay.")
    clamp_value: float = Field(10000.0, gt=0, description="LAMB trust-ratio clamp.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradients are clipped to this norm.")
    precision: Literal["auto", "fp32", "fp16", "bf16"] = Field(
        "auto", description='"auto": fp16 with loss scaling on CUDA, bf16 where supported, fp32 on CPU.')

    @model_validator(mode="after")
    def _check_schedule(self) -> "TrainingConfig":
        problems = {}
        peer_batch = self.per_device_batch_size * self.gradient_accumulation_steps
        if self.target_batch_size < peer_batch:
            problems["target_batch_size"] = _problem(
                "batch_below_peer", "must be at least one peer's batch (per_device_batch_size × "
                "gradient_accumulation_steps = {peer_batch})", peer_batch=peer_batch)
        if self.warmup_steps >= self.total_steps:
            problems["warmup_steps"] = _problem("warmup_too_long", "must be less than total_steps ({total})",
                                                total=self.total_steps)
        _raise_field_errors(self, problems)
        return self


class AveragingConfig(_Schema):
    """How peers find each other and average gradients and state with hivemind."""

    matchmaking_time: float = Field(5.0, gt=0, le=600, description="Seconds spent forming an averaging group.")
    averaging_timeout: float = Field(60.0, gt=0, le=3600, description="Seconds before an averaging round gives up.")
    target_group_size: int | None = Field(16, ge=2, le=1024, description="Peers per averaging group; empty: no limit.")
    grad_compression: Compression = Field("fp16", description="Compression of averaged gradients.")
    state_compression: Compression = Field("fp16", description="Compression of averaged parameters and state.")
    delay_updates: bool = Field(False, description="Apply updates one step late so averaging overlaps compute.")
    aggregation: Literal["mean", "centered_clip"] = Field(
        "mean", description='How each part of the gradient all-reduce is combined: "mean" (exactly large-batch '
                            'training) or "centered_clip" (a peer sending bad gradients cannot steer the model; docs/trust.md).')
    client_mode: Literal["auto", "always", "never"] = Field(
        "auto", description='"auto": peers that cannot accept connections join as clients.')
    backbone_aggregates: bool = Field(False, description=(
        "Each coordinator's backbone peer also joins gradient rounds as an aggregator, with its declared bandwidth."))
    min_bandwidth_mbps: float = Field(10.0, gt=0, le=100_000, description="Bandwidth expected of a peer, in Mbit/s.")
    checkpoint_every_epochs: int | None = Field(None, ge=1, le=1_000_000, description="Checkpoint every n optimizer steps.")
    checkpoint_every_minutes: float | None = Field(30.0, gt=0, le=10_080, description="Checkpoint at least this often.")
    keep_last_checkpoints: int = Field(3, ge=1, le=1000, description="Recent checkpoints kept.")
    keep_every_nth_checkpoint: int | None = Field(10, ge=1, le=1_000_000, description="Also keep every n-th for good.")

    @model_validator(mode="after")
    def _check_timing(self) -> "AveragingConfig":
        problems = {}
        if self.averaging_timeout <= self.matchmaking_time:
            problems["averaging_timeout"] = _problem("timeout_too_short", "must exceed matchmaking_time ({seconds} s)",
                                                     seconds=f"{self.matchmaking_time:g}")
        if self.checkpoint_every_epochs is None and self.checkpoint_every_minutes is None:
            problems["checkpoint_every_minutes"] = _problem("checkpoint_needed", "set this or checkpoint_every_epochs")
        _raise_field_errors(self, problems)
        return self


class VerificationConfig(_Schema):
    """How the portal confirms credit: spot checks recompute steps each session committed to (docs/trust.md)."""

    spot_checks: bool = Field(True, description="Recompute committed steps before confirming a session's epochs.")
    checks_per_epoch: int = Field(1, ge=1, le=16, description="Micro-batches recomputed per session and epoch.")
    tolerance: float = Field(0.1, gt=0, le=1, description=(
        "Largest fingerprint distance a checked micro-batch may have (honest ones measure up to about 0.02, "
        "faked ones 0.3 and more; docs/benchmarks.md, section 10)."))
    failures_to_suspend: int = Field(2, ge=1, le=100, description="Failed checks after which a session is suspended.")


class RunConfig(_Schema):
    """A run's whole configuration, versioned; defaults mirror sahajBERT."""

    version: Literal[1] = Field(1, description="Schema version of this configuration.")
    model: ModelConfig = Field(default_factory=ModelConfig, description="Model architecture.")
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig, description="Tokenizer.")
    data: DataConfig = Field(default_factory=DataConfig, description="Training data.")
    training: TrainingConfig = Field(default_factory=TrainingConfig, description="Optimization.")
    averaging: AveragingConfig = Field(default_factory=AveragingConfig, description="Collaboration.")
    verification: VerificationConfig = Field(default_factory=VerificationConfig, description="Credit verification.")

    @model_validator(mode="after")
    def _check_sequence_length(self) -> "RunConfig":
        positions = self.model.dimensions()["max_position_embeddings"]
        if self.data.max_seq_length > positions:
            _raise_field_errors(self, {"data.max_seq_length": _problem(
                "sequence_too_long", "must not exceed the model's max_position_embeddings ({positions})",
                positions=positions)})
        return self


def config_errors(data: Any) -> dict[str, list[str]]:
    """Validate a config and return its errors by dotted field path ("__all__" for the whole);
    an empty dict when it is valid."""
    return {path: [error["msg"] for error in errors] for path, errors in config_error_details(data).items()}


def config_error_details(data: Any) -> dict[str, list[dict[str, Any]]]:
    """As `config_errors`, each error as pydantic details it (``type``, ``msg``, ``ctx``), for a
    reader who needs it worded in their own language."""
    try:
        RunConfig.model_validate(data)
    except ValidationError as exc:
        errors: dict[str, list[dict[str, Any]]] = {}
        for error in exc.errors():
            path = ".".join(str(part) for part in error["loc"]) or "__all__"
            errors.setdefault(path, []).append({"type": error["type"], "msg": error["msg"], "ctx": error.get("ctx", {})})
        return errors
    return {}


def config_from_preset(preset: str, **overrides: Mapping[str, Any]) -> RunConfig:
    """A config for a model preset, with sections overridden field by field,
    e.g. ``config_from_preset("tiny", training={"target_batch_size": 64})``."""
    data: dict[str, Any] = {"model": {"preset": preset}}
    for section, fields in overrides.items():
        data[section] = {**data.get(section, {}), **fields} if isinstance(fields, Mapping) else fields
    return RunConfig.model_validate(data)


def changed_fields(old: RunConfig, new: RunConfig) -> set[str]:
    """Dotted paths of the fields whose values differ between two configs."""
    before, after = _flatten(old.model_dump()), _flatten(new.model_dump())
    return {path for path in before.keys() | after.keys() if before.get(path) != after.get(path)}


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class DeviceInfo(_Schema):
    """The accelerator an agent trains on, as it describes itself when joining."""

    kind: Literal["cpu", "cuda", "mps"] = Field(description="Device type.")
    name: str = Field(max_length=200, description='Device name, e.g. "NVIDIA T4" or the CPU model.')
    memory_gb: float | None = Field(None, ge=0, le=100_000, description="Accelerator memory (RAM for a CPU), in GB.")
    precision: Literal["fp32", "fp16", "bf16"] | None = Field(None, description="Precision the agent trains in.")


PeerRole = Literal["trainer", "aggregator"]
# The suffix an aggregator's signed access token carries after the username: every peer that checks
# its membership proof sees the role (usernames cannot contain "#": accounts allow letters, digits and @.+-_).
AGGREGATOR_SUFFIX = "#aggregator"


def access_username(username: str, role: PeerRole) -> str:
    """The username an access token names for a peer of ``role``."""
    return username + AGGREGATOR_SUFFIX if role == "aggregator" else username


def access_role(username: str) -> PeerRole:
    """The role an access token's username names."""
    return "aggregator" if username.endswith(AGGREGATOR_SUFFIX) else "trainer"


# PEP 440 versions in their usual spelling (release, pre, post, dev, local; no epoch): every match is
# a version `packaging` reads, so the portal can compare it with SWARM_COMPATIBLE_SINCE.
AGENT_VERSION_PATTERN = r"^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?(\+[a-z0-9]+(\.[a-z0-9]+)*)?$"


class JoinRequest(_Schema):
    """Body of ``POST /api/v1/runs/{slug}/join``.

    ``key_proof`` proves that the agent holds the private half of ``peer_public_key``: peer keys
    are public (every signed DHT record names one), and the portal credits a session with what
    that key's records announce, so a join with someone else's key must fail.
    """

    peer_public_key: OpenSSHPublicKey = Field(description="The agent's hivemind RSAPublicKey.to_bytes() as text.")
    agent_version: str = Field(max_length=64, pattern=AGENT_VERSION_PATTERN,
                               description="Version of the peer agent, e.g. 0.5.0 (PEP 440, without an epoch).")
    device: DeviceInfo = Field(description="The device the agent trains on.")
    signed_at: AwareDatetime = Field(description="When the agent signed the join (its clock).")
    key_proof: str = Field(max_length=4096, pattern=r"^[A-Za-z0-9+/]+={0,2}$",
                                  description="Base64 RSA-PSS/SHA-256 signature, with the peer key, of join_proof_message.")
    role: PeerRole = Field("trainer", description=(
        "trainer: computes gradients and reports samples. aggregator: only helps average (hivemind's auxiliary "
        "mode), reports no samples and earns no credit; only the run's organizers may join as one."))
    per_device_batch_size: int | None = Field(None, ge=1, le=4096, description=(
        "The agent's --per-device-batch-size when it overrides the run's: the size of its micro-batches, which "
        "its commitments must use and the portal's checks allow for. At most the run's target batch size over "
        "its gradient accumulation steps."))
    replaces_session: int | None = Field(None, ge=1, le=2**31 - 1, description=(
        "The session this agent's previous start in the same environment held, if no agent runs it any more (its "
        "spool is unlocked): a machine that restarts (a notebook's kernel killed, a preempted VM) joins as a new "
        "session, and the portal ends the one it replaces, if the same agent token opened it in this run, so that "
        "the machine does not count twice."))


def join_proof_message(*, run: str, peer_public_key: str, signed_at: datetime) -> bytes:
    """What an agent signs with its hivemind key to join ``run`` (hivemind's ``RSAPrivateKey.sign``):
    the run and the moment bind the signature to this join, so a copy is worth little elsewhere."""
    return f"dedloc-portal join\n{run}\n{signed_at.astimezone(UTC).isoformat()}\n{peer_public_key}".encode()


ACCESS_TOKEN_LABEL = "dedloc-portal/access-token/v1"


def access_token_payload(*, username: str, public_key: bytes, expiration_time: str) -> bytes:
    """The bytes a run's authority signs in a hivemind ``AccessToken``: every field but the
    signature, encoded without ambiguity. The portal signs them (runs/access/authority.py) and every
    peer checks them (peer_agent/authorizer.py)."""
    fields = [ACCESS_TOKEN_LABEL, username, base64.b64encode(public_key).decode(), expiration_time]
    return json.dumps(fields, ensure_ascii=True, separators=(",", ":")).encode()


def expiration_format(timestamp: float) -> str:
    """Write a POSIX time as tokens carry it: naive UTC, ISO 8601, e.g. ``2025-01-31 12:30:00.000000``."""
    moment = datetime.fromtimestamp(timestamp, UTC).replace(tzinfo=None)
    return moment.isoformat(sep=" ", timespec="microseconds")


def expiration_parse(text: str) -> float:
    """Read an ``expiration_time`` back as a POSIX time; ValueError for anything else, time zones included."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is not None:
        raise ValueError(f"expiration_time must be naive UTC, got {text!r}")
    return moment.replace(tzinfo=UTC).timestamp()


class HivemindAccess(_Schema):
    """A hivemind ``AccessToken`` signed by the run's authority, as JSON text.

    The proto's bytes fields travel as ASCII text: ``public_key`` is OpenSSH text and
    ``signature`` is already the base64 that hivemind's ``RSAPrivateKey.sign`` returns.
    """

    username: str = Field(min_length=1, max_length=200, description=(
        'Volunteer the token is issued to, with "#aggregator" appended for an aggregator (access_username).'))
    peer_public_key: OpenSSHPublicKey = Field(description="Peer key the token names (AccessToken.public_key).")
    expiration_time: str = Field(
        max_length=64, description="UTC time in ISO format without offset, as hivemind writes it; signed, so kept verbatim.")
    signature: str = Field(max_length=4096, pattern=r"^[A-Za-z0-9+/]+={0,2}$", description="Authority's base64 signature.")

    @field_validator("expiration_time")
    @classmethod
    def _check_expiration_time(cls, value: str) -> str:
        try:
            expires_at = datetime.fromisoformat(value)
        except ValueError:
            raise PydanticCustomError("expiration_time", "must be an ISO date and time") from None
        if expires_at.tzinfo is not None:
            raise PydanticCustomError("expiration_time", "must be UTC without an offset, as hivemind compares it")
        return value

    @property
    def role(self) -> PeerRole:
        """The role the token names (signed with it)."""
        return access_role(self.username)

    @property
    def expires_at(self) -> datetime:
        """The expiry as an aware datetime."""
        return datetime.fromisoformat(self.expiration_time).replace(tzinfo=UTC)

    def access_token_fields(self) -> dict[str, Any]:
        """Keyword arguments for ``hivemind.proto.auth_pb2.AccessToken``."""
        return dict(username=self.username, public_key=self.peer_public_key.encode("ascii"),
                    expiration_time=self.expiration_time, signature=self.signature.encode("ascii"))


class JoinResponse(_Schema):
    """Answer to a join: everything an agent needs to enter the run's swarm.

    Fields a newer portal adds are ignored, so that it can tell newer agents more without
    breaking older ones; each added field is optional for the same reason.
    """

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)

    session_id: StrictInt = Field(ge=1, le=2**63 - 1, description="Training session to report under.")
    role: PeerRole = Field("trainer", description="The role the session joined as; its access token names it too.")
    run_id: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,100}$", description="The run's hivemind key prefix.")
    config: RunConfig = Field(description="The run's configuration.")
    hivemind_access: HivemindAccess = Field(description="Access token for the run's DHT.")
    authority_public_key: OpenSSHPublicKey = Field(description="Key that verifies every peer's access token.")
    initial_peers: list[Annotated[str, StringConstraints(pattern=r"^/\S+$", max_length=1000)]] = Field(
        max_length=100, description="Multiaddrs of the run's backbone peers.")
    report_url: str = Field(pattern=r"^wss?://\S+$", max_length=2000, description="Websocket for reports.")
    tokenizer_url: str = Field(pattern=r"^https?://\S+$", max_length=2000, description="The run's tokenizer.json.")
    data_files: list[Annotated[str, StringConstraints(pattern=r"^https?://\S+$", max_length=2000)]] = Field(
        default_factory=list, max_length=1000, description="Signed URLs of the run's uploaded text files.")
    checkpoint_url: str | None = Field(None, pattern=r"^https?://\S+$", max_length=2000, description=(
        "Signed URL of the run's newest checkpoint (a zip), if any: an agent that finds no peer to "
        "download the collaboration's state from starts from it."))


MAX_DIALBACK_MADDRS = 8
DialBackMaddr = Annotated[str, StringConstraints(pattern=r"^/\S+$", max_length=400)]


class DialBackRequest(_Schema):
    """An agent asks a backbone peer to dial it back at ``maddrs`` (peer_agent.reachability): its own
    addresses, direct or through this backbone as a relay; the backbone dials nothing else."""

    maddrs: list[DialBackMaddr] = Field(min_length=1, max_length=MAX_DIALBACK_MADDRS,
                                        description="The caller's addresses, each ending in its own /p2p/ id or none.")


class DialBackAnswer(_Schema):
    """Whether a fresh peer on the backbone's host reached the caller at one of the addresses."""

    reachable: bool = Field(description="Whether the fresh peer connected to the caller at one of the addresses.")
    dialed: list[DialBackMaddr] = Field(default_factory=list, max_length=MAX_DIALBACK_MADDRS,
                                        description="The addresses tried, as dialed.")
    refused: list[str] = Field(default_factory=list, max_length=MAX_DIALBACK_MADDRS,
                               description="Addresses not dialed, each with the reason.")
    detail: str = Field("", max_length=2000, description="Why the dial failed, or what refused the request.")


class RefreshResponse(_Schema):
    """Answer to ``POST /api/v1/sessions/{id}/refresh``."""

    hivemind_access: HivemindAccess = Field(description="A fresh access token.")


class MachineCredit(_Schema):
    """Answer to ``GET /api/v1/sessions/{id}/credit``: what this machine (the session's agent token) earned
    in the session's run, its earlier sessions included, as the volunteer's page shows it."""

    samples: int = Field(ge=0, description="Samples the machine reported in the run.")
    confirmed_samples: int = Field(ge=0, description="Of those, in epochs whose checks passed: they earn credit.")
    pending_samples: int = Field(ge=0, description="Not judged yet, or flagged for an organizer.")
    lost_samples: int = Field(ge=0, description="In epochs that earned nothing (the volunteer's page says why).")
    credit: float = Field(ge=0, description="The confirmed samples' credit.")
    credit_pending: float = Field(ge=0, description="What the pending samples earn if confirmed.")


class StepCommitment(_Schema):
    """One micro-batch as the agent commits to it: its place in the session's stream, its samples,
    and the fingerprint of the gradient its loss gave (peer_agent.spotcheck)."""

    cursor: StrictInt = Field(ge=0, le=2**48, description="Micro-batches the session drew before this one.")
    samples: StrictInt = Field(ge=1, le=1_000_000, description="Samples of the micro-batch.")
    fingerprint: str = Field(pattern=r"^[A-Za-z0-9+/]{86}==$",
                             description=f"Base64 of the {FINGERPRINT_WIDTH} float32 values of the gradient's sketch.")
    parameters: str | None = Field(None, pattern=r"^[A-Za-z0-9+/]{86}==$", description=(
        "Base64 of the sketch of the parameters the gradient was computed at, with the fingerprint's cells: on "
        "the first micro-batch of each step, shared by the step's others (agents from 0.9.0 on)."))


class EpochCommitment(_Schema):
    """Every micro-batch a session trained on in one closed epoch, signed with its peer key before the
    portal chooses which to recompute. In stream order, cursors strictly increasing."""

    epoch: StrictInt = Field(ge=0, le=2**31 - 1, description="The collaboration epoch of the steps.")
    micro_batch_size: StrictInt = Field(ge=1, le=4096, description="Rows per micro-batch of the session's stream.")
    shuffle_buffer: StrictInt = Field(ge=1, le=1_000_000, description="The stream's shuffle buffer, as the agent used it.")
    steps: list[StepCommitment] = Field(min_length=1, max_length=MAX_COMMITTED_STEPS,
                                        description="The epoch's micro-batches.")
    signature: str = Field(max_length=4096, pattern=r"^[A-Za-z0-9+/]+={0,2}$",
                           description="Base64 RSA-PSS/SHA-256 signature, with the peer key, of commitment_message.")

    @model_validator(mode="after")
    def _check_order(self) -> "EpochCommitment":
        cursors = [step.cursor for step in self.steps]
        if any(later <= earlier for earlier, later in zip(cursors, cursors[1:], strict=False)):
            _raise_field_errors(self, {"steps": "cursors must strictly increase"})
        return self


def commitment_message(*, run_id: str, session_id: int, commitment: EpochCommitment) -> bytes:
    """What an agent signs with its peer key for a commitment: the run, the session and every field
    but the signature, so that a signature is worth nothing for another session or epoch. Fields an
    agent left out are left out here too, so that an older agent's signature still holds."""
    body = commitment.model_dump(mode="json", exclude={"signature"}, exclude_none=True)
    return f"dedloc-portal commitment\n{run_id}\n{session_id}\n".encode() + json.dumps(
        body, sort_keys=True, separators=(",", ":")).encode()


class Report(_Schema):
    """A progress report an agent sends over ``/ws/agent/``; ``samples`` is the delta since the last."""

    type: Literal["report"] = Field("report", description="Frame type.")
    session_id: StrictInt = Field(ge=1, le=2**63 - 1, description="Session from the join answer.")
    seq: Seq = Field(description="1 for a session's first report, one more for each next.")
    samples: StrictInt = Field(ge=0, le=10_000_000, description="Samples processed since the previous report.")
    steps: StrictInt = Field(ge=0, le=10_000_000, description="Local steps since the previous report.")
    local_epoch: StrictInt = Field(ge=0, le=2**31 - 1, description="Collaboration epoch the peer is in.")
    loss: StrictFiniteFloat | None = Field(None, ge=0, description="Recent training loss, if any.")
    samples_per_second: StrictFiniteFloat = Field(ge=0, le=1_000_000, description="Recent throughput.")
    sent_at: Annotated[AwareDatetime, Field(strict=True)] = Field(description="When the agent sent it.")
    commitment: EpochCommitment | None = Field(None, description=(
        "The steps of an epoch the session closed, for spot checks (agents from 0.6.0 on)."))


class Ack(_Schema):
    """The portal stored report ``seq`` durably (or had stored it before)."""

    type: Literal["ack"] = Field("ack", description="Frame type.")
    seq: Seq = Field(description="Sequence number of the stored report.")


class ErrorFrame(_Schema):
    """The portal refused a frame; ``seq`` is set when the frame carried a readable one."""

    type: Literal["error"] = Field("error", description="Frame type.")
    seq: Seq | None = Field(None, description="Sequence number of the refused report, if known.")
    code: str = Field(max_length=64, description='Machine-readable reason, e.g. "invalid_report".')
    detail: str = Field(max_length=1000, description="What was wrong, for a person.")


class ErrorBody(_Schema):
    """The inside of an API error."""

    code: str = Field(max_length=64, description="Machine-readable reason.")
    detail: str = Field(max_length=1000, description="What was wrong and what to do, for a person.")


class ApiError(_Schema):
    """Every 4xx answer of the JSON API: ``{"error": {"code", "detail"}}``."""

    error: ErrorBody = Field(description="The error.")


def api_error(code: str, detail: str) -> dict[str, Any]:
    """The JSON body of an API error."""
    return ApiError(error=ErrorBody(code=code, detail=detail)).model_dump(mode="json")


class ProtocolError(Exception):
    """A client frame the portal cannot accept; ``code`` is machine-readable, ``detail`` short."""

    def __init__(self, code: str, detail: str, seq: int | None = None):
        super().__init__(f"{code}: {detail}")
        self.code, self.detail, self.seq = code, detail, seq

    def to_frame(self) -> ErrorFrame:
        """The error frame to send back to the agent."""
        return ErrorFrame(seq=self.seq, code=self.code, detail=self.detail[:1000])


def parse_client_frame(text: str) -> Report:
    """Parse a frame an agent sent; raise ProtocolError for anything but a valid report."""
    if len(text) > MAX_FRAME_CHARS:
        raise ProtocolError("too_large", f"frames are limited to {MAX_FRAME_CHARS} characters")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise ProtocolError("bad_json", "the frame is not valid JSON") from None
    if not isinstance(data, dict):
        raise ProtocolError("bad_json", "a frame must be a JSON object")
    if data.get("type") != "report":
        raise ProtocolError("unknown_type", 'the frame\'s "type" must be "report"')
    try:
        # Validated from the text so strict fields follow JSON's rules (datetimes as ISO strings).
        return Report.model_validate_json(text)
    except ValidationError as exc:
        problems = [f"{'.'.join(map(str, e['loc'])) or 'frame'}: {e['msg']}" for e in exc.errors()[:3]]
        raise ProtocolError("invalid_report", "; ".join(problems), seq=_readable_seq(data.get("seq"))) from None


def _readable_seq(value: Any) -> int | None:
    try:
        return _SEQ.validate_python(value)
    except ValidationError:
        return None
