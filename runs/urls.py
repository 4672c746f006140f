from django.urls import path

from runs import health_views, organizer_views, views

urlpatterns = [
    path("runs/new/", organizer_views.run_create, name="run-create"),
    path("runs/<slug:slug>/", views.run_detail, name="run-detail"),
    path("runs/<slug:slug>/health/", health_views.run_health_page, name="run-health"),
    path("runs/<slug:slug>/join/", views.run_join_page, name="run-join"),
    path("runs/<slug:slug>/checkpoints/epoch-<int:epoch>.zip", views.checkpoint_download, name="run-checkpoint"),
    path("runs/<slug:slug>/edit/", organizer_views.run_edit, name="run-edit"),
    path("runs/<slug:slug>/participants/", organizer_views.run_participants, name="run-participants"),
    path("runs/<slug:slug>/ban/", organizer_views.run_ban, name="run-ban"),
    path("runs/<slug:slug>/unban/", organizer_views.run_unban, name="run-unban"),
    path("runs/<slug:slug>/allowlist/", organizer_views.run_allowlist, name="run-allowlist"),
    path("runs/<slug:slug>/data/", organizer_views.data_upload, name="run-data-upload"),
    path("runs/<slug:slug>/data/<int:pk>/remove/", organizer_views.data_remove, name="run-data-remove"),
    path("runs/<slug:slug>/tokenizer/train/", organizer_views.tokenizer_train, name="run-tokenizer-train"),
    path("runs/<slug:slug>/tokenizer/upload/", organizer_views.tokenizer_upload, name="run-tokenizer-upload"),
    path("runs/<slug:slug>/status/<str:action>/", organizer_views.run_action, name="run-action"),
    path("leaderboard/", views.leaderboard, name="leaderboard"),
    path("stats/", views.stats_list, name="stats"),
    path("stats/<str:day>/<str:name>", views.stats_file, name="stats-file"),
    path("runs/<slug:slug>/flags/", organizer_views.run_flags, name="run-flags"),
    path("runs/<slug:slug>/flags/<int:pk>/<str:decision>/", organizer_views.run_flag_decide, name="run-flag-decide"),
    path("agent/<str:filename>", views.agent_wheel, name="agent-wheel"),
]
