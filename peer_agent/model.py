"""The ALBERT model a run trains, and the numeric precision a peer trains it in."""

from __future__ import annotations

import logging

import torch
from transformers import AlbertConfig, AlbertForPreTraining

from peer_agent.protocol import RunConfig

logger = logging.getLogger(__name__)

PRECISION_DESCRIPTIONS = {
    "fp32": "32-bit floats: exact and slowest, the choice on a CPU",
    "bf16": "bfloat16 autocast: fast on recent hardware, no loss scaling needed",
    "fp16": "float16 autocast with dynamic loss scaling: fast on any CUDA GPU",
}


def model_build(config: RunConfig, vocab_size: int, *, pad_token_id: int = 0, init_seed: int = 0) -> AlbertForPreTraining:
    """A freshly initialized ``AlbertForPreTraining`` of the run's shape with the tokenizer's vocabulary.

    Weights are drawn from ``init_seed`` so that peers that start a swarm at the same moment,
    before any of them can download the others' state, begin from the same parameters.
    """
    dims = config.model.dimensions()
    albert_config = AlbertConfig(
        vocab_size=vocab_size,
        embedding_size=dims["embedding_size"],
        hidden_size=dims["hidden_size"],
        num_hidden_layers=dims["num_hidden_layers"],
        num_attention_heads=dims["num_attention_heads"],
        intermediate_size=dims["intermediate_size"],
        max_position_embeddings=dims["max_position_embeddings"],
        type_vocab_size=2,
        pad_token_id=pad_token_id,
        # ALBERT's only dropout (p=0.1, in the sentence-order head) off: a step's gradient is then a
        # function of the parameters and the batch alone, which a spot check can recompute on any
        # device (peer_agent/spotcheck.py).
        classifier_dropout_prob=0.0,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(init_seed)
        return AlbertForPreTraining(albert_config)


def parameter_count(model: torch.nn.Module) -> int:
    """Number of distinct trainable values (ALBERT's shared layers count once)."""
    return sum(param.numel() for param in model.parameters())


WIRE_BYTES = {"none": 4, "fp16": 2, "uniform8bit": 1}  # per gradient value averaged, by compression


def averaged_bytes(config: RunConfig) -> int:
    """About how many bytes of gradients one averaging round moves per peer (the model counted on
    the meta device: nothing allocated)."""
    with torch.device("meta"):
        model = model_build(config, config.tokenizer.vocab_size)
    return parameter_count(model) * WIRE_BYTES.get(config.averaging.grad_compression, 2)


def precision_choose(device: torch.device, policy: str) -> str:
    """The precision to train in on ``device`` under the run's policy: "fp32", "fp16" or "bf16".

    ``policy`` is ``config.training.precision``: "auto" picks bf16 on GPUs that support it,
    fp16 (with loss scaling) on other CUDA GPUs and fp32 elsewhere; an explicit choice the
    device cannot honour falls back the same way, with a warning.
    """
    if policy not in ("auto", "fp32", "fp16", "bf16"):
        raise ValueError(f'unknown precision policy {policy!r}; use "auto", "fp32", "fp16" or "bf16"')
    if policy == "fp32":
        return "fp32"
    if device.type != "cuda":
        if policy == "bf16" and device.type == "cpu":
            return "bf16"
        if policy != "auto":
            logger.warning("%s is not available on %s; training in fp32", policy, device.type)
        return "fp32"
    bf16_ok = torch.cuda.is_bf16_supported()
    if policy == "fp16" or (policy == "auto" and not bf16_ok):
        return "fp16"
    if policy == "bf16" and not bf16_ok:
        logger.warning("this GPU does not support bf16; training in fp16 with loss scaling")
        return "fp16"
    return "bf16"


def precision_describe(precision: str) -> str:
    """One line that tells a volunteer what a precision means, e.g. for the start-up banner."""
    return f"{precision}: {PRECISION_DESCRIPTIONS[precision]}"
