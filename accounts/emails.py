"""The e-mails the portal writes: plain text and HTML, in the volunteer's language (`User.language`)."""

from collections.abc import Callable

from django.conf import settings
from django.core.mail import EmailMultiAlternatives
from django.template.loader import render_to_string
from django.utils import translation

from accounts.models import User


def email_build(*, user: User, template: str, context: dict, subject: Callable[[], str],
                headers: dict | None = None) -> EmailMultiAlternatives:
    """`template`.txt and `template`.html rendered for `user`; `subject` is called in their language."""
    with translation.override(user.language or settings.LANGUAGE_CODE):
        context = {"user": user, "SITE_URL": settings.SITE_URL, **context}
        message = EmailMultiAlternatives(subject=subject(), body=render_to_string(f"{template}.txt", context),
                                         to=[user.email], headers=headers or {})
        message.attach_alternative(render_to_string(f"{template}.html", context), "text/html")
    return message


def email_send(*, user: User, template: str, context: dict, subject: Callable[[], str], headers: dict | None = None) -> None:
    email_build(user=user, template=template, context=context, subject=subject, headers=headers).send()
