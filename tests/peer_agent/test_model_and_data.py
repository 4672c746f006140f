"""The model, the masked-LM + sentence-order data pipeline, LAMB and its schedule (no swarm)."""

import functools
import http.server
import math
import random
import threading
from itertools import islice

import datasets
import pytest
import torch

from peer_agent.data import batches, dataset_stream, sentence_pairs, sentences_split
from peer_agent.model import model_build, parameter_count, precision_choose, precision_describe
from peer_agent.optim import Lamb, parameter_groups, schedule_build
from peer_agent.protocol import config_from_preset
from peer_agent.training import state_download_timeout


def one_pass(tokenizer, config, corpus_file, seed=0, batch_size=4):
    stream = dataset_stream(config, data_files=[str(corpus_file)], seed=seed)
    return list(batches(tokenizer, config, stream, batch_size, seed=seed, passes=1))


# --- model ---------------------------------------------------------------------------------------

def test_model_has_the_configured_dimensions_and_the_tokenizers_vocabulary(tiny_config, tokenizer):
    model = model_build(tiny_config(), len(tokenizer))

    assert (model.config.hidden_size, model.config.num_hidden_layers, model.config.num_attention_heads,
            model.config.intermediate_size, model.config.embedding_size,
            model.config.max_position_embeddings) == (32, 2, 2, 64, 16, 64)
    assert model.albert.embeddings.word_embeddings.num_embeddings == len(tokenizer)
    assert model.predictions.decoder.out_features == len(tokenizer)


def test_large_preset_is_sahajbert_sized():
    model = model_build(config_from_preset("large"), 32000)

    assert model.config.num_hidden_layers == 24 and model.config.hidden_size == 1024
    assert 17_500_000 < parameter_count(model) < 18_500_000


def test_peers_of_a_run_initialize_identically_unless_seeded_apart(tiny_config, tokenizer):
    first, second, other = (model_build(tiny_config(), len(tokenizer), init_seed=seed) for seed in (7, 7, 8))

    assert all(torch.equal(a, b) for a, b in zip(first.parameters(), second.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(first.parameters(), other.parameters()))


def test_precision_follows_the_device_and_the_policy(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert precision_choose(cpu, "auto") == "fp32"
    assert precision_choose(cpu, "fp16") == "fp32"
    assert precision_choose(cpu, "bf16") == "bf16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)
    assert precision_choose(cuda, "auto") == "bf16"
    assert precision_choose(cuda, "fp16") == "fp16"
    assert precision_choose(cuda, "fp32") == "fp32"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: False)
    assert precision_choose(cuda, "auto") == "fp16"
    assert precision_choose(cuda, "bf16") == "fp16"
    assert "loss scaling" in precision_describe("fp16") and "\n" not in precision_describe("bf16")
    with pytest.raises(ValueError, match="unknown precision"):
        precision_choose(cpu, "fp8")


# --- data ----------------------------------------------------------------------------------------

def test_batches_hold_the_model_inputs_at_the_configured_length(tiny_config, tokenizer, corpus_file):
    config = tiny_config()
    found = one_pass(tokenizer, config, corpus_file)

    assert len(found) > 20
    for batch in found:
        assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels", "sentence_order_label"}
        for key in ("input_ids", "attention_mask", "token_type_ids", "labels"):
            assert batch[key].shape == (4, 32) and batch[key].dtype == torch.long
        assert batch["sentence_order_label"].shape == (4,)
    loss = model_build(config, len(tokenizer))(**found[0]).loss
    assert torch.isfinite(loss)


def test_examples_are_cls_a_sep_b_sep_with_segment_ids(tiny_config, tokenizer, corpus_file):
    for batch in one_pass(tokenizer, tiny_config(), corpus_file)[:10]:
        for ids, types, mask, labels in zip(batch["input_ids"].tolist(), batch["token_type_ids"].tolist(),
                                            batch["attention_mask"].tolist(), batch["labels"].tolist()):
            length = sum(mask)
            # Masking may put a random token, even [SEP], in a masked position: look past those.
            seps = [i for i in range(length) if ids[i] == tokenizer.sep_token_id and labels[i] == -100]
            assert ids[0] == tokenizer.cls_token_id and len(seps) == 2 and seps[1] == length - 1
            assert types == [0] * (seps[0] + 1) + [1] * (length - seps[0] - 1) + [0] * (32 - length)
            assert mask == [1] * length + [0] * (32 - length)
            assert set(ids[length:]) <= {tokenizer.pad_token_id}


def test_about_fifteen_percent_of_tokens_are_masked_and_only_they_carry_labels(tiny_config, tokenizer, corpus_file):
    found = one_pass(tokenizer, tiny_config(), corpus_file)
    ids = torch.cat([batch["input_ids"] for batch in found])
    labels = torch.cat([batch["labels"] for batch in found])
    mask = torch.cat([batch["attention_mask"] for batch in found]).bool()
    masked = labels != -100
    last = mask.sum(dim=1) - 1

    assert not (masked & ~mask).any() and not masked[:, 0].any(), "padding and [CLS] are never masked"
    assert not masked[torch.arange(len(ids)), last].any(), "nor the closing [SEP]"
    assert 0.12 < masked.sum() / (mask.sum() - 3 * len(ids)) < 0.18
    assert 0.7 < (ids[masked] == tokenizer.mask_token_id).float().mean() < 0.9
    assert not (ids[~masked] == tokenizer.mask_token_id).any()


def test_sentence_order_labels_mark_swapped_pairs_and_both_classes_occur(tiny_config, tokenizer, corpus_file):
    segments = [[10, 11], [20, 21, 22], [30], [40, 41], [50, 51, 52]]
    pairs = [pair for seed in range(40)
             for pair in sentence_pairs(segments, max_tokens=20, short_seq_probability=0.0, rng=random.Random(seed))]
    in_order = [token for segment in segments for token in segment]
    for first, second, label in pairs:
        assert (first + second if label == 0 else second + first) == in_order
    assert {label for _, _, label in pairs} == {0, 1}

    labels = torch.cat([batch["sentence_order_label"] for batch in one_pass(tokenizer, tiny_config(), corpus_file)])
    assert 0.3 < labels.float().mean() < 0.7


def test_long_pairs_are_trimmed_to_fit(tiny_config):
    segments = [list(range(100, 140)), list(range(200, 240))]
    for first, second, _ in sentence_pairs(segments, max_tokens=29, short_seq_probability=0.0, rng=random.Random(1)):
        assert len(first) + len(second) <= 29 and first and second


def test_documents_split_into_sentences_including_bengali_danda():
    assert sentences_split("one two. three!\n\nআমি ভাত খাই। তুমি কী খাও?\n") == [
        "one two.", "three!", "আমি ভাত খাই।", "তুমি কী খাও?"]


def test_each_peer_seed_gives_its_own_document_order(tiny_config, corpus_file):
    config = tiny_config(data={"shuffle_buffer": 100})

    def order(seed):
        return [row["text"] for row in dataset_stream(config, data_files=[str(corpus_file)], seed=seed)]

    assert order(1) == order(1)
    assert order(1) != order(2)
    assert sorted(order(1)) == sorted(order(2))
    assert len(order(1)) == 80


def test_a_peer_seed_reproduces_its_pairs_and_masks(tiny_config, tokenizer, corpus_file):
    config = tiny_config()
    same = [one_pass(tokenizer, config, corpus_file, seed=5) for _ in range(2)]
    other = one_pass(tokenizer, config, corpus_file, seed=6)

    assert all(torch.equal(a[key], b[key]) for a, b in zip(*same) for key in a)
    assert not torch.equal(same[0][0]["input_ids"], other[0]["input_ids"])


def test_data_files_stream_over_http_like_local_files(tiny_config, corpus_file):
    handler = functools.partial(_QuietHandler, directory=str(corpus_file.parent))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/{corpus_file.name}"
        config = tiny_config()
        remote = [row["text"] for row in dataset_stream(config, data_files=[url], seed=3)]
        local = [row["text"] for row in dataset_stream(config, data_files=[str(corpus_file)], seed=3)]
    finally:
        server.shutdown()
        server.server_close()
    assert remote == local


def test_hub_source_streams_the_configured_dataset_and_column(tiny_config, monkeypatch):
    calls = []

    def load_dataset(path, name, *, split, streaming):
        calls.append((path, name, split, streaming))
        return datasets.IterableDataset.from_generator(
            lambda: iter([{"id": i, "content": f"sentence {i} ."} for i in range(5)]))

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    config = tiny_config(data={"source": "hub", "hub": [{"path": "wikimedia/wikipedia", "name": "20231101.bn",
                                                         "split": "train", "text_column": "content"}],
                               "heldout": "validation_split"})
    rows = list(dataset_stream(config, data_files=None, seed=0))

    assert calls == [("wikimedia/wikipedia", "20231101.bn", "train", True)]
    assert sorted(row["text"] for row in rows) == [f"sentence {i} ." for i in range(5)]
    assert all(set(row) == {"text"} for row in rows)


def test_files_source_without_files_says_what_is_missing(tiny_config):
    with pytest.raises(ValueError, match="none were given"):
        dataset_stream(tiny_config(), data_files=[], seed=0)


def test_batches_repeat_the_data_when_passes_are_unlimited(tiny_config, tokenizer, corpus_file):
    config = tiny_config()
    per_pass = len(one_pass(tokenizer, config, corpus_file))
    stream = dataset_stream(config, data_files=[str(corpus_file)], seed=0)

    assert len(list(islice(batches(tokenizer, config, stream, 4), 3 * per_pass))) == 3 * per_pass


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


# --- LAMB and its schedule -------------------------------------------------------------------------

def test_lamb_step_matches_a_hand_computed_step():
    weight = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    weight.grad = torch.tensor([0.5, -1.0])
    lr, beta1, beta2, eps, decay = 0.1, 0.9, 0.999, 1e-6, 0.01
    Lamb([weight], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=decay, clamp_value=10.0).step()

    w, g = [1.0, 2.0], [0.5, -1.0]
    m = [(1 - beta1) * x for x in g]
    v = [(1 - beta2) * x * x for x in g]
    update = [mi / (math.sqrt(vi) + eps) + decay * wi for mi, vi, wi in zip(m, v, w)]
    trust = math.hypot(*w) / math.hypot(*update)
    step_size = lr * math.sqrt(1 - beta2) / (1 - beta1)  # debiased, as torch_optimizer.Lamb(debias=True)
    expected = [wi - step_size * trust * ui for wi, ui in zip(w, update)]
    assert weight.detach().tolist() == pytest.approx(expected, rel=1e-5)


def test_lamb_clamps_the_weight_norm_and_uses_ratio_one_for_zero_weights():
    big = torch.nn.Parameter(torch.tensor([30.0, 40.0]))  # norm 50, clamped to 2
    zero = torch.nn.Parameter(torch.zeros(2))
    big.grad, zero.grad = torch.tensor([1.0, 1.0]), torch.tensor([1.0, -1.0])
    Lamb([big, zero], lr=0.1, clamp_value=2.0).step()

    # A first Adam step is (1 - beta1) / sqrt(1 - beta2) times sign(grad) in every element; the trust
    # ratio rescales it to the clamped weight norm 2, or leaves it alone for zero weights.
    adam = (1 - 0.9) / math.sqrt(1 - 0.999)
    step_size = 0.1 * math.sqrt(1 - 0.999) / (1 - 0.9)
    assert big.detach().tolist() == pytest.approx([30 - step_size * math.sqrt(2), 40 - step_size * math.sqrt(2)])
    assert zero.detach().tolist() == pytest.approx([-step_size * adam, step_size * adam], rel=1e-4)


def test_lamb_state_exists_before_the_first_step():
    """hivemind shares optimizer state with newcomers; with state present from the start it
    does not need its "virtual" zero-gradient step, which would decay the weights."""
    weight = torch.nn.Parameter(torch.ones(3))
    state = Lamb([weight]).state_dict()["state"][0]

    assert state["step"].item() == 0 and not state["exp_avg"].any() and not state["exp_avg_sq"].any()


def test_lamb_loads_a_state_into_the_tensors_it_already_has():
    """hivemind's state averager averages the optimizer's own state tensors in place; a state download or a
    checkpoint resume that put new ones in their place would leave it averaging tensors nobody reads."""
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = Lamb([weight])
    held = dict(optimizer.state[weight])
    other = Lamb([torch.nn.Parameter(torch.ones(3))])
    other.param_groups[0]["params"][0].grad = torch.tensor([1.0, -2.0, 3.0])
    other.step()

    optimizer.load_state_dict(other.state_dict())

    state = optimizer.state[weight]
    assert all(state[key] is held[key] for key in ("step", "exp_avg", "exp_avg_sq"))
    assert torch.allclose(state["exp_avg"], torch.tensor([0.1, -0.2, 0.3])) and state["step"].item() == 1


def test_biases_and_layer_norms_are_not_decayed(tiny_config, tokenizer):
    model = model_build(tiny_config(), len(tokenizer))
    decayed, kept = parameter_groups(model, weight_decay=0.01)
    names = {id(param): name for name, param in model.named_parameters()}

    assert decayed["weight_decay"] == 0.01 and kept["weight_decay"] == 0.0
    assert all("bias" in names[id(p)] or "LayerNorm" in names[id(p)] for p in kept["params"])
    assert not any("bias" in names[id(p)] for p in decayed["params"])
    assert len(decayed["params"]) + len(kept["params"]) == len(list(model.parameters()))


def test_schedule_warms_up_linearly_then_decays_to_zero():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = schedule_build(optimizer, warmup_steps=10, total_steps=110)
    rates = []
    for _ in range(111):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()

    assert rates[0] == 0.0 and rates[5] == pytest.approx(0.5) and rates[10] == pytest.approx(1.0)
    assert rates[60] == pytest.approx(0.5) and rates[110] == pytest.approx(0.0)


def test_one_state_download_attempt_lasts_what_the_state_takes_at_1_mbit_plus_a_minute_at_most_hiveminds_600_s():
    small = torch.nn.Linear(100, 40)  # 4,040 parameters: 3 x 32 bits each (the parameter, LAMB's two moments)
    assert state_download_timeout(small) == pytest.approx(60 + 3 * 32 * 4040 / 1e6)
    assert state_download_timeout(torch.nn.Embedding(7_000_000, 1)) == 600.0  # 672 Mbit: hivemind's own limit
