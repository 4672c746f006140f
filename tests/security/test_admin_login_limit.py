"""The admin's log-in page is under the site's log-in limit, per client IP and username, and counts
on the same counter as the site's log-in page."""

import pytest
from django.core.cache import cache
from django.urls import reverse

from tests.factories import PASSWORD

DAY = 86400
ATTACKER = "198.51.100.66"


@pytest.fixture
def limits(settings):
    """A log-in limit of 3 and fresh counters; a day-long window so that no test straddles two."""
    cache.clear()
    settings.RATE_LIMITS = {**settings.RATE_LIMITS, "login": (3, DAY)}
    yield settings.RATE_LIMITS
    cache.clear()


def admin_login(client, username: str, password: str, ip: str = ATTACKER):
    return client.post("/admin/login/", {"username": username, "password": password, "next": "/admin/"},
                       REMOTE_ADDR=ip)


def site_login(client, username: str, password: str, ip: str = ATTACKER):
    return client.post(reverse("login"), {"username": username, "password": password}, REMOTE_ADDR=ip)


def assert_refused_by_the_limit(response, client) -> None:
    assert response.status_code == 429
    assert int(response["Retry-After"]) >= 1
    assert "Too many log-in attempts for this account; try again in" in response.content.decode()
    assert "_auth_user_id" not in client.session


def test_the_admin_login_is_the_admins_own_page(client):
    assert reverse("admin:login") == "/admin/login/"
    page = client.get("/admin/login/")
    assert page.status_code == 200
    assert "admin/login.html" in [template.name for template in page.templates]


def test_guessing_a_staff_password_at_the_admin_login_is_refused_past_the_limit(limits, client, staff):
    for _ in range(3):
        assert admin_login(client, "stella", "wrong").status_code == 200
    assert_refused_by_the_limit(admin_login(client, "stella", PASSWORD), client)  # even the right password


def test_the_admin_and_the_site_login_share_one_count(limits, client, staff):
    assert site_login(client, "stella", "wrong").status_code == 200
    assert admin_login(client, "stella", "wrong").status_code == 200
    assert site_login(client, "stella", "wrong").status_code == 200
    assert_refused_by_the_limit(admin_login(client, "stella", PASSWORD), client)
    assert_refused_by_the_limit(site_login(client, "stella", PASSWORD), client)


def test_the_limit_counts_usernames_in_any_case_as_one(limits, client, staff):
    for username in ("stella", "Stella", "STELLA"):
        assert admin_login(client, username, "wrong").status_code == 200
    assert_refused_by_the_limit(admin_login(client, "stella", PASSWORD), client)


def test_staff_with_the_right_password_under_the_limit_get_in(limits, client, staff):
    for _ in range(2):
        assert admin_login(client, "stella", "wrong").status_code == 200
    response = admin_login(client, "stella", PASSWORD)
    assert response.status_code == 302 and response["Location"] == "/admin/"
    assert client.get("/admin/").status_code == 200


def test_the_attackers_count_locks_out_neither_another_address_nor_another_account(limits, client, staff, volunteer):
    for _ in range(4):
        admin_login(client, "stella", "wrong")
    assert admin_login(client, "stella", PASSWORD, ip="198.51.100.67").status_code == 302
    client.logout()
    other = admin_login(client, "vik", PASSWORD)  # the right password, but vik is no staff
    assert other.status_code == 200 and "for a staff account" in other.content.decode()
