"""``health_urls`` plus django-debug-toolbar's URLs (import with ``debug_toolbar`` installed;
included directly: ``debug_toolbar_urls()`` is empty unless DEBUG was on at import)."""

from __future__ import annotations

from django.urls import include, path
from health_urls import urlpatterns as health_patterns

urlpatterns = [*health_patterns, path("__debug__/", include("debug_toolbar.urls"))]
