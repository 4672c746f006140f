"""Sign-up, login, logout, password change and reset, as server-rendered pages."""

import re

from django.core import mail
from django.test import Client
from django.urls import reverse

from accounts.models import User
from tests.factories import PASSWORD, sign_up

STRONG = "plum-orbit-kettle-93"


def test_sign_up_creates_a_volunteer_from_the_mailed_link_and_logs_them_in(client, db):
    response = sign_up(client, "amina", "amina@example.org", STRONG)
    assert response.status_code == 302
    user = User.objects.get(username="amina")
    assert not user.is_organizer and user.email_verified
    assert user.pseudonym.startswith("volunteer-")
    assert client.get(reverse("tokens")).status_code == 200


def test_sign_up_shows_each_error_beside_its_field(client, volunteer):
    response = client.post(reverse("signup"),
                           {"username": "vik", "email": "not an address", "password1": "123", "password2": "124"})
    page = response.content.decode()
    assert response.status_code == 200
    assert 'id="username-errors"' in page and "looks too much like a name someone already uses" in page
    assert 'id="email-errors"' in page
    assert 'id="password2-errors"' in page
    assert User.objects.count() == 1


def test_sign_up_says_a_username_is_taken_but_never_an_address(client, volunteer):
    """Usernames are public on the boards; addresses are not (tests/security/test_account_enumeration.py)."""
    response = client.post(reverse("signup"),
                           {"username": "VIK", "email": "vik@example.org", "password1": STRONG, "password2": STRONG})
    page = response.content.decode()
    assert 'id="username-errors"' in page and 'id="email-errors"' not in page and "already exists" not in page


def test_a_deployment_without_confirmation_signs_up_at_once_and_says_a_taken_address(client, volunteer, settings):
    settings.ACCOUNT_EMAIL_VERIFICATION_REQUIRED = False
    fields = {"username": "amina", "email": "amina@example.org", "password1": STRONG, "password2": STRONG}
    assert client.post(reverse("signup"), fields)["Location"] == reverse("tokens")
    assert User.objects.filter(username="amina").exists() and mail.outbox == []
    page = Client().post(reverse("signup"), {**fields, "username": "rahim", "email": "VIK@example.org"}).content.decode()
    assert 'id="email-errors"' in page and "An account with this e-mail address already exists" in page


def test_log_in_and_log_out(client, volunteer):
    response = client.post(reverse("login"), {"username": "vik", "password": PASSWORD})
    assert response.status_code == 302
    assert "Log out" in client.get(reverse("home")).content.decode()
    assert client.post(reverse("logout")).status_code == 302
    assert client.get(reverse("tokens")).status_code == 302


def test_a_wrong_password_is_refused_with_a_message(client, volunteer):
    response = client.post(reverse("login"), {"username": "vik", "password": "not it"})
    assert response.status_code == 200
    assert "Please enter a correct username and password" in response.content.decode()


def test_password_change(client_for, volunteer):
    client = client_for(volunteer)
    response = client.post(
        reverse("password_change"), {"old_password": PASSWORD, "new_password1": STRONG, "new_password2": STRONG}
    )
    assert response.status_code == 302
    volunteer.refresh_from_db()
    assert volunteer.check_password(STRONG)


def test_password_reset_mails_a_link_that_sets_a_new_password(client, volunteer):
    client.post(reverse("password_reset"), {"email": "vik@example.org"})
    assert len(mail.outbox) == 1
    link = re.search(r"http://testserver(/accounts/reset/\S+/)", mail.outbox[0].body).group(1)
    form_page = client.get(link, follow=True)
    assert "Choose a new password" in form_page.content.decode()
    client.post(form_page.redirect_chain[-1][0], {"new_password1": STRONG, "new_password2": STRONG})
    volunteer.refresh_from_db()
    assert volunteer.check_password(STRONG)


def test_password_reset_does_not_reveal_whether_an_address_has_an_account(client, db):
    response = client.post(reverse("password_reset"), {"email": "nobody@example.org"})
    assert response.status_code == 302
    assert mail.outbox == []


def test_the_profile_sets_how_a_volunteer_appears_on_boards(client_for, volunteer):
    client = client_for(volunteer)
    client.post(reverse("profile"), {"display_name": "Vik the Brave", "email": "vik@example.org", "visibility": "public"})
    volunteer.refresh_from_db()
    assert volunteer.public_name == "Vik the Brave"
    client.post(reverse("profile"), {"display_name": "Vik the Brave", "email": "vik@example.org", "visibility": "anonymous"})
    volunteer.refresh_from_db()
    assert volunteer.public_name == volunteer.pseudonym
    client.post(reverse("profile"), {"display_name": "", "email": "vik@example.org", "visibility": "hidden"})
    volunteer.refresh_from_db()
    assert volunteer.public_name is None
