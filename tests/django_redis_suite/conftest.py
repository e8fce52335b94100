"""The tests that need django-redis itself (a dev dependency, pinned to the version whose suite
``test_django_redis_suite.py`` describes): its own suite run against our backend, and its
``get_redis_connection`` called on our cache. A directory of their own, outside the support
matrix's framework suites (tests/django, tests/flask), since django-redis 7.0 needs Django 5.2+
and the matrix also runs Django 4.2; ``make test`` runs them. Named so that it can never be
imported as ``django_redis``."""

from __future__ import annotations

from minimal_django import configure_django

configure_django()
