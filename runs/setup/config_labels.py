"""The run form's label and help for each field of the run configuration, in the reader's language.

The English help is the field's description in `peer_agent.protocol.RunConfig` (the agent and the
API schema read it there; the agent cannot import Django's translations), repeated here as literals so
that `make messages` gathers them; tests/runs/setup/test_run_form_i18n.py holds the two equal and this table
complete."""

from django.utils.translation import gettext_lazy as _

FIELDS = {
    "model.preset": (_("Preset"), _('Model size; "large" is sahajBERT. Choose "custom" to set every dimension.')),
    "model.hidden_size": (_("Hidden size"), _("Width of each layer (custom preset).")),
    "model.num_hidden_layers": (_("Hidden layers"), _("Layers; ALBERT shares one set of weights.")),
    "model.num_attention_heads": (_("Attention heads"), _("Attention heads; must divide hidden_size.")),
    "model.intermediate_size": (_("Intermediate size"), _("Width of each feed-forward block.")),
    "model.embedding_size": (_("Embedding size"), _("Width of the factorized token embeddings.")),
    "model.max_position_embeddings": (_("Max position embeddings"), _("Longest input, in tokens.")),
    "tokenizer.source": (_("Source"), _('"train" on a sample of the run\'s data, or "upload" a tokenizer.json.')),
    "tokenizer.vocab_size": (_("Vocabulary size"), _("Number of tokens in the vocabulary.")),
    "tokenizer.sample_size": (_("Sample size"), _("Lines of data the tokenizer trains on.")),
    "tokenizer.lowercase": (_("Lowercase"), _("Lowercase text before tokenizing.")),
    "tokenizer.strip_accents": (_("Strip accents"), _("Remove accents (keep off for Bengali vowel signs).")),
    "data.source": (_("Source"), _('"hub" streams Hugging Face datasets; "files" uses text files uploaded to the run.')),
    "data.hub": (_("Hub sources"), _('One dataset a line: id | configuration | split | text column | probability, e.g. '
                                     '"wikimedia/wikipedia | 20231101.bn | train | text | 1". Datasets stored as Parquet '
                                     'or Arrow files; the probabilities add up to 1.')),
    "data.heldout": (_("Held out by"), _('"hash": a share of the documents, chosen by a hash of their text, that no '
                                         'agent is sent; "validation_split": the sources\' validation split.')),
    "data.heldout_share": (_("Held-out share"), _("Share of the documents held out by hash.")),
    "data.shuffle_buffer": (_("Shuffle buffer"), _("Examples held in memory to shuffle.")),
    "data.max_seq_length": (_("Max sequence length"), _("Tokens per training example.")),
    "data.mlm_probability": (_("Masked-LM probability"), _("Share of tokens masked for masked-LM.")),
    "data.short_seq_probability": (_("Short sequence probability"), _("Chance of a shorter example, as in BERT.")),
    "training.target_batch_size": (_("Target batch size"), _("Samples all peers gather per optimizer step.")),
    "training.per_device_batch_size": (_("Per device batch size"), _("Samples per forward pass on one peer.")),
    "training.gradient_accumulation_steps": (_("Gradient accumulation steps"),
                                             _("Forward passes accumulated per local step.")),
    "training.optimizer": (_("Optimizer"), _("Optimizer; LAMB as in sahajBERT.")),
    "training.learning_rate": (_("Learning rate"), _("Peak learning rate.")),
    "training.warmup_steps": (_("Warm-up steps"), _("Optimizer steps of linear warm-up.")),
    "training.total_steps": (_("Total steps"), _("Optimizer steps in the schedule.")),
    "training.weight_decay": (_("Weight decay"), _("LAMB weight decay.")),
    "training.clamp_value": (_("Clamp value"), _("LAMB trust-ratio clamp.")),
    "training.max_grad_norm": (_("Max gradient norm"), _("Gradients are clipped to this norm.")),
    "training.precision": (_("Precision"),
                           _('"auto": fp16 with loss scaling on CUDA, bf16 where supported, fp32 on CPU.')),
    "averaging.matchmaking_time": (_("Matchmaking time"), _("Seconds spent forming an averaging group.")),
    "averaging.averaging_timeout": (_("Averaging timeout"), _("Seconds before an averaging round gives up.")),
    "averaging.target_group_size": (_("Target group size"), _("Peers per averaging group; empty: no limit.")),
    "averaging.grad_compression": (_("Gradient compression"), _("Compression of averaged gradients.")),
    "averaging.state_compression": (_("State compression"), _("Compression of averaged parameters and state.")),
    "averaging.delay_updates": (_("Delay updates"), _("Apply updates one step late so averaging overlaps compute.")),
    "averaging.aggregation": (_("Aggregation"), _(
        'How each part of the gradient all-reduce is combined: "mean" (exactly large-batch training) or '
        '"centered_clip" (a peer sending bad gradients cannot steer the model; docs/trust.md).')),
    "averaging.client_mode": (_("Client mode"), _('"auto": peers that cannot accept connections join as clients.')),
    "averaging.backbone_aggregates": (_("Backbone peers aggregate"), _(
        "Each coordinator's backbone peer also joins gradient rounds as an aggregator, with its declared bandwidth.")),
    "averaging.min_bandwidth_mbps": (_("Minimum bandwidth (Mbit/s)"), _("Bandwidth expected of a peer, in Mbit/s.")),
    "averaging.checkpoint_every_epochs": (_("Checkpoint every n epochs"), _("Checkpoint every n optimizer steps.")),
    "averaging.checkpoint_every_minutes": (_("Checkpoint every n minutes"), _("Checkpoint at least this often.")),
    "averaging.keep_last_checkpoints": (_("Keep last checkpoints"), _("Recent checkpoints kept.")),
    "averaging.keep_every_nth_checkpoint": (_("Keep every n-th checkpoint"), _("Also keep every n-th for good.")),
    "verification.spot_checks": (_("Spot checks"), _("Recompute committed steps before confirming a session's epochs.")),
    "verification.checks_per_epoch": (_("Checks per epoch"), _("Micro-batches recomputed per session and epoch.")),
    "verification.tolerance": (_("Tolerance"), _(
        "Largest fingerprint distance a checked micro-batch may have (honest ones measure up to about 0.02, "
        "faked ones 0.3 and more; docs/benchmarks.md, section 10).")),
    "verification.failures_to_suspend": (_("Failures to suspend"), _("Failed checks after which a session is suspended.")),
}
