"""The password-reset e-mail speaks the language of the page it was asked from."""

import pytest
from django.conf import settings

from tests.factories import UserFactory

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("language", "subject", "words"), [
    ("bn", "আপনার DeDLOC Portal পাসওয়ার্ড রিসেট করুন", "কেউ DeDLOC Portal-এর “amina” অ্যাকাউন্টের পাসওয়ার্ড রিসেট করতে চেয়েছেন।"),
    ("en", "Reset your DeDLOC Portal password", "Someone asked to reset the password of the DeDLOC Portal account “amina”."),
])
def test_the_reset_email_reads_in_the_askers_language(client, mailoutbox, language, subject, words):
    UserFactory(username="amina")
    client.cookies[settings.LANGUAGE_COOKIE_NAME] = language
    assert client.post("/accounts/password_reset/", {"email": "amina@example.org"}).status_code == 302
    (mail,) = mailoutbox
    assert mail.subject == subject
    assert words in mail.body and "/accounts/reset/" in mail.body
