"""Who may open what: every page and endpoint, for anonymous, outsider, the right user and staff."""

import pytest
from django.urls import reverse

from accounts.services import team_create, token_create
from tests.factories import RunFactory

LOGIN = "/accounts/login/"


@pytest.fixture
def world(organizer, volunteer, outsider, staff):
    team = team_create(founder=volunteer, name="Dhaka Compute")
    token, _ = token_create(user=volunteer, name="laptop")
    draft = RunFactory(slug="draft-run", status="draft", organizers=[organizer])
    active = RunFactory(slug="open-run", status="active", organizers=[organizer])
    return {"team": team, "token": token, "draft": draft, "active": active}


PUBLIC_PAGES = ["home", "teams", "login", "signup", "signup-sent", "password_reset"]


@pytest.mark.parametrize("name", PUBLIC_PAGES)
@pytest.mark.parametrize("who", [None, "volunteer"])
def test_public_pages_open_for_everyone(request, client_for, world, name, who):
    user = request.getfixturevalue(who) if who else None
    expected = {200, 302} if name in {"login", "signup"} and user else {200}
    assert client_for(user).get(reverse(name)).status_code in expected


@pytest.mark.parametrize("name", ["tokens", "profile", "team-create", "password_change"])
def test_personal_pages_send_anonymous_visitors_to_log_in(client_for, world, name):
    response = client_for(None).get(reverse(name))
    assert response.status_code == 302
    assert response["Location"].startswith(LOGIN)


@pytest.mark.parametrize("name", ["tokens", "profile", "team-create", "password_change"])
def test_personal_pages_open_for_a_logged_in_volunteer(client_for, volunteer, world, name):
    assert client_for(volunteer).get(reverse(name)).status_code == 200


@pytest.mark.parametrize("action", ["team-join", "team-leave", "team-hand-over", "team-disband"])
def test_team_actions_need_a_login_and_a_post(client_for, volunteer, world, action):
    url = reverse(action, args=[world["team"].slug])
    assert client_for(None).post(url)["Location"].startswith(LOGIN)
    assert client_for(volunteer).get(url).status_code == 405


def test_token_revoke_is_for_the_owner_only(client_for, outsider, staff, world):
    url = reverse("token-revoke", args=[world["token"].pk])
    assert client_for(None).post(url)["Location"].startswith(LOGIN)
    assert client_for(outsider).post(url).status_code == 404
    assert client_for(staff).post(url).status_code == 404  # staff revoke from the admin instead
    world["token"].refresh_from_db()
    assert world["token"].revoked_at is None


def test_a_draft_run_is_visible_to_its_organizers_and_staff_only(client_for, organizer, volunteer, outsider, staff, world):
    url = world["draft"].get_absolute_url()
    assert client_for(None).get(url).status_code == 404
    assert client_for(outsider).get(url).status_code == 404
    assert client_for(volunteer).get(url).status_code == 404
    assert client_for(organizer).get(url).status_code == 200
    assert client_for(staff).get(url).status_code == 200


def test_an_active_run_page_is_public(client_for, world):
    assert client_for(None).get(world["active"].get_absolute_url()).status_code == 200


ADMIN_MODELS = ["accounts/user", "accounts/team", "accounts/teamevent", "accounts/agenttoken", "runs/run"]


@pytest.mark.parametrize("model", ADMIN_MODELS)
def test_the_admin_lists_every_model_for_staff_and_nobody_else(client_for, organizer, volunteer, staff, world, model):
    url = f"/admin/{model}/"
    assert client_for(None).get(url).status_code == 302
    assert client_for(volunteer).get(url).status_code == 302
    assert client_for(organizer).get(url).status_code == 302
    assert client_for(staff).get(url).status_code == 200
    assert client_for(staff).get(url, {"q": "vik"}).status_code == 200


def test_staff_make_an_organizer_by_granting_the_permission_in_the_admin(client_for, staff, volunteer):
    from django.contrib.auth.models import Permission

    permission = Permission.objects.get(codename="organize_runs")
    page = client_for(staff).get(f"/admin/accounts/user/{volunteer.pk}/change/").content.decode()
    assert "Can create and organize training runs" in page
    volunteer.user_permissions.add(permission)
    volunteer = type(volunteer).objects.get(pk=volunteer.pk)
    assert volunteer.is_organizer


def test_staff_can_revoke_tokens_from_the_admin(client_for, staff, world):
    response = client_for(staff).post(
        "/admin/accounts/agenttoken/", {"action": "revoke", "_selected_action": [world["token"].pk]}
    )
    assert response.status_code == 302
    world["token"].refresh_from_db()
    assert world["token"].revoked_at is not None
