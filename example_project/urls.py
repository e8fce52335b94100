"""URLs of the example project."""

from __future__ import annotations

from django.contrib.auth import views as auth_views
from django.urls import path

from example_project import views
from sentinel_cache.django.health import health_view

urlpatterns = [
    path("", views.index, name="index"),
    path("report/", views.report, name="report"),
    path("clock/", views.clock, name="clock"),
    path("expensive/<slug:tag>/", views.expensive, name="expensive"),  # computed once
    path("expensive-django/<slug:tag>/", views.expensive_django, name="expensive-django"),
    path("shards/", views.shards, name="shards"),
    path("account/", views.account, name="account"),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(template_name="example_project/login.html"),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/me/", views.me, name="me"),
    path("api/visit/<int:n>/", views.visit, name="visit"),
    path("api/flag/", views.flag, name="flag"),  # read through the near cache
    path("health/cache/", health_view, name="cache-health"),  # readiness probe: 200 / 503
    path("metrics", views.metrics, name="metrics"),  # Prometheus scrape (METRICS is on)
]
