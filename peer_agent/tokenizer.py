"""A run's tokenizer wrapped for `transformers` with its special tokens declared.

The special tokens are named once, in peer_agent/protocol.py: the portal trains tokenizers with them
(runs/setup/tokenization.py). `transformers` is imported only when needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

from peer_agent.protocol import CLS, MASK, PAD, SEP, UNK

# transformers 5 leaves token_type_ids out by default; ALBERT's sentence-order head needs them.
MODEL_INPUT_NAMES = ("input_ids", "token_type_ids", "attention_mask")
_DECLARED = {"pad_token": PAD, "unk_token": UNK, "cls_token": CLS, "sep_token": SEP, "mask_token": MASK}


def tokenizer_as_transformers(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """Wrap `tokenizer` for `transformers`, with its pad/unk/cls/sep/mask tokens declared."""
    from transformers import PreTrainedTokenizerFast  # heavy import, only for the agent and checkpointer

    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_input_names=list(MODEL_INPUT_NAMES), **_DECLARED)


def tokenizer_load(path: Path) -> PreTrainedTokenizerFast:
    """The run's ``tokenizer.json`` at ``path``, wrapped for `transformers` like :func:`tokenizer_as_transformers`."""
    # transformers loads only with a run's tokenizer: the CLI imports this module at start (peer_agent/join.py)
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(path), model_input_names=list(MODEL_INPUT_NAMES), **_DECLARED)
