"""No volunteer appears on a board as another: names that look like one already held, or that hide
characters, are refused wherever a username, display name or team name is set."""

import pytest
from django.urls import reverse

from accounts.models import Team, User

STRONG = "plum-orbit-kettle-93"
HIDDEN = ["\u202evik", "vik\u200bthe brave", "vik\u3164", "\ufeffvik", "vik\u2066x"]


def sign_up(client, username: str):
    return client.post(reverse("signup"), {"username": username, "email": f"{len(username)}@example.org",
                                           "password1": STRONG, "password2": STRONG})


def profile(client, user: User, display_name: str):
    response = client.post(reverse("profile"), {"display_name": display_name, "email": user.email,
                                                "visibility": "public"})
    user.refresh_from_db()
    return response


def found(client, name: str):
    return client.post(reverse("team-create"), {"name": name, "description": ""})


@pytest.mark.parametrize("username", ["\u043elga", "OLGA"])  # Cyrillic о; a change of case
def test_a_username_that_looks_like_another_is_refused_at_sign_up(client, organizer, username):
    response = sign_up(client, username)
    assert "looks too much like a name someone already uses" in response.content.decode()
    assert not User.objects.filter(username=username).exists()


def test_a_display_name_that_looks_like_another_volunteers_is_refused(client_for, volunteer, outsider, organizer):
    profile(client_for(volunteer), volunteer, "Vik the Brave")
    for look_alike in ["Vik th\u0435 Brave", "VIK THE BRAVE", "\u043elga"]:  # Cyrillic е; case; Cyrillic о
        response = profile(client_for(outsider), outsider, look_alike)
        assert "looks too much like a name someone already uses" in response.content.decode()
        assert outsider.display_name == ""


def test_a_team_name_that_looks_like_another_teams_is_refused(client_for, volunteer, outsider):
    found(client_for(volunteer), "Dhaka Compute")
    response = found(client_for(outsider), "Dh\u0430ka Compute")  # Cyrillic а
    assert "looks too much like a name someone already uses" in response.content.decode()
    assert list(Team.objects.values_list("name", flat=True)) == ["Dhaka Compute"]


@pytest.mark.parametrize("name", HIDDEN)
def test_invisible_and_text_direction_characters_are_refused_in_every_name(client, client_for, volunteer, name):
    assert "invisible or text-direction characters" in profile(client_for(volunteer), volunteer, name).content.decode()
    assert volunteer.display_name == ""
    assert "invisible or text-direction characters" in found(client_for(volunteer), name).content.decode()
    assert not Team.objects.exists()


def test_an_invisible_filler_is_refused_in_a_username(client, organizer):
    assert "invisible or text-direction characters" in sign_up(client, "olga\u3164").content.decode()
    assert User.objects.count() == 1


def test_doubled_non_breaking_and_wide_spaces_become_one_ascii_space(client_for, volunteer):
    profile(client_for(volunteer), volunteer, " Vik\u00a0\u00a0the \u3000 \uff22rave ")  # fullwidth Ｂ
    assert volunteer.display_name == "Vik the Brave"
    found(client_for(volunteer), "Dhaka\u00a0 \u202fCompute")
    assert Team.objects.get().name == "Dhaka Compute"


def test_bengali_names_are_accepted_and_kept_apart(client_for, volunteer, outsider, organizer):
    profile(client_for(volunteer), volunteer, "আমিনা 2024")
    profile(client_for(outsider), outsider, "আমিন")
    # ZWJ before a virama draws র‍্য (ra with ya-phala): a joiner that shapes, not one that hides.
    profile(client_for(organizer), organizer, "র\u200d্যাব দল")
    assert (volunteer.display_name, outsider.display_name, organizer.display_name) == (
        "আমিনা 2024", "আমিন", "র\u200d্যাব দল")
    found(client_for(volunteer), "ঢাকা কম্পিউট")
    found(client_for(outsider), "ঢাকা কম্পিউট ২")
    assert Team.objects.count() == 2


def test_a_volunteer_may_rename_themselves_to_a_look_alike_of_their_own_names(client_for, volunteer):
    profile(client_for(volunteer), volunteer, "Vik the Brave")
    profile(client_for(volunteer), volunteer, "VIK the brave")
    assert volunteer.display_name == "VIK the brave"
    profile(client_for(volunteer), volunteer, "Vik")  # their own username, capitalised
    assert volunteer.display_name == "Vik"
