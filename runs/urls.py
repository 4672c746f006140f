from django.urls import path

from runs import views

urlpatterns = [
    path("runs/<slug:slug>/", views.run_detail, name="run-detail"),
]
