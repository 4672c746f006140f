from django.urls import path, re_path

from runs.views import certificates, health, organizer, pages

urlpatterns = [
    path("runs/", pages.run_list, name="run-list"),
    path("runs/new/", organizer.run_create, name="run-create"),
    path("runs/<slug:slug>/", pages.run_detail, name="run-detail"),
    path("runs/<slug:slug>/health/", health.run_health_page, name="run-health"),
    path("runs/<slug:slug>/join/", pages.run_join_page, name="run-join"),
    path("runs/<slug:slug>/checkpoints/epoch-<int:epoch>.zip", pages.checkpoint_download, name="run-checkpoint"),
    path("runs/<slug:slug>/edit/", organizer.run_edit, name="run-edit"),
    path("runs/<slug:slug>/participants/", organizer.run_participants, name="run-participants"),
    path("runs/<slug:slug>/ban/", organizer.run_ban, name="run-ban"),
    path("runs/<slug:slug>/unban/", organizer.run_unban, name="run-unban"),
    path("runs/<slug:slug>/allowlist/", organizer.run_allowlist, name="run-allowlist"),
    path("runs/<slug:slug>/data/", organizer.data_upload, name="run-data-upload"),
    path("runs/<slug:slug>/data/<int:pk>/remove/", organizer.data_remove, name="run-data-remove"),
    path("runs/<slug:slug>/probes/", organizer.run_probes, name="run-probes"),
    path("runs/<slug:slug>/probes/<int:pk>/remove/", organizer.run_probe_remove, name="run-probe-remove"),
    path("runs/<slug:slug>/tokenizer/train/", organizer.tokenizer_train, name="run-tokenizer-train"),
    path("runs/<slug:slug>/tokenizer/upload/", organizer.tokenizer_upload, name="run-tokenizer-upload"),
    path("runs/<slug:slug>/status/<str:action>/", organizer.run_action, name="run-action"),
    re_path(r"^runs/(?P<slug>[-a-zA-Z0-9_]+)/certificate\.(?P<kind>svg|png)$", certificates.run_certificate,
            name="run-certificate"),
    path("certificates/<str:code>/", certificates.certificate_verify, name="certificate-verify"),
    path("leaderboard/", pages.leaderboard, name="leaderboard"),
    path("stats/", pages.stats_list, name="stats"),
    path("stats/<str:day>/<str:name>", pages.stats_file, name="stats-file"),
    path("runs/<slug:slug>/flags/", organizer.run_flags, name="run-flags"),
    path("runs/<slug:slug>/flags/<int:pk>/<str:decision>/", organizer.run_flag_decide, name="run-flag-decide"),
    path("runs/<slug:slug>/suspended/<int:pk>/lift/", organizer.run_session_unsuspend, name="run-session-unsuspend"),
    path("agent/<str:filename>", pages.agent_wheel, name="agent-wheel"),
]
