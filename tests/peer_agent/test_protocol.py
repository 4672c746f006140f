"""The run-config schema and the wire messages the portal and the agent share."""

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from peer_agent import protocol
from peer_agent.protocol import (
    MID_RUN_EDITABLE,
    MODEL_DIMENSIONS,
    MODEL_PRESETS,
    Ack,
    HivemindAccess,
    JoinRequest,
    JoinResponse,
    ProtocolError,
    Report,
    RunConfig,
    api_error,
    changed_fields,
    config_errors,
    config_from_preset,
    parse_client_frame,
)

PEER_KEY = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQC7peer+key/A=="
AUTHORITY_KEY = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQDauthority=="

EVERYTHING_CHANGED = {
    "model": {"preset": "custom", "hidden_size": 96, "num_hidden_layers": 3, "num_attention_heads": 3,
              "intermediate_size": 384, "embedding_size": 32, "max_position_embeddings": 256},
    "tokenizer": {"source": "upload", "vocab_size": 4000, "sample_size": 5000, "lowercase": True,
                  "strip_accents": True},
    "data": {"source": "files", "hub": [{"path": "a/b", "name": "c", "split": "validation", "text_column": "body",
                                         "probability": 1.0}], "heldout": "validation_split", "heldout_share": 0.2,
             "shuffle_buffer": 77, "max_seq_length": 128, "mlm_probability": 0.2,
             "short_seq_probability": 0.05},
    "training": {"target_batch_size": 64, "per_device_batch_size": 8, "gradient_accumulation_steps": 2,
                 "optimizer": "lamb", "learning_rate": 0.001, "warmup_steps": 10, "total_steps": 100,
                 "weight_decay": 0.0, "clamp_value": 5.5, "max_grad_norm": 2.5, "precision": "bf16"},
    "averaging": {"matchmaking_time": 1.5, "averaging_timeout": 7.25, "target_group_size": None,
                  "grad_compression": "uniform8bit", "state_compression": "none", "delay_updates": True,
                  "aggregation": "centered_clip",
                  "client_mode": "always", "backbone_aggregates": True, "min_bandwidth_mbps": 2.5,
                  "checkpoint_every_epochs": 5,
                  "checkpoint_every_minutes": None, "keep_last_checkpoints": 2,
                  "keep_every_nth_checkpoint": None},
    "verification": {"spot_checks": False, "checks_per_epoch": 3, "tolerance": 0.2, "failures_to_suspend": 5},
}


def through_json(config: RunConfig) -> RunConfig:
    return RunConfig.model_validate(json.loads(json.dumps(config.model_dump(mode="json"))))


# --- run configuration -------------------------------------------------------------------------


@pytest.mark.parametrize("preset", sorted(MODEL_PRESETS))
def test_every_preset_validates_and_resolves_its_dimensions(preset):
    dims = config_from_preset(preset).model.dimensions()
    assert dims == MODEL_PRESETS[preset]
    assert set(dims) == set(MODEL_DIMENSIONS)
    assert dims["hidden_size"] % dims["num_attention_heads"] == 0


def test_default_config_is_sahajbert():
    config = RunConfig()
    assert config.version == 1
    assert config.model.preset == "large"
    assert config.model.dimensions() == dict(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                             intermediate_size=4096, embedding_size=128,
                                             max_position_embeddings=512)
    assert config.tokenizer.vocab_size == 32000 and not config.tokenizer.strip_accents
    assert config.training.target_batch_size == 4096
    assert config.training.learning_rate == 0.00176
    assert (config.training.warmup_steps, config.training.total_steps) == (5000, 125000)
    assert config.averaging.grad_compression == config.averaging.state_compression == "fp16"


def test_demo_config_is_valid():
    config = config_from_preset("tiny", data={"max_seq_length": 128}, tokenizer={"vocab_size": 4000},
                                training={"target_batch_size": 64, "per_device_batch_size": 8})
    assert config.model.preset == "tiny"
    assert config.data.max_seq_length == 128
    # Untouched fields keep their defaults: a hub source that datasets 5 loads (Parquet files, no script).
    assert [(s.path, s.name, s.split) for s in config.data.hub] == [("wikimedia/wikipedia", "20231101.bn", "train")]


@pytest.mark.parametrize("preset", sorted(MODEL_PRESETS))
def test_json_round_trip_is_lossless_for_every_preset(preset):
    config = config_from_preset(preset)
    assert through_json(config) == config


def test_json_round_trip_is_lossless_with_every_section_changed():
    config = RunConfig.model_validate(EVERYTHING_CHANGED)
    assert config.model_dump(mode="json") == {"version": 1, **EVERYTHING_CHANGED}
    assert through_json(config) == config


def test_preset_dimensions_equal_to_the_preset_are_accepted_and_left_to_the_preset():
    config = config_from_preset("base", model={"hidden_size": 768})
    assert config.model.hidden_size is None
    assert config == config_from_preset("base")


def test_custom_model_uses_its_own_dimensions():
    config = RunConfig.model_validate({"model": EVERYTHING_CHANGED["model"], "data": {"max_seq_length": 256}})
    assert config.model.dimensions() == {
        key: value for key, value in EVERYTHING_CHANGED["model"].items() if key != "preset"}


def test_valid_config_has_no_errors():
    assert config_errors(EVERYTHING_CHANGED) == {}
    assert config_errors({}) == {}


@pytest.mark.parametrize("data, path", [
    ({"model": {"preset": "huge"}}, "model.preset"),
    ({"model": {"preset": "large", "num_attention_heads": 8}}, "model.num_attention_heads"),
    ({"model": {**EVERYTHING_CHANGED["model"], "num_hidden_layers": None}}, "model.num_hidden_layers"),
    ({"model": {**EVERYTHING_CHANGED["model"], "num_attention_heads": 5}}, "model.hidden_size"),
    ({"training": {"target_batch_size": 15, "per_device_batch_size": 8, "gradient_accumulation_steps": 2}},
     "training.target_batch_size"),
    ({"training": {"warmup_steps": 100, "total_steps": 100}}, "training.warmup_steps"),
    ({"averaging": {"matchmaking_time": 30, "averaging_timeout": 30}}, "averaging.averaging_timeout"),
    ({"averaging": {"checkpoint_every_epochs": None, "checkpoint_every_minutes": None}},
     "averaging.checkpoint_every_minutes"),
    ({"data": {"source": "hub", "hub": []}}, "data.hub"),
    ({"data": {"hub": [{"path": ""}]}}, "data.hub.0.path"),
    ({"data": {"hub": [{"path": "a/b", "probability": 0.5}, {"path": "c/d", "probability": 0.4}]}}, "data.hub"),
    ({"data": {"hub": [{"path": "a/b", "probability": 0}]}}, "data.hub.0.probability"),
    ({"data": {"heldout_share": 0}}, "data.heldout_share"),
    ({"data": {"heldout_share": 0.6}}, "data.heldout_share"),
    ({"data": {"heldout": "random"}}, "data.heldout"),
    ({"data": {"max_seq_length": 1024}}, "data.max_seq_length"),
    ({"model": EVERYTHING_CHANGED["model"], "data": {"max_seq_length": 512}}, "data.max_seq_length"),
    ({"tokenizer": {"vocab_size": 99}}, "tokenizer.vocab_size"),
    ({"training": {"learning_rate": float("nan")}}, "training.learning_rate"),
    ({"training": {"momentum": 0.9}}, "training.momentum"),
    ({"telemetry": True}, "telemetry"),
    ({"version": 2}, "version"),
])
def test_invalid_config_reports_the_error_at_the_field_path(data, path):
    errors = config_errors({"data": {"max_seq_length": 128}, **data})
    assert list(errors) == [path]
    assert errors[path] and all(isinstance(message, str) and message for message in errors[path])


def test_custom_model_requires_every_dimension():
    errors = config_errors({"model": {"preset": "custom", "hidden_size": 64}})
    assert set(errors) == {"model.num_hidden_layers", "model.num_attention_heads", "model.intermediate_size",
                           "model.embedding_size", "model.max_position_embeddings"}


def test_config_errors_collects_errors_from_several_sections_at_once():
    errors = config_errors({"training": {"warmup_steps": 10, "total_steps": 5},
                            "averaging": {"matchmaking_time": 9, "averaging_timeout": 3},
                            "tokenizer": {"vocab_size": "many"}})
    assert set(errors) == {"training.warmup_steps", "averaging.averaging_timeout", "tokenizer.vocab_size"}


def test_cross_field_error_message_says_what_to_do():
    errors = config_errors({"training": {"target_batch_size": 8, "per_device_batch_size": 8,
                                         "gradient_accumulation_steps": 2}})
    assert "16" in errors["training.target_batch_size"][0]


def test_config_that_is_not_an_object_is_a_form_wide_error():
    assert list(config_errors(["not", "a", "config"])) == ["__all__"]


def test_config_from_preset_rejects_an_unknown_preset():
    with pytest.raises(ValidationError):
        config_from_preset("enormous")


def test_every_field_of_every_schema_has_help_text():
    schemas = [value for value in vars(protocol).values()
               if isinstance(value, type) and issubclass(value, BaseModel) and value.__module__ == protocol.__name__]
    assert RunConfig in schemas and Report in schemas
    for schema in schemas:
        for name, field in schema.model_fields.items():
            assert field.description, f"{schema.__name__}.{name}"


def test_importing_the_protocol_loads_nothing_heavy():
    probe = "import sys, peer_agent.protocol; print(*sorted({m.split('.')[0] for m in sys.modules}))"
    loaded = set(subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout.split())
    assert loaded.isdisjoint({"torch", "transformers", "hivemind", "django", "datasets", "numpy"})


def test_changed_fields_names_exactly_the_dotted_paths_that_differ():
    old = RunConfig()
    new = config_from_preset("large", averaging={"matchmaking_time": 7.5}, data={"shuffle_buffer": 5})
    assert changed_fields(old, new) == {"averaging.matchmaking_time", "data.shuffle_buffer"}
    assert changed_fields(old, RunConfig()) == set()


def test_changing_every_field_lists_every_field():
    every_field = {f"{section}.{name}" for section, fields in EVERYTHING_CHANGED.items() for name in fields}
    changed = changed_fields(RunConfig(), RunConfig.model_validate(EVERYTHING_CHANGED))
    assert changed == every_field - {"training.optimizer"}  # LAMB is the only optimizer


def test_mid_run_editable_paths_are_real_fields():
    for path in MID_RUN_EDITABLE:
        section, name = path.split(".")
        assert name in RunConfig.model_fields[section].annotation.model_fields, path


def test_mid_run_editable_covers_peer_local_settings_but_not_what_the_model_learns():
    assert {"averaging.matchmaking_time", "averaging.averaging_timeout", "data.shuffle_buffer",
            "training.per_device_batch_size", "training.gradient_accumulation_steps"} <= MID_RUN_EDITABLE
    for frozen in ("model.preset", "tokenizer.vocab_size", "training.target_batch_size",
                   "training.learning_rate", "data.max_seq_length", "data.hub",
                   "data.heldout", "data.heldout_share"):
        assert frozen not in MID_RUN_EDITABLE
    edit = config_from_preset("large", averaging={"client_mode": "never"}, training={"precision": "fp32"})
    assert changed_fields(RunConfig(), edit) <= MID_RUN_EDITABLE


# --- join -------------------------------------------------------------------------------------


def test_join_request_accepts_an_openssh_key_and_a_device():
    request = JoinRequest.model_validate({"peer_public_key": PEER_KEY, "agent_version": "0.1.0",
                                          "device": {"kind": "cuda", "name": "T4", "memory_gb": 15.8,
                                                     "precision": "fp16"},
                                          "signed_at": "2026-12-01T07:00:00Z", "key_proof": "c2lnbmVk"})
    assert request.device.kind == "cuda"


@pytest.mark.parametrize("change", [
    {"peer_public_key": ""},
    {"peer_public_key": "-----BEGIN PUBLIC KEY-----"},
    {"peer_public_key": "ssh-rsa " + "A" * 5000},
    {"agent_version": "x" * 65},
    {"agent_version": "banana"},
    {"agent_version": "1.0 beta"},
    {"signed_at": None},
    {"key_proof": None},
    {"device": {"kind": "tpu", "name": "v4"}},
    {"device": {"kind": "cpu", "name": "x", "serial": "123"}},
    {"device": {"kind": "cpu", "name": "x" * 201}},
    {"device": {"kind": "cpu", "name": "x", "memory_gb": float("inf")}},
])
def test_join_request_rejects_malformed_fields(change):
    body = {"peer_public_key": PEER_KEY, "agent_version": "0.1.0", "device": {"kind": "cpu", "name": "x"},
            "signed_at": "2026-12-01T07:00:00Z", "key_proof": "c2lnbmVk"}
    JoinRequest.model_validate(body)  # valid as it stands: the change alone makes it invalid
    with pytest.raises(ValidationError):
        JoinRequest.model_validate({**body, **change})


def make_access(**changes) -> dict:
    expiry = str(datetime(2030, 1, 1, 12, 30, 0, 123456))
    return {"username": "vik", "peer_public_key": PEER_KEY, "expiration_time": expiry,
            "signature": "c2lnbmF0dXJl", **changes}


def test_hivemind_access_mirrors_the_access_token_fields():
    access = HivemindAccess.model_validate(make_access())
    assert access.expiration_time == "2030-01-01 12:30:00.123456"  # signed text, kept verbatim
    assert access.expires_at == datetime(2030, 1, 1, 12, 30, 0, 123456, tzinfo=UTC)
    assert access.access_token_fields() == {"username": "vik", "public_key": PEER_KEY.encode(),
                                            "expiration_time": access.expiration_time,
                                            "signature": b"c2lnbmF0dXJl"}


def test_access_token_fields_build_a_hivemind_access_token():
    auth_pb2 = pytest.importorskip("hivemind.proto.auth_pb2")
    token = auth_pb2.AccessToken(**HivemindAccess.model_validate(make_access()).access_token_fields())
    assert token.username == "vik" and token.signature == b"c2lnbmF0dXJl"


@pytest.mark.parametrize("change", [
    {"expiration_time": "tomorrow"},
    {"expiration_time": "2030-01-01 12:30:00+00:00"},
    {"signature": "not base64!"},
    {"username": ""},
])
def test_hivemind_access_rejects_malformed_fields(change):
    with pytest.raises(ValidationError):
        HivemindAccess.model_validate(make_access(**change))


def test_join_response_round_trips_through_json():
    response = JoinResponse.model_validate({
        "session_id": 7, "run_id": "bengali-albert", "config": config_from_preset("tiny").model_dump(mode="json"),
        "hivemind_access": make_access(), "authority_public_key": AUTHORITY_KEY,
        "initial_peers": ["/ip4/10.0.0.2/tcp/31337/p2p/QmPeer"], "report_url": "wss://portal.example/ws/agent/",
        "tokenizer_url": "https://portal.example/api/v1/runs/bengali-albert/tokenizer.json",
        "data_files": ["https://portal.example/api/v1/files/signed"]})
    assert JoinResponse.model_validate_json(response.model_dump_json()) == response


def test_join_response_without_a_checkpoint_or_with_fields_from_a_newer_portal_still_parses():
    answer = {"session_id": 7, "run_id": "bengali-albert", "config": config_from_preset("tiny").model_dump(mode="json"),
              "hivemind_access": make_access(), "authority_public_key": AUTHORITY_KEY, "initial_peers": [],
              "report_url": "wss://portal.example/ws/agent/", "tokenizer_url": "https://portal.example/t.json"}
    assert JoinResponse.model_validate(answer).checkpoint_url is None, "an older portal sends no checkpoint"
    newer = JoinResponse.model_validate({**answer, "checkpoint_url": "https://portal.example/c.zip", "later_field": 1})
    assert newer.checkpoint_url == "https://portal.example/c.zip"
    with pytest.raises(ValidationError):
        JoinResponse.model_validate({**answer, "checkpoint_url": "file:///etc/passwd"})


# --- reports ----------------------------------------------------------------------------------


def report_frame(**changes) -> dict:
    frame = {"type": "report", "session_id": 3, "seq": 1, "samples": 128, "steps": 4, "local_epoch": 12,
             "loss": 7.25, "samples_per_second": 31.5, "sent_at": "2025-05-01T12:00:00Z"}
    frame.update(changes)
    return {key: value for key, value in frame.items() if value is not ...}


def test_a_valid_report_is_parsed():
    report = parse_client_frame(json.dumps(report_frame()))
    assert (report.session_id, report.seq, report.samples, report.loss) == (3, 1, 128, 7.25)
    assert report.sent_at == datetime(2025, 5, 1, 12, tzinfo=UTC)


def test_a_report_without_loss_and_with_integer_throughput_is_valid():
    report = parse_client_frame(json.dumps(report_frame(loss=None, samples_per_second=30)))
    assert report.loss is None and report.samples_per_second == 30.0


def test_a_report_the_agent_builds_survives_the_wire():
    report = Report(session_id=1, seq=2, samples=0, steps=0, local_epoch=0, loss=None,
                    samples_per_second=0.0, sent_at=datetime.now(UTC) - timedelta(seconds=1))
    assert parse_client_frame(report.model_dump_json()) == report


@pytest.mark.parametrize("change", [
    {"samples": -1},
    {"samples": True},
    {"seq": True},
    {"session_id": 0},
    {"steps": 1.0},
    {"samples": "128"},
    {"loss": float("nan")},
    {"loss": float("inf")},
    {"samples_per_second": float("-inf")},
    {"samples_per_second": -0.5},
    {"seq": ...},
    {"sent_at": ...},
    {"sent_at": "2025-05-01T12:00:00"},
    {"sent_at": 1746100800},
    {"extra": "field"},
    {"samples": 10**30},
    {"seq": 2**64},
    {"samples_per_second": 1e308},
])
def test_an_invalid_report_is_refused_as_invalid_report(change):
    with pytest.raises(ProtocolError) as caught:
        parse_client_frame(json.dumps(report_frame(**change)))
    assert caught.value.code == "invalid_report"
    assert caught.value.detail and "Traceback" not in caught.value.detail


def test_the_largest_report_an_agent_can_send_fits_in_a_frame():
    # Every field at its bound, every micro-batch with the parameters' sketch (steps of one micro-batch).
    sketch = "A" * 86 + "=="
    steps = [protocol.StepCommitment(cursor=2**48 - protocol.MAX_COMMITTED_STEPS + index, samples=1_000_000,
                                     fingerprint=sketch, parameters=sketch)
             for index in range(protocol.MAX_COMMITTED_STEPS)]
    commitment = protocol.EpochCommitment(epoch=2**31 - 1, micro_batch_size=4096, shuffle_buffer=1_000_000,
                                          steps=steps, signature="A" * 4096)
    frame = report_frame(seq=2**31 - 1, samples=10_000_000, steps=10_000_000, local_epoch=2**31 - 1,
                         commitment=commitment.model_dump(mode="json"))
    text = json.dumps(frame)
    assert len(text) <= protocol.MAX_FRAME_CHARS
    assert parse_client_frame(text).commitment.steps[-1].parameters == sketch


@pytest.mark.parametrize("text, code", [
    ("", "bad_json"),
    ("{not json", "bad_json"),
    ("[" * (protocol.MAX_FRAME_CHARS + 1), "too_large"),
    ("[" * protocol.MAX_FRAME_CHARS + "]" * protocol.MAX_FRAME_CHARS, "too_large"),
    ("[" * 5_000 + "]" * 5_000, "bad_json"),
    ('"report"', "bad_json"),
    ("[]", "bad_json"),
    ("{}", "unknown_type"),
    ('{"type": "ack", "seq": 1}', "unknown_type"),
    ('{"type": ["report"]}', "unknown_type"),
    ("9" * 5000, "bad_json"),
])
def test_frames_that_are_not_reports_are_refused_with_a_code(text, code):
    with pytest.raises(ProtocolError) as caught:
        parse_client_frame(text)
    assert caught.value.code == code


def test_refusal_keeps_a_readable_seq_for_the_error_frame():
    with pytest.raises(ProtocolError) as caught:
        parse_client_frame(json.dumps(report_frame(seq=9, samples=-1)))
    frame = caught.value.to_frame()
    assert (frame.type, frame.seq, frame.code) == ("error", 9, "invalid_report")
    assert "samples" in frame.detail


def test_refusal_of_a_report_with_an_unreadable_seq_has_no_seq():
    with pytest.raises(ProtocolError) as caught:
        parse_client_frame(json.dumps(report_frame(seq=True)))
    assert caught.value.to_frame().seq is None


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)
REPORT_LIKE = st.fixed_dictionaries(
    {"type": st.sampled_from(["report", "report", "ack", "REPORT"])},
    optional={key: JSON_VALUES | st.just(value) for key, value in report_frame().items() if key != "type"},
)


# No deadline: parsing takes microseconds, and Hypothesis' default 200 ms per example fails a run
# whenever a loaded machine pauses this process for longer.
@settings(max_examples=300, deadline=None)
@given(st.text())
def test_parsing_arbitrary_text_yields_a_report_or_a_protocol_error(text):
    try:
        assert isinstance(parse_client_frame(text), Report)
    except ProtocolError as error:
        assert error.code in {"bad_json", "unknown_type", "invalid_report", "too_large"}


@settings(max_examples=300, deadline=None)
@given(REPORT_LIKE | st.dictionaries(st.text(max_size=10), JSON_VALUES, max_size=6) | JSON_VALUES)
def test_parsing_arbitrary_json_yields_a_report_or_a_protocol_error(data):
    try:
        assert isinstance(parse_client_frame(json.dumps(data)), Report)
    except ProtocolError as error:
        assert error.code in {"bad_json", "unknown_type", "invalid_report", "too_large"}


# --- other frames -----------------------------------------------------------------------------


def test_ack_and_api_error_have_the_documented_shapes():
    assert Ack(seq=4).model_dump() == {"type": "ack", "seq": 4}
    assert api_error("run_not_active", 'run "demo" is paused') == {
        "error": {"code": "run_not_active", "detail": 'run "demo" is paused'}}
