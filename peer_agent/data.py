"""Training examples for ALBERT: masked-LM plus sentence-order prediction (SOP), streamed.

Each peer streams documents with ``datasets`` (nothing is downloaded in full), shuffles them
with its own seed, splits them into sentences, cuts consecutive sentences into pairs
``[CLS] A [SEP] B [SEP]`` (half of them swapped: ``sentence_order_label`` 1) and masks 15% of
the tokens for masked-LM, as ALBERT was pretrained (Lan et al., 2019).
"""

from __future__ import annotations

import itertools
import logging
import random
import re
from collections.abc import Iterable, Iterator

import datasets
import fsspec
import torch
from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

from peer_agent.protocol import RunConfig
from peer_agent.sources import hub_documents

logger = logging.getLogger(__name__)

# Sentence ends: Latin punctuation and the Bengali/Devanagari danda and double danda.
_SENTENCE_END = re.compile(r"(?<=[.!?\u0964\u0965])\s+")
Pair = tuple[list[int], list[int], int]


def dataset_stream(config: RunConfig, *, data_files: list[str] | None, seed: int,
                   http_headers: dict[str, str] | None = None) -> datasets.IterableDataset:
    """The run's documents as a shuffled stream of ``{"text": document}``.

    ``config.data.source`` "hub" streams the run's Hugging Face datasets, mixed by their
    probabilities (peer_agent/sources.py), less the documents held out for the evaluation
    (``DataConfig.holds_out``); "files" reads text files (local paths or http(s) URLs the portal
    serves) that hold one sentence per line with documents separated by blank lines; ``http_headers``
    (e.g. an Authorization header) go with each http(s) request. Each peer passes its own ``seed``
    so peers see different orders; the same ``seed`` gives the same stream, which the spot-check
    replay relies on.
    """
    data = config.data
    if data.source == "hub":
        stream = hub_documents(data, seed=seed)
        if data.heldout == "hash":
            stream = stream.filter(lambda row: not data.holds_out(row["text"] or ""))
    else:
        if not data_files:
            raise ValueError('the run reads uploaded text files (data source "files") but none were given')
        # Not load_dataset("text", streaming=True): with datasets 5.2 and fsspec 2026 it passes the
        # text encoding on to aiohttp and fails on every http(s) URL.
        stream = datasets.IterableDataset.from_generator(
            _file_documents, features=datasets.Features({"text": datasets.Value("string")}),
            gen_kwargs=dict(paths=list(data_files), http_headers=dict(http_headers or {})))
    return stream.shuffle(seed=seed, buffer_size=data.shuffle_buffer)


def _file_documents(paths: list[str], http_headers: dict[str, str]) -> Iterator[dict[str, str]]:
    for path in paths:
        options = dict(headers=http_headers) if path.startswith(("http://", "https://")) else {}
        # block_size=0 reads an http(s) file as one sequential stream, without range requests.
        with fsspec.open(path, "rt", encoding="utf-8", block_size=0, **options) as file:
            lines: list[str] = []
            for line in itertools.chain(file, [""]):
                if line.strip():
                    lines.append(line.rstrip("\n"))
                elif lines:
                    yield {"text": "\n".join(lines)}
                    lines = []


def sentences_split(document: str) -> list[str]:
    """A document's sentences: its lines, further split after sentence-ending punctuation."""
    return [part.strip() for line in document.splitlines() for part in _SENTENCE_END.split(line) if part.strip()]


def sentence_pairs(segments: list[list[int]], max_tokens: int, short_seq_probability: float,
                   rng: random.Random) -> Iterator[Pair]:
    """Sentence-order pairs ``(A, B, label)`` from one document's tokenized sentences.

    Consecutive sentences are gathered until they fill ``max_tokens`` (sometimes a shorter
    random target, so the model also sees short inputs), split at a random sentence boundary
    into A and B, and swapped half of the time (label 1).
    """
    target = _target_length(max_tokens, short_seq_probability, rng)
    chunk: list[list[int]] = []
    length = 0
    for index, segment in enumerate(segments):
        chunk.append(segment)
        length += len(segment)
        if length >= target or index == len(segments) - 1:
            pair = _pair_from_chunk(chunk, max_tokens, rng)
            if pair is not None:
                yield pair
            chunk, length = [], 0
            target = _target_length(max_tokens, short_seq_probability, rng)


def _target_length(max_tokens: int, short_seq_probability: float, rng: random.Random) -> int:
    return rng.randint(2, max_tokens) if rng.random() < short_seq_probability else max_tokens


def _pair_from_chunk(chunk: list[list[int]], max_tokens: int, rng: random.Random) -> Pair | None:
    if len(chunk) >= 2:
        a_end = rng.randint(1, len(chunk) - 1)
        first = [token for segment in chunk[:a_end] for token in segment]
        second = [token for segment in chunk[a_end:] for token in segment]
    else:
        tokens = chunk[0]
        if len(tokens) < 2:
            return None
        cut = rng.randint(1, len(tokens) - 1)
        first, second = tokens[:cut], tokens[cut:]
    while len(first) + len(second) > max_tokens:
        longer = first if len(first) >= len(second) else second
        # Trimming either end at random, as BERT does, avoids a bias towards sentence starts.
        del longer[0 if rng.random() < 0.5 else -1]
    if rng.random() < 0.5:
        return second, first, 1
    return first, second, 0


def example_encode(pair: Pair, tokenizer: PreTrainedTokenizerFast, max_seq_length: int) -> dict[str, list[int]]:
    """``[CLS] A [SEP] B [SEP]`` padded to ``max_seq_length``, with segment ids and masks."""
    first, second, label = pair
    ids = [tokenizer.cls_token_id, *first, tokenizer.sep_token_id, *second, tokenizer.sep_token_id]
    types = [0] * (len(first) + 2) + [1] * (len(second) + 1)
    special = [1] + [0] * len(first) + [1] + [0] * len(second) + [1]
    padding = max_seq_length - len(ids)
    return dict(
        input_ids=ids + [tokenizer.pad_token_id] * padding,
        token_type_ids=types + [0] * padding,
        attention_mask=[1] * len(ids) + [0] * padding,
        special_tokens_mask=special + [1] * padding,
        sentence_order_label=label,
    )


def batches(tokenizer: PreTrainedTokenizerFast, config: RunConfig, stream: Iterable[dict], batch_size: int, *,
            seed: int = 0, passes: int | None = None) -> Iterator[dict[str, torch.Tensor]]:
    """Masked-LM + SOP batches: ``input_ids``, ``attention_mask``, ``token_type_ids``, ``labels``
    (-100 where no token was masked) and ``sentence_order_label``, each ``batch_size`` rows of
    ``config.data.max_seq_length`` tokens.

    Runs over the stream ``passes`` times (forever when None), reshuffling it each pass.
    ``seed`` drives pairing, masking and a small example-level shuffle.
    """
    rng = random.Random(seed)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=config.data.mlm_probability)
    # Set directly: the collator's own seed= option refuses to run outside the main process.
    collator.generator = torch.Generator().manual_seed(seed)
    pool: list[dict] = []
    pool_size = max(8 * batch_size, 64)
    for example in _examples(tokenizer, config, stream, rng, passes):
        pool.append(example)
        if len(pool) >= pool_size:
            yield _collate([_pop_random(pool, rng) for _ in range(batch_size)], collator)
    rng.shuffle(pool)
    while len(pool) >= batch_size:
        yield _collate([pool.pop() for _ in range(batch_size)], collator)


def _examples(tokenizer: PreTrainedTokenizerFast, config: RunConfig, stream: Iterable[dict], rng: random.Random,
              passes: int | None) -> Iterator[dict]:
    max_tokens = config.data.max_seq_length - 3
    completed = 0
    while passes is None or completed < passes:
        if hasattr(stream, "set_epoch"):
            stream.set_epoch(completed)
        produced = 0
        for document in stream:
            sentences = sentences_split(document["text"] or "")
            if not sentences:
                continue
            segments = [ids for ids in tokenizer(sentences, add_special_tokens=False)["input_ids"] if ids]
            for pair in sentence_pairs(segments, max_tokens, config.data.short_seq_probability, rng):
                produced += 1
                yield example_encode(pair, tokenizer, config.data.max_seq_length)
        if not produced:
            raise ValueError("the training data holds no usable text: every document was empty or too short")
        completed += 1
        logger.info("Finished pass %d over the training data (%d examples); reshuffling", completed, produced)


def _pop_random(pool: list, rng: random.Random):
    index = rng.randrange(len(pool))
    pool[index], pool[-1] = pool[-1], pool[index]
    return pool.pop()


def _collate(examples: list[dict], collator: DataCollatorForLanguageModeling) -> dict[str, torch.Tensor]:
    batch = {key: torch.tensor([example[key] for example in examples])
             for key in ("input_ids", "token_type_ids", "attention_mask", "special_tokens_mask", "sentence_order_label")}
    batch["input_ids"], batch["labels"] = collator.torch_mask_tokens(
        batch["input_ids"], special_tokens_mask=batch.pop("special_tokens_mask"))
    return batch
