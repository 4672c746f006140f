"""The compute a training sample costs (runs/setup/compute.py), against what torch counts on the model
the agent trains, and the migration that rescales credit stored under the old unit."""

import datetime

import pytest
import torch
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone
from torch.utils.flop_counter import FlopCounterMode
from transformers import AlbertConfig, AlbertForMaskedLM

from peer_agent.model import model_build
from peer_agent.protocol import RunConfig, config_from_preset
from runs.credit.rollup import credit_per_sample
from runs.setup.compute import training_flops_per_sample
from runs.setup.forms import preset_config

# Volunteers as they were then too: later columns of theirs have no default in the database.
BEFORE = [("runs", "0008_run_credit_total"), ("accounts", "0002_initial")]
AFTER = [("runs", "0009_credit_counts_layer_applications"), ("accounts", "0002_initial")]


def counted_training_flops(config: RunConfig) -> int:
    """FLOPs torch counts in one forward and backward pass of the agent's model on one sample.
    On the meta device: shapes only, no arithmetic, so even xlarge takes a second. No attention
    mask: a full-length sample has no padding, and masking adds no matrix product."""
    seq = config.data.max_seq_length
    with torch.device("meta"):
        model = model_build(config, config.tokenizer.vocab_size)
        input_ids = torch.zeros((1, seq), dtype=torch.long)
        sentence_order_label = torch.zeros((1,), dtype=torch.long)
    counter = FlopCounterMode(display=False)
    with counter:
        output = model(input_ids=input_ids, token_type_ids=torch.zeros_like(input_ids), labels=input_ids,
                       sentence_order_label=sentence_order_label)
        output.loss.backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("config", [
    pytest.param(preset_config("tiny"), id="tiny-demo-4k-vocab-128-tokens"),
    pytest.param(config_from_preset("tiny"), id="tiny-32k-vocab-512-tokens"),
    pytest.param(config_from_preset("base", data={"max_seq_length": 128}), id="base-128-tokens"),
    pytest.param(config_from_preset("base"), id="base-512-tokens"),
    pytest.param(config_from_preset("large"), id="large-512-tokens"),
    pytest.param(config_from_preset("xlarge", data={"max_seq_length": 64}), id="xlarge-64-tokens"),
    pytest.param(config_from_preset("xlarge"), id="xlarge-512-tokens"),
])
def test_training_flops_per_sample_are_the_matrix_products_torch_counts(config):
    assert training_flops_per_sample(config) == pytest.approx(counted_training_flops(config), rel=0.01)


def test_every_application_of_the_shared_layer_and_the_attention_over_the_sequence_count():
    shallow = config_from_preset("custom", model={
        "hidden_size": 1024, "num_hidden_layers": 1, "num_attention_heads": 16, "intermediate_size": 4096,
        "embedding_size": 128, "max_position_embeddings": 512})
    large = config_from_preset("large")
    short = config_from_preset("large", data={"max_seq_length": 256})
    # Same parameters; 24 applications of the layer instead of one.
    assert training_flops_per_sample(large) > 15 * training_flops_per_sample(shallow)
    # Attention scores grow with the square of the sequence: twice the tokens cost more than twice.
    assert training_flops_per_sample(large) > 2.05 * training_flops_per_sample(short)


def old_credit_per_sample(config: RunConfig) -> float:
    """The unit before migration 0009: 6 × AlbertForMaskedLM's distinct parameters × tokens / 1e9."""
    dims = config.model.dimensions()
    with torch.device("meta"):
        model = AlbertForMaskedLM(AlbertConfig(vocab_size=config.tokenizer.vocab_size, type_vocab_size=2, **dims))
    return 6 * sum(param.numel() for param in model.parameters()) * config.data.max_seq_length / 1e9


CREDIT_FIELDS = ["credit_provisional", "credit_verified", "credit", "credit_24h", "credit_7d"]


def credit_figures(seed: float, *, rac: bool = True) -> dict[str, float]:
    figures = {field: seed * (index + 1) for index, field in enumerate(CREDIT_FIELDS)}
    return {**figures, "recent_average_credit": seed / 2} if rac else figures


def migrate(targets):
    executor = MigrationExecutor(connection)
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


@pytest.mark.django_db(transaction=True)
def test_the_migration_rescales_stored_credit_by_each_runs_new_over_old_credit_per_sample():
    configs = {"demo": preset_config("tiny"), "sahajbert": config_from_preset("large"),
               "short": config_from_preset("base", tokenizer={"vocab_size": 8000}, data={"max_seq_length": 128})}
    ratios = {slug: credit_per_sample(config) / old_credit_per_sample(config) for slug, config in configs.items()}
    now = timezone.now()
    hour = now.replace(minute=0, second=0, microsecond=0) - datetime.timedelta(hours=1)
    apps = migrate(BEFORE)
    try:
        User, Team = apps.get_model("accounts", "User"), apps.get_model("accounts", "Team")
        models = {name: apps.get_model("runs", name) for name in (
            "Run", "RunCredit", "RunCreditTotal", "RunTeamCredit", "CreditHour", "TeamCreditHour", "VolunteerCredit",
            "TeamCredit")}
        vik, ann = (User.objects.create(username=name, email=f"{name}@example.org") for name in ("vik", "ann"))
        team = Team.objects.create(name="Lima", slug="lima")
        runs = {slug: models["Run"].objects.create(name=slug, slug=slug, config=config.model_dump(mode="json"),
                                                   authority_public_key="", authority_private_key=b"")
                for slug, config in configs.items()}
        for seed, run in enumerate(runs.values(), start=1):
            for user in (vik, ann):
                models["RunCredit"].objects.create(run=run, user=user, rac_updated_at=now, **credit_figures(seed * user.pk))
                models["CreditHour"].objects.create(run=run, user=user, hour=hour, samples=1, credit=seed * user.pk)
            models["RunCreditTotal"].objects.create(run=run, **credit_figures(seed * (vik.pk + ann.pk), rac=False))
            models["RunTeamCredit"].objects.create(run=run, team=team, rac_updated_at=now, **credit_figures(seed * 3))
            models["TeamCreditHour"].objects.create(run=run, team=team, hour=hour, samples=1, credit=seed * 3)
        for user in (vik, ann):
            models["VolunteerCredit"].objects.create(user=user, rac_updated_at=now, **credit_figures(1.0))
        models["TeamCredit"].objects.create(team=team, rac_updated_at=now, **credit_figures(1.0))
        stored = {name: {row["id"]: row for row in models[name].objects.values()} for name in models if name != "Run"}

        apps = migrate(AFTER)
        for name in ("RunCredit", "RunCreditTotal", "RunTeamCredit", "CreditHour", "TeamCreditHour"):
            fields = [field for field in (*CREDIT_FIELDS, "recent_average_credit") if field in next(iter(stored[name].values()))]
            for row in apps.get_model("runs", name).objects.select_related("run"):
                for field in fields:
                    expected = stored[name][row.pk][field] * ratios[row.run.slug]
                    assert getattr(row, field) == pytest.approx(expected, rel=1e-4), (name, row.run.slug, field)
        for name, per_run, owner in (("VolunteerCredit", "RunCredit", "user_id"), ("TeamCredit", "RunTeamCredit", "team_id")):
            for row in apps.get_model("runs", name).objects.all():
                rows = [(stored[per_run][pk], ratios[runs_slug]) for pk, runs_slug in apps.get_model("runs", per_run)
                        .objects.filter(**{owner: getattr(row, owner)}).values_list("pk", "run__slug")]
                for field in (*CREDIT_FIELDS, "recent_average_credit"):
                    expected = sum(per_run_row[field] * ratio for per_run_row, ratio in rows)
                    assert getattr(row, field) == pytest.approx(expected, rel=1e-4), (name, field)
        assert ratios["sahajbert"] == pytest.approx(19.44, abs=0.01)

        apps = migrate(BEFORE)
        for name in ("RunCredit", "RunCreditTotal", "RunTeamCredit", "CreditHour", "TeamCreditHour"):
            for row in apps.get_model("runs", name).objects.values():
                for field in (*CREDIT_FIELDS, "recent_average_credit"):
                    if field in row:
                        assert row[field] == pytest.approx(stored[name][row["id"]][field], rel=1e-4), (name, field)
        vik_total = apps.get_model("runs", "VolunteerCredit").objects.get(user_id=vik.pk)
        assert vik_total.credit == pytest.approx(sum(row["credit"] for row in stored["RunCredit"].values()
                                                     if row["user_id"] == vik.pk))
    finally:
        migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())


@pytest.mark.parametrize("dimensions, vocab_size, max_seq_length", [
    (dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, embedding_size=16,
          max_position_embeddings=64), 300, 64),
    (dict(hidden_size=48, num_hidden_layers=3, num_attention_heads=4, intermediate_size=80, embedding_size=24,
          max_position_embeddings=128), 1000, 128),
])
def test_credit_per_sample_is_the_gflop_of_a_training_pass_on_one_sample(dimensions, vocab_size, max_seq_length):
    config = RunConfig.model_validate({"model": {"preset": "custom", **dimensions}, "tokenizer": {"vocab_size": vocab_size},
                                       "data": {"max_seq_length": max_seq_length}})
    assert credit_per_sample(config) == pytest.approx(counted_training_flops(config) / 1e9, rel=0.01)
