from django.contrib import admin

from runs.models import Run


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("name", "slug", "status", "visibility", "hivemind_run_id", "created_at")
    list_filter = ("status", "visibility")
    search_fields = ("name", "slug", "hivemind_run_id")
    filter_horizontal = ("organizers",)
    readonly_fields = ("hivemind_run_id",)
