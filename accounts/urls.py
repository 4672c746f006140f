from django.urls import include, path

from accounts import views

urlpatterns = [
    path("accounts/signup/", views.signup, name="signup"),
    path("accounts/signup/sent/", views.signup_sent, name="signup-sent"),
    path("accounts/signup/confirm/<str:secret>/", views.signup_link, name="signup-confirm"),
    path("accounts/profile/", views.profile, name="profile"),
    path("accounts/login/", views.LoginView.as_view(), name="login"),
    path("accounts/password_reset/", views.PasswordResetView.as_view(), name="password_reset"),
    path("accounts/verify/resend/", views.email_verify_resend, name="email-verify-resend"),
    path("accounts/verify/<str:token>/", views.email_verify, name="email-verify"),
    path("notifications/", views.notification_list, name="notifications"),
    path("notifications/read/", views.notification_read, name="notifications-read"),
    path("notifications/unsubscribe/<str:token>/", views.unsubscribe, name="unsubscribe"),
    path("accounts/", include("django.contrib.auth.urls")),
    path("volunteers/<str:key>/", views.volunteer_detail, name="volunteer-detail"),
    path("tokens/", views.token_list, name="tokens"),
    path("tokens/<int:pk>/revoke/", views.token_revoke, name="token-revoke"),
    path("teams/", views.team_list, name="teams"),
    path("teams/new/", views.team_create, name="team-create"),
    path("teams/<slug:slug>/", views.team_detail, name="team-detail"),
    path("teams/<slug:slug>/join/", views.team_join, name="team-join"),
    path("teams/<slug:slug>/leave/", views.team_leave, name="team-leave"),
    path("teams/<slug:slug>/hand-over/", views.team_hand_over, name="team-hand-over"),
    path("teams/<slug:slug>/disband/", views.team_disband, name="team-disband"),
]
