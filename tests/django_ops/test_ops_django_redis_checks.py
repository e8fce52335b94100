"""django-redis settings that do not carry over are reported by ``manage.py check``, never
silently ignored: W004 for a ``DJANGO_REDIS_*`` global or a ``REVERSE_KEY_FUNCTION`` with no
effect, W005 for ``LOG_IGNORED_EXCEPTIONS = False`` (ignored exceptions are always logged here);
a bad value of one that does carry over is E001 naming it. Nothing connects."""

from __future__ import annotations

from io import StringIO

import pytest
from django.core import checks
from django.core.management import call_command
from django.test import override_settings
from ops_support import UseCaches, closed_port, sentinel_cache

from sentinel_cache.django.checks import check_configuration, check_django_redis_settings


def _ids(messages: list[checks.CheckMessage]) -> list[tuple[str | None, object]]:
    return [(m.id, m.obj) for m in messages]


def test_the_check_is_registered() -> None:
    assert check_django_redis_settings in checks.registry.registry.get_checks()


def test_globals_with_no_effect_are_W004(use_caches: UseCaches) -> None:
    use_caches(sessions=sentinel_cache([f"127.0.0.1:{closed_port()}"]))
    with override_settings(
        DJANGO_REDIS_CLOSE_CONNECTION=True,
        DJANGO_REDIS_CONNECTION_FACTORY="django_redis.pool.SentinelConnectionFactory",
        DJANGO_REDIS_TYPO=1,
        CACHE_HERD_TIMEOUT=60,
        # honoured, so not reported:
        DJANGO_REDIS_IGNORE_EXCEPTIONS=True,
        DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS=True,
        DJANGO_REDIS_LOGGER="project.cache",
        DJANGO_REDIS_SCAN_ITERSIZE=50,
    ):
        messages = check_django_redis_settings(None)
    assert _ids(messages) == [
        ("sentinel_cache.W004", "settings.CACHE_HERD_TIMEOUT"),
        ("sentinel_cache.W004", "settings.DJANGO_REDIS_CLOSE_CONNECTION"),
        ("sentinel_cache.W004", "settings.DJANGO_REDIS_CONNECTION_FACTORY"),
        ("sentinel_cache.W004", "settings.DJANGO_REDIS_TYPO"),
    ]
    assert all(m.level == checks.WARNING for m in messages)
    assert "no herd client" in messages[0].msg
    assert "close() does nothing per request" in messages[1].msg
    assert "CONNECTION_KWARGS" in messages[2].msg
    assert "sentinel_cache reads no such setting" in messages[3].msg
    assert "'sessions'" in messages[1].msg


def test_nothing_is_reported_without_a_sentinel_cache() -> None:
    locmem = {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    with override_settings(CACHES={"default": locmem}, DJANGO_REDIS_CLOSE_CONNECTION=True):
        assert check_django_redis_settings(None) == []


def test_reverse_key_function_is_W004(use_caches: UseCaches) -> None:
    entry = sentinel_cache([f"127.0.0.1:{closed_port()}"])
    entry["REVERSE_KEY_FUNCTION"] = "project.keys.reverse"
    use_caches(sessions=entry)
    (message,) = check_django_redis_settings(None)
    assert (message.id, message.obj) == ("sentinel_cache.W004", "sessions")
    assert "REVERSE_KEY_FUNCTION" in message.msg


@pytest.mark.parametrize("where", ["option", "global"])
def test_log_ignored_exceptions_false_is_W005_where_exceptions_are_ignored(
    use_caches: UseCaches, where: str
) -> None:
    location = [f"127.0.0.1:{closed_port()}"]
    quiet = {"LOG_IGNORED_EXCEPTIONS": False} if where == "option" else {}
    use_caches(
        sessions=sentinel_cache(location, IGNORE_EXCEPTIONS=True, **quiet),
        raising=sentinel_cache(location, IGNORE_EXCEPTIONS=False, **quiet),  # nothing to log
    )
    with override_settings(
        **({"DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS": False} if where == "global" else {})
    ):
        (message,) = check_django_redis_settings(None)
    assert (message.id, message.obj) == ("sentinel_cache.W005", "sessions")
    source = (
        "OPTIONS['LOG_IGNORED_EXCEPTIONS']"
        if where == "option"
        else "settings.DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS"
    )
    assert message.msg.startswith(f"{source} = False does not silence")


def test_settings_that_carry_over_raise_no_warning(use_caches: UseCaches) -> None:
    location = [f"127.0.0.1:{closed_port()}"]
    use_caches(
        sessions=sentinel_cache(location, IGNORE_EXCEPTIONS=True, LOG_IGNORED_EXCEPTIONS=True)
    )
    assert check_django_redis_settings(None) == []
    out = StringIO()
    call_command("check", "--tag", "sentinel_cache", stdout=out, stderr=out)
    assert "no issues" in out.getvalue()


def test_a_bad_django_redis_value_is_E001_naming_it(use_caches: UseCaches) -> None:
    use_caches(sessions=sentinel_cache([f"127.0.0.1:{closed_port()}"], CLIENT_CLASS="x.Client"))
    with override_settings(DJANGO_REDIS_LOGGER=""):
        (error,) = check_configuration(None)
        assert check_django_redis_settings(None) == []  # E001 says it; not twice
    assert error.id == "sentinel_cache.E001"
    assert "CLIENT_CLASS: a django-redis option; not needed" in error.msg
    use_caches(sessions=sentinel_cache([f"127.0.0.1:{closed_port()}"]))
    with override_settings(DJANGO_REDIS_LOGGER=""):
        (error,) = check_configuration(None)
    assert "DJANGO_REDIS_LOGGER: must be a logger's name" in error.msg
