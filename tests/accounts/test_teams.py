"""Teams: founding, joining, leaving, handing over, disbanding, and a history that survives it all."""

from django.urls import reverse

from accounts.models import Team, TeamEvent
from tests.factories import UserFactory


def found(client, name="Dhaka Compute") -> Team:
    client.post(reverse("team-create"), {"name": name, "description": "We train Bengali models."})
    return Team.objects.get(name=name)


def kinds(team: Team) -> list[tuple[str, str]]:
    return [(event.user.username, event.kind) for event in team.events.order_by("at", "id")]


def test_found_join_leave_and_the_history_is_kept(client_for, volunteer, outsider):
    team = found(client_for(volunteer))
    assert team.founder == volunteer
    client_for(outsider).post(reverse("team-join", args=[team.slug]))
    client_for(outsider).post(reverse("team-leave", args=[team.slug]))
    assert kinds(team) == [("vik", "founded"), ("vik", "joined"), ("oscar", "joined"), ("oscar", "left")]
    outsider.refresh_from_db()
    assert outsider.team is None


def test_the_founder_must_hand_over_or_disband_before_leaving(client_for, volunteer):
    team = found(client_for(volunteer))
    response = client_for(volunteer).post(reverse("team-leave", args=[team.slug]), follow=True)
    assert "hand it over to another member or disband it first" in response.content.decode()
    volunteer.refresh_from_db()
    assert volunteer.team == team


def test_hand_over_makes_another_member_the_founder(client_for, volunteer, outsider):
    team = found(client_for(volunteer))
    client_for(outsider).post(reverse("team-join", args=[team.slug]))
    client_for(volunteer).post(reverse("team-hand-over", args=[team.slug]), {"successor": outsider.pk})
    team.refresh_from_db()
    assert team.founder == outsider
    assert TeamEvent.objects.filter(team=team, user=outsider, kind="handed_over").exists()


def test_only_the_founder_can_hand_over_or_disband(client_for, volunteer, outsider):
    team = found(client_for(volunteer))
    client_for(outsider).post(reverse("team-join", args=[team.slug]))
    client_for(outsider).post(reverse("team-hand-over", args=[team.slug]), {"successor": outsider.pk})
    client_for(outsider).post(reverse("team-disband", args=[team.slug]))
    team.refresh_from_db()
    assert team.founder == volunteer and team.is_active


def test_disbanding_removes_every_member_and_keeps_the_history(client_for, volunteer, outsider):
    team = found(client_for(volunteer))
    client_for(outsider).post(reverse("team-join", args=[team.slug]))
    client_for(volunteer).post(reverse("team-disband", args=[team.slug]))
    team.refresh_from_db()
    assert not team.is_active
    assert list(team.members.all()) == []
    assert sorted(kinds(team)[-3:-1]) == [("oscar", "left"), ("vik", "left")]
    assert kinds(team)[-1] == ("vik", "disbanded")
    response = client_for(outsider).post(reverse("team-join", args=[team.slug]), follow=True)
    assert "was disbanded" in response.content.decode()


def test_joining_another_team_leaves_the_first(client_for, volunteer, outsider):
    first = found(client_for(volunteer), "First")
    second = found(client_for(UserFactory()), "Second")
    client_for(outsider).post(reverse("team-join", args=[first.slug]))
    client_for(outsider).post(reverse("team-join", args=[second.slug]))
    outsider.refresh_from_db()
    assert outsider.team == second
    assert ("oscar", "left") in kinds(first)


def test_team_page_respects_each_members_visibility(client, client_for, volunteer):
    team = found(client_for(volunteer))
    anonymous = UserFactory(username="shy", visibility="anonymous")
    hidden = UserFactory(username="ghost", visibility="hidden")
    for member in (anonymous, hidden):
        client_for(member).post(reverse("team-join", args=[team.slug]))
    page = client.get(team.get_absolute_url()).content.decode()
    assert "vik" in page
    assert anonymous.pseudonym in page and "shy" not in page
    assert "ghost" not in page


def test_a_duplicate_team_name_is_shown_beside_the_field(client_for, volunteer, outsider):
    found(client_for(volunteer), "Dhaka Compute")
    response = client_for(outsider).post(reverse("team-create"), {"name": "dhaka compute"})
    assert 'id="name-errors"' in response.content.decode()
