"""The compute a training sample costs, and the pace a run's peers can keep, from its configuration alone.

Light on purpose (no torch, no transformers): the web process prices credit with it, and the ingest
(runs/ingest/reports.py) and the verification (runs/credit/verification.py) judge claims by the same pace.
"""

from peer_agent.protocol import RunConfig

# The backward pass multiplies each matrix product's output gradient by both of its operands:
# twice the forward pass's work, so a training step costs 3 × the forward pass.
FORWARD_AND_BACKWARD = 3
FLOPS_PER_MULTIPLY_ACCUMULATE = 2
SOP_LABELS = 2

# The pace of a run, in epochs of ``target_batch_size`` samples. A peer keeps computing while an averaging
# round is arranged, so it may gather up to RUN_PACE_SLACK × the target in one epoch.
RUN_PACE_SLACK = 2.0
# Epochs an agent may be ahead of the monitor's last reading (at most a minute old): a fast run
# closes an epoch every few seconds, and an agent counts the epoch it is in before the swarm does.
SWARM_EPOCH_AHEAD = 100


def training_flops_per_sample(config: RunConfig) -> float:
    """FLOPs of one training sample (forward and backward pass) of the model the agent trains,
    ``AlbertForPreTraining`` (``peer_agent.model.model_build``): 2 FLOPs per multiply-accumulate of
    every matrix product, and 3 × the forward pass for forward + backward.

    With S tokens per sample (``data.max_seq_length``), the forward pass multiplies-accumulates:

    - the embedding projection E → H at every position: S·E·H;
    - in each of the L = ``num_hidden_layers`` applications of ALBERT's one shared layer: the query,
      key, value and output projections 4·S·H², the attention scores QKᵀ and attention × V 2·S²·H,
      and the feed-forward pair 2·S·H·I;
    - the masked-LM head, dense H → E and decoder E → V at every position (the model computes
      logits for all of them, masked or not): S·E·(H + V);
    - the sentence-order head on the first token: pooler H → H and classifier H → 2.

    Elementwise work (layer norms, softmax, GELU, biases, dropout, the loss) and embedding lookups
    are left out, as ``torch.utils.flop_counter.FlopCounterMode`` leaves them out: they grow with
    S·H, not S·H², and are small next to the matrix products.
    """
    dims = config.model.dimensions()
    E, H, I = dims["embedding_size"], dims["hidden_size"], dims["intermediate_size"]  # noqa: E741
    L, S, V = dims["num_hidden_layers"], config.data.max_seq_length, config.tokenizer.vocab_size
    layer = 4 * S * H * H + 2 * S * S * H + 2 * S * H * I
    forward = S * E * H + L * layer + S * E * (H + V) + H * H + H * SOP_LABELS
    return float(FORWARD_AND_BACKWARD * FLOPS_PER_MULTIPLY_ACCUMULATE * forward)


# The most training compute one device of each kind could deliver, in FLOP/s, set generously above
# the fastest such device sold (2026: a 192-core server CPU with AVX-512 computes ~15 TFLOP/s in
# fp32; a B200 ~2.3 PFLOP/s dense in bf16; an M-series Max GPU ~30 TFLOP/s): an honest agent never
# comes near it, and a claim above it cannot be true whatever the client says about itself.
DEVICE_PEAK_FLOPS = {"cpu": 3e13, "cuda": 5e15, "mps": 1e14}


def samples_per_second_ceiling(config: RunConfig, device_kind: str) -> float:
    """The most samples per second one device of ``device_kind`` could train of this run's model;
    an unknown kind gets the most generous ceiling."""
    peak = DEVICE_PEAK_FLOPS.get(device_kind, max(DEVICE_PEAK_FLOPS.values()))
    return peak / training_flops_per_sample(config)
