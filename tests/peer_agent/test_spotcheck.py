"""Spot checks, the agent's half: micro-batches a validator can rebuild from public seeds, and gradient
fingerprints that tell an honest step from a faked one (peer_agent/spotcheck.py)."""

import json

import pytest
import torch

from peer_agent.data import batches, dataset_stream
from peer_agent.model import model_build
from peer_agent.protocol import EpochCommitment, StepCommitment, VerificationConfig
from peer_agent.spotcheck import BatchReplay, data_seed, fingerprint_distance, parameters_fingerprint, step_fingerprint

pytestmark = pytest.mark.usefixtures("torch_threads")

TOLERANCE = VerificationConfig().tolerance


def _agent_stream(config, tokenizer, data_files, seed, micro_batch_size):
    """The micro-batches as peer_agent.training.Trainer draws them."""
    stream = dataset_stream(config, data_files=data_files, seed=seed)
    return batches(tokenizer, config, stream, micro_batch_size, seed=seed)


def _assert_replays(config, tokenizer, data_files):
    seed = data_seed("run_x", 17)
    drawn = _agent_stream(config, tokenizer, data_files, seed, 4)
    trained = [next(drawn) for _ in range(12)]
    replay = BatchReplay(config, tokenizer, seed=seed, micro_batch_size=4, data_files=data_files)
    for cursor in (2, 3, 9):  # increasing, as a validator asks; skipping what it need not check
        rebuilt = replay.micro_batches(cursor, 2)
        for mine, theirs in zip(rebuilt, trained[cursor:cursor + 2], strict=True):
            assert mine.keys() == theirs.keys()
            assert all(torch.equal(mine[key], theirs[key]) for key in mine), "the same token ids, masks and labels"
    assert torch.equal(replay.micro_batches(0, 1)[0]["input_ids"], trained[0]["input_ids"]), "an earlier cursor starts over"
    other = _agent_stream(config, tokenizer, data_files, data_seed("run_x", 18), 4)
    assert not torch.equal(next(other)["input_ids"], trained[0]["input_ids"]), "another session draws other examples"


def test_a_validator_rebuilds_the_micro_batches_an_agent_drew_from_uploaded_files(tiny_config, tokenizer, corpus_file):
    _assert_replays(tiny_config(), tokenizer, [str(corpus_file)])


def test_a_validator_rebuilds_the_micro_batches_of_a_streamed_dataset(tiny_config, tokenizer, corpus_file, tmp_path):
    # The hub source's own loading code (datasets' streaming), fed a dataset folder the test writes.
    folder = tmp_path / "dataset"
    folder.mkdir()
    documents = corpus_file.read_text(encoding="utf-8").split("\n\n")
    with open(folder / "train.jsonl", "w", encoding="utf-8") as file:
        for document in documents:
            file.write(json.dumps({"content": document}) + "\n")
    config = tiny_config(data=dict(source="hub", hub=[dict(path=str(folder), text_column="content")], heldout_share=0.1))
    _assert_replays(config, tokenizer, None)


def test_a_validator_rebuilds_the_micro_batches_of_a_mixture_of_streamed_datasets(tiny_config, tokenizer, corpus_file,
                                                                                  tmp_path):
    # Two sources mixed by probability and a share held out by hash: all of it drawn from the session's seed.
    documents = corpus_file.read_text(encoding="utf-8").split("\n\n")
    sources = []
    for number, part in enumerate((documents[::2], documents[1::2])):
        folder = tmp_path / f"source-{number}"
        folder.mkdir()
        (folder / "train.jsonl").write_text("".join(json.dumps({"text": document}) + "\n" for document in part))
        sources.append(dict(path=str(folder), probability=(0.7, 0.3)[number]))
    _assert_replays(tiny_config(data=dict(source="hub", hub=sources, heldout_share=0.1)), tokenizer, None)


def test_fingerprints_match_an_honest_recomputation_and_no_shortcut(tiny_config, tokenizer, corpus_file):
    config = tiny_config()
    model = model_build(config, len(tokenizer), pad_token_id=tokenizer.pad_token_id, init_seed=1)
    drawn = _agent_stream(config, tokenizer, [str(corpus_file)], 5, 4)
    step, other = [next(drawn), next(drawn)], [next(drawn), next(drawn)]
    claimed = step_fingerprint(model, step, "run_x", 3)

    assert fingerprint_distance(claimed, step_fingerprint(model, step, "run_x", 3)) == 0.0, "deterministic"
    # A validator whose copy of the parameters went through fp16 (the swarm's state compression).
    rounded = model_build(config, len(tokenizer), pad_token_id=tokenizer.pad_token_id, init_seed=1)
    with torch.no_grad():
        for param in rounded.parameters():
            param.copy_(param.half().float())
    assert fingerprint_distance(claimed, step_fingerprint(rounded, step, "run_x", 3)) < TOLERANCE / 10
    # What a peer that cut corners would have to pass off.
    assert fingerprint_distance(step_fingerprint(model, other, "run_x", 3), claimed) > 3 * TOLERANCE, "other data"
    assert fingerprint_distance(step_fingerprint(model, step[:1], "run_x", 3), claimed) > 3 * TOLERANCE, "half the step"
    assert fingerprint_distance(step_fingerprint(model, step, "run_x", 4), claimed) > 3 * TOLERANCE, "another epoch's sketch"


def test_a_parameters_fingerprint_tells_the_swarms_state_from_a_peer_that_stepped_alone(tiny_config, tokenizer):
    from runs.swarm.spotcheck import STATE_AGREEMENT

    config = tiny_config()
    model = model_build(config, len(tokenizer), pad_token_id=tokenizer.pad_token_id, init_seed=1)
    claimed = parameters_fingerprint(model, "run_x", 3)
    assert fingerprint_distance(claimed, parameters_fingerprint(model, "run_x", 3)) == 0.0, "deterministic"
    held = model_build(config, len(tokenizer), pad_token_id=tokenizer.pad_token_id, init_seed=1)
    with torch.no_grad():
        for param in held.parameters():
            param.copy_(param.half().float())  # the state as the validator downloads it
    assert fingerprint_distance(claimed, parameters_fingerprint(held, "run_x", 3)) < STATE_AGREEMENT / 2
    # One step of its own, 2% of each parameter's size, in a direction drawn from a fixed seed: the
    # distance asserted next is then the same on every run.
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in held.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * param.abs().mean() * 0.02)
    assert 0.005 < fingerprint_distance(claimed, parameters_fingerprint(held, "run_x", 3)) < 0.08


def test_a_commitment_holds_steps_in_stream_order():
    step = dict(samples=8, fingerprint="A" * 86 + "==")
    with pytest.raises(ValueError, match="strictly increase"):
        EpochCommitment(epoch=1, micro_batch_size=4, shuffle_buffer=10, signature="AA==",
                        steps=[StepCommitment(cursor=4, **step), StepCommitment(cursor=4, **step)])
