from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin

from accounts import services
from accounts.models import AgentToken, Notification, Team, TeamEvent, User


@admin.register(User)
class UserAdmin(DjangoUserAdmin):
    """Staff make a volunteer an organizer by granting “Can create and organize training runs”."""

    list_display = ("username", "email", "display_name", "visibility", "team", "is_staff", "is_active", "date_joined")
    list_filter = DjangoUserAdmin.list_filter + ("visibility",)
    search_fields = ("username", "email", "display_name", "pseudonym")
    fieldsets = DjangoUserAdmin.fieldsets + (("Volunteer", {"fields": (
        "display_name", "visibility", "pseudonym", "team", "email_verified_at", "language", "email_opt_outs")}),)
    readonly_fields = ("pseudonym", "email_verified_at")


class TeamEventInline(admin.TabularInline):
    model = TeamEvent
    extra = 0
    can_delete = False
    readonly_fields = ("user", "kind", "at")

    def has_add_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ("name", "founder", "created_at", "disbanded_at")
    search_fields = ("name", "slug", "founder__username")
    list_filter = ("disbanded_at",)
    inlines = [TeamEventInline]


@admin.register(TeamEvent)
class TeamEventAdmin(admin.ModelAdmin):
    list_display = ("team", "user", "kind", "at")
    list_filter = ("kind",)
    search_fields = ("team__name", "user__username")
    readonly_fields = ("team", "user", "kind", "at")


@admin.register(AgentToken)
class AgentTokenAdmin(admin.ModelAdmin):
    list_display = ("name", "user", "prefix", "run", "created_at", "expires_at", "revoked_at", "last_used_at", "last_used_ip")
    list_filter = ("revoked_at",)
    search_fields = ("name", "user__username", "prefix")
    readonly_fields = ("user", "prefix", "digest", "created_at", "last_used_at", "last_used_ip")
    actions = ["revoke"]

    def has_add_permission(self, request) -> bool:
        return False  # a secret can only be shown to its owner, on the tokens page

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset) -> None:
        for token in queryset:
            services.token_revoke(token=token)


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    """What volunteers were told and whether it was e-mailed; a record, so nothing here is editable."""

    list_display = ("user", "kind", "key", "created_at", "read_at", "email_state", "emailed_at")
    list_filter = ("kind", "email_state")
    search_fields = ("user__username", "key")
    readonly_fields = ("user", "kind", "key", "context", "created_at", "read_at", "email_state", "emailed_at")

    def has_add_permission(self, request) -> bool:
        return False
