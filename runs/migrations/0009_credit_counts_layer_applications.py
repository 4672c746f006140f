"""Credit counts the compute of every application of ALBERT's shared layer and of the attention.

Until now one sample earned 6 × the model's distinct parameters × its tokens / 1e9 credit, which
counts ALBERT's one shared layer once however many times it is applied, and leaves out the
attention's sequence² products. It now earns the GFLOP of the matrix products of a forward and
backward pass (runs/setup/compute.py). This migration multiplies every run's stored credit by that run's
new / old credit per sample and sums the volunteers' and teams' all-runs totals again.
"""

import datetime
import math
from collections import defaultdict

from django.db import migrations
from django.db.models import F
from django.utils import timezone

# peer_agent.protocol's presets and defaults, frozen here
MODEL_PRESETS = {
    "tiny": dict(hidden_size=256, num_hidden_layers=2, intermediate_size=1024, embedding_size=128,
                 max_position_embeddings=512),
    "base": dict(hidden_size=768, num_hidden_layers=12, intermediate_size=3072, embedding_size=128,
                 max_position_embeddings=512),
    "large": dict(hidden_size=1024, num_hidden_layers=24, intermediate_size=4096, embedding_size=128,
                  max_position_embeddings=512),
    "xlarge": dict(hidden_size=2048, num_hidden_layers=24, intermediate_size=8192, embedding_size=128,
                   max_position_embeddings=512),
}
DEFAULT_PRESET, DEFAULT_VOCAB_SIZE, DEFAULT_MAX_SEQ_LENGTH = "large", 32000, 512
CREDIT_FIELDS = ["credit_provisional", "credit_verified", "credit", "credit_24h", "credit_7d"]
PER_RUN_CREDIT = {
    "RunCredit": [*CREDIT_FIELDS, "recent_average_credit"],
    "RunCreditTotal": CREDIT_FIELDS,
    "RunTeamCredit": [*CREDIT_FIELDS, "recent_average_credit"],
    "CreditHour": ["credit"],
    "TeamCreditHour": ["credit"],
}
# All-runs totals: (model, its per-run rows, the owner both name)
ALL_RUNS_TOTALS = [("VolunteerCredit", "RunCredit", "user_id"), ("TeamCredit", "RunTeamCredit", "team_id")]
RAC_HALF_LIFE = datetime.timedelta(days=7)
CHUNK = 2000


def _shape(config):
    """(dimensions, vocabulary, tokens per sample) of a stored run config; None if it names none."""
    model = config.get("model") or {}
    preset = model.get("preset", DEFAULT_PRESET)
    dims = MODEL_PRESETS.get(preset) or {name: model.get(name) for name in MODEL_PRESETS["tiny"]}
    vocab = (config.get("tokenizer") or {}).get("vocab_size", DEFAULT_VOCAB_SIZE)
    seq = (config.get("data") or {}).get("max_seq_length", DEFAULT_MAX_SEQ_LENGTH)
    if None in (*dims.values(), vocab, seq):
        return None
    return dims, vocab, seq


def _credit_by_parameters(dims, V, S):
    """The old runs.credit.credit_per_sample, frozen: 6 × AlbertForMaskedLM parameters × tokens / 1e9."""
    E, H, I, P = dims["embedding_size"], dims["hidden_size"], dims["intermediate_size"], dims["max_position_embeddings"]  # noqa: E741
    parameters = (V * E + P * E + 4 * E) + (E * H + H) + (4 * (H * H + H) + 2 * H) + (H * I + I + I * H + H + 2 * H) \
        + (2 * E + V + H * E + E)
    return 6 * parameters * S / 1e9


def _credit_by_compute(dims, V, S):
    """The new runs.credit.credit_per_sample (runs.compute.training_flops_per_sample / 1e9), frozen."""
    E, H, I, L = dims["embedding_size"], dims["hidden_size"], dims["intermediate_size"], dims["num_hidden_layers"]  # noqa: E741
    forward = S * E * H + L * (4 * S * H * H + 2 * S * S * H + 2 * S * H * I) + S * E * (H + V) + H * H + 2 * H
    return 6 * forward / 1e9


def _ratios(Run):
    """Each run's new / old credit per sample."""
    ratios = {}
    for run_id, config in Run.objects.values_list("pk", "config"):
        shape = _shape(config or {})
        if shape is not None:
            ratios[run_id] = _credit_by_compute(*shape) / _credit_by_parameters(*shape)
    return ratios


def _decayed(average, updated_at, now):
    """runs.credit.rac_now, frozen here: the RAC decayed to ``now``."""
    if updated_at is None:
        return average
    diff = max((now - updated_at).total_seconds(), 0.0)
    return average * math.exp(-diff * math.log(2) / RAC_HALF_LIFE.total_seconds())


def _all_runs_totals_sum(Total, PerRun, owner, now):
    """An all-runs total's credit, the sum of its per-run rows' (RAC decayed to ``now`` first), as
    runs.credit.volunteer_credit_refresh and team_credit_refresh sum them."""
    fields = [*CREDIT_FIELDS, "recent_average_credit"]
    owners = sorted(PerRun.objects.values_list(owner, flat=True).distinct())
    for start in range(0, len(owners), CHUNK):
        chunk = owners[start:start + CHUNK]
        sums = defaultdict(lambda: dict.fromkeys(fields, 0.0))
        for row in PerRun.objects.filter(**{f"{owner}__in": chunk}).values(owner, *fields, "rac_updated_at"):
            total = sums[row[owner]]
            for field in CREDIT_FIELDS:
                total[field] += row[field]
            total["recent_average_credit"] += _decayed(row["recent_average_credit"], row["rac_updated_at"], now)
        rows = list(Total.objects.filter(**{f"{owner}__in": chunk}))
        for row in rows:
            for field, value in sums[getattr(row, owner)].items():
                setattr(row, field, value)
            row.rac_updated_at = now
        Total.objects.bulk_update(rows, [*fields, "rac_updated_at"], batch_size=500)


def _credit_rescale(apps, *, inverse):
    ratios = _ratios(apps.get_model("runs", "Run"))
    for run_id, ratio in ratios.items():
        factor = 1 / ratio if inverse else ratio
        for name, fields in PER_RUN_CREDIT.items():
            apps.get_model("runs", name).objects.filter(run_id=run_id).update(**{field: F(field) * factor for field in fields})
    now = timezone.now()
    for total, per_run, owner in ALL_RUNS_TOTALS:
        _all_runs_totals_sum(apps.get_model("runs", total), apps.get_model("runs", per_run), owner, now)


def credit_rescale(apps, schema_editor):
    _credit_rescale(apps, inverse=False)


def credit_rescale_back(apps, schema_editor):
    _credit_rescale(apps, inverse=True)


class Migration(migrations.Migration):

    dependencies = [
        ('runs', '0008_run_credit_total'),
    ]

    operations = [
        migrations.RunPython(credit_rescale, credit_rescale_back, elidable=True),
    ]
