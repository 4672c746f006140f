from django import forms
from django.conf import settings
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm, UserCreationForm
from django.core.exceptions import ValidationError
from django.utils.translation import gettext_lazy as _

from accounts.auth import request_ip
from accounts.models import Notification, Team, User
from accounts.names import name_clean
from portal.ratelimit import RateLimited, rate_limit_hit
from runs.models import Run

# A volunteer appears on boards by username or display name, so each is held against both.
PERSON_SKELETONS = ("username_skeleton", "display_name_skeleton")


class LoginLimit:
    """Counts every attempt per client IP, and per client IP and username, before the password is checked.

    The site's and the admin's log-in forms share the limits "login_address" and "login" and their
    counters, so that guesses split between the two pages still meet one limit. The count per
    address alone stops one password tried against many usernames, which the other never sees.
    """

    rate_limited: RateLimited | None = None

    def clean(self):
        address = request_ip(self.request)
        username = (self.cleaned_data.get("username") or "").lower()
        try:
            rate_limit_hit(name="login_address", key=str(address))
        except RateLimited as exc:
            self._refuse(exc, _("Too many log-in attempts from your address; try again in %(seconds)s s."))
        try:
            rate_limit_hit(name="login", key=f"{address}|{username}")
        except RateLimited as exc:
            self._refuse(exc, _("Too many log-in attempts for this account; try again in %(seconds)s s."))
        return super().clean()

    def _refuse(self, exc: RateLimited, message: str):
        self.rate_limited = exc
        raise forms.ValidationError(message, code="rate_limited", params={"seconds": exc.retry_after}) from None


class LoginForm(LoginLimit, AuthenticationForm):
    """The site's log-in form."""


class AdminLoginForm(LoginLimit, AdminAuthenticationForm):
    """The admin's log-in form: staff accounts only, under the site's log-in limit."""


class SignUpForm(UserCreationForm):
    """Usernames are public on the boards, so a taken one is said here. Whether an address has an
    account is said only while addresses are not confirmed; otherwise the mail tells the owner of
    the address (accounts/signup.py)."""

    class Meta(UserCreationForm.Meta):
        model = User
        fields = ("username", "email")

    def clean_username(self) -> str:
        return name_clean(self.cleaned_data["username"], rivals=User.objects.all(), skeleton_fields=PERSON_SKELETONS)

    def clean_email(self) -> str:
        email = self.cleaned_data["email"]
        if not settings.ACCOUNT_EMAIL_VERIFICATION_REQUIRED and User.objects.filter(email__iexact=email).exists():
            raise forms.ValidationError(_("An account with this e-mail address already exists."))
        return email

    def validate_unique(self) -> None:
        # The model's own check of the unique address would say what clean_email keeps quiet.
        try:
            self.instance.validate_unique(exclude=self._get_validation_exclusions() | {"email"})
        except ValidationError as exc:
            self._update_errors(exc)


class ProfileForm(forms.ModelForm):
    emails = forms.MultipleChoiceField(
        choices=Notification.Kind.choices, required=False, widget=forms.CheckboxSelectMultiple, label=_("E-mail me when"),
        help_text=_("Every notification still appears under the bell; these choose which ones also come by e-mail."),
    )

    class Meta:
        model = User
        fields = ("display_name", "email", "visibility", "language")
        widgets = {"visibility": forms.RadioSelect}
        labels = {"display_name": _("Display name"), "visibility": _("Visibility"), "language": _("Language of e-mails")}
        help_texts = {"email": _("A new address must be confirmed again before you create agent tokens.")}

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["emails"].initial = [kind for kind in Notification.Kind.values if kind not in self.instance.email_opt_outs]
        self.fields["language"].required = False

    def clean_display_name(self) -> str:
        # One's own names are no rivals: changing the case of one's name is an honest rename.
        return name_clean(self.cleaned_data["display_name"], rivals=User.objects.exclude(pk=self.instance.pk),
                          skeleton_fields=PERSON_SKELETONS)

    def clean_language(self) -> str:
        return self.cleaned_data.get("language") or self.instance.language

    def save(self, commit: bool = True) -> User:
        # Opt-outs are stored, so that a kind added later is e-mailed until the volunteer says otherwise.
        self.instance.email_opt_outs = sorted(set(Notification.Kind.values) - set(self.cleaned_data["emails"]))
        return super().save(commit)

    def clean_email(self) -> str:
        email = self.cleaned_data["email"]
        if User.objects.filter(email__iexact=email).exclude(pk=self.instance.pk).exists():
            raise forms.ValidationError(_("An account with this e-mail address already exists."))
        return email


class TeamForm(forms.ModelForm):
    class Meta:
        model = Team
        fields = ("name", "description")
        labels = {"name": _("Name"), "description": _("Description")}
        widgets = {"description": forms.Textarea(attrs={"rows": 4})}

    def clean_name(self) -> str:
        return name_clean(self.cleaned_data["name"], rivals=Team.objects.exclude(pk=self.instance.pk),
                          skeleton_fields=("name_skeleton",))


class HandOverForm(forms.Form):
    successor = forms.ModelChoiceField(queryset=User.objects.none(), label=_("Successor"),
                                       help_text=_("The member who becomes the founder."))

    def __init__(self, *args, team: Team, founder: User, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["successor"].queryset = team.members.exclude(pk=founder.pk).order_by("username")


class AgentTokenForm(forms.Form):
    name = forms.CharField(label=_("Name"), max_length=64, help_text=_("Which machine this token is for, e.g. “home desktop”."))
    run = forms.ModelChoiceField(
        queryset=Run.objects.filter(status__in=[Run.Status.ACTIVE, Run.Status.PAUSED], visibility=Run.Visibility.PUBLIC,
                                    audience=Run.Audience.EVERYONE),
        required=False,
        label=_("Run"),
        empty_label=_("Any run"),
        help_text=_("Limit the token to one run (recommended for shared machines)."),
    )
    lifetime_days = forms.IntegerField(
        min_value=1,
        max_value=365,
        initial=settings.AGENT_TOKEN_DEFAULT_DAYS,
        label=_("Lifetime in days"),
        help_text=_("The token stops working after this many days."),
    )
