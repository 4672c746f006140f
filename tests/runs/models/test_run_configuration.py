"""``Run.configuration``: the run's settings typed once per instance, parsed anew when they change."""

import pytest

from peer_agent.protocol import RunConfig
from runs.models import Run
from runs.setup import services
from tests.factories import RunFactory, UserFactory

pytestmark = pytest.mark.django_db


def test_the_configuration_is_parsed_once_and_again_only_for_new_settings(monkeypatch):
    run = RunFactory(status=Run.Status.DRAFT)
    parsed = []
    validate = RunConfig.model_validate
    monkeypatch.setattr(RunConfig, "model_validate", lambda data: parsed.append(data) or validate(data))
    first = run.configuration
    assert run.configuration is first and len(parsed) == 1
    doubled = first.training.target_batch_size * 2
    new = first.model_copy(update={"training": first.training.model_copy(update={"target_batch_size": doubled})})
    services.run_update(run=run, actor=UserFactory(), name=run.name, description=run.description,
                        visibility=run.visibility, config=new)
    assert run.configuration.training.target_batch_size == doubled and len(parsed) == 2
    assert Run.objects.get(pk=run.pk).configuration.training.target_batch_size == doubled
