"""Baselines that know only how common words are: what a checkpoint must beat before it can be said
to have learnt more than word frequencies (issue 30).

Both are counted on the run's training text as the agents get it (``data_sample`` of
runs/setup/services.py: the uploaded files less their held-out documents, or the first lines of
the hub dataset's training split, as many as the tokenizer learnt from), tokenized as the agents
tokenize it (sentence by sentence, peer_agent/data.py), and scored on the same masked positions
of the same held-out batches as the checkpoints (runs/evaluation/runner.py):

- **unigram**: p(piece) from the pieces' counts, add-one smoothed over the vocabulary so that an
  unseen piece keeps a finite perplexity; its guess is always the commonest piece.
- **bigram**: p(piece | left neighbour), the neighbour as the model sees it, in the masked
  ``input_ids``: where the neighbour is itself masked, or [CLS] or [SEP], the model has no word
  to its left either, and the bigram knows no more than the unigram. Interpolated with the unigram
  by Witten–Bell (a neighbour followed by many different pieces trusts its own counts less),
  which needs no tuned constant.

[CLS], [SEP], [MASK] and [PAD] are never the answer (the masked labels are words), so neither
model gives them probability nor guesses them.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedTokenizerFast

from peer_agent.data import sentences_split


@dataclass
class FrequencyCounts:
    unigram: Counter = field(default_factory=Counter)
    bigram: defaultdict = field(default_factory=lambda: defaultdict(Counter))  # left piece -> following pieces
    vocabulary: int = 0  # pieces a prediction may name


def frequencies_count(*, tokenizer: PreTrainedTokenizerFast, documents: Iterable[str]) -> FrequencyCounts:
    """Counts of pieces and of adjacent pairs of pieces in ``documents``, tokenized as the agents do."""
    never = _never_answered(tokenizer)
    counts = FrequencyCounts(vocabulary=len(tokenizer) - len(never))
    for document in documents:
        sentences = sentences_split(document or "")
        if not sentences:
            continue
        pieces = [piece for ids in tokenizer(sentences, add_special_tokens=False)["input_ids"] for piece in ids
                  if piece not in never]
        counts.unigram.update(pieces)
        for left, piece in zip(pieces, pieces[1:]):
            counts.bigram[left][piece] += 1
    return counts


def _never_answered(tokenizer: PreTrainedTokenizerFast) -> set[int]:
    return {tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.mask_token_id, tokenizer.pad_token_id}


class _Unigram:
    def __init__(self, counts: FrequencyCounts):
        self.counts = counts.unigram
        self.total = sum(self.counts.values()) + counts.vocabulary
        self.commonest = self.counts.most_common(1)[0][0] if self.counts else None

    def probability(self, piece: int) -> float:
        return (self.counts[piece] + 1) / self.total


class _Bigram:
    def __init__(self, counts: FrequencyCounts, unigram: _Unigram):
        self.counts, self.unigram = counts.bigram, unigram
        self.guesses: dict[int, int] = {}

    def probability(self, piece: int, left: int) -> float:
        followers = self.counts.get(left)
        if not followers:
            return self.unigram.probability(piece)
        seen, kinds = sum(followers.values()), len(followers)
        return (followers[piece] + kinds * self.unigram.probability(piece)) / (seen + kinds)

    def guess(self, left: int) -> int | None:
        if left not in self.guesses:
            followers = self.counts.get(left)
            # The unigram's share is the largest for its commonest piece, so the best guess is that
            # piece or one of the neighbour's followers.
            candidates = [*(followers or ()), self.unigram.commonest]
            self.guesses[left] = max(candidates, key=lambda piece: self.probability(piece, left))
        return self.guesses[left]


def frequency_metrics(*, counts: FrequencyCounts, batches: list[dict[str, torch.Tensor]]) -> dict[str, dict]:
    """Per model (``unigram``, ``bigram``): masked-token accuracy, perplexity over the masked tokens,
    and the examples and masked tokens scored, as heldout_metrics (runs/evaluation/runner.py) counts them."""
    unigram = _Unigram(counts)
    bigram = _Bigram(counts, unigram)
    if unigram.commonest is None:
        raise ValueError("the run's training text holds no words to count")
    nll = {"unigram": 0.0, "bigram": 0.0}
    correct = {"unigram": 0, "bigram": 0}
    masked = examples = 0
    for batch in batches:
        examples += len(batch["input_ids"])
        for row, position in (batch["labels"] != -100).nonzero().tolist():
            label, left = int(batch["labels"][row, position]), int(batch["input_ids"][row, position - 1])
            nll["unigram"] -= math.log(unigram.probability(label))
            nll["bigram"] -= math.log(bigram.probability(label, left))
            correct["unigram"] += label == unigram.commonest
            correct["bigram"] += label == bigram.guess(left)
            masked += 1
    if not masked:
        raise ValueError("the held-out batches hold no masked tokens")
    return {model: dict(mlm_accuracy=correct[model] / masked, perplexity=math.exp(nll[model] / masked),
                        examples=examples, masked_tokens=masked) for model in nll}
