"""Flask-Caching settings -> the core's options: only renames; every value is checked once by
:func:`sentinel_cache.core.config.parse_cache_config`, and its errors are renamed back to the Flask
setting they came from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sentinel_cache.core.options import did_you_mean
from sentinel_cache.exceptions import ConfigurationError

# Flask-Caching setting -> the option name parse_cache_config knows.
FLASK_OPTION_KEYS: Mapping[str, str] = {
    "CACHE_REDIS_SENTINEL_MASTERS": "MASTERS",
    "CACHE_REDIS_SENTINEL_MASTER": "MASTERS",
    "CACHE_REDIS_PASSWORD": "PASSWORD",
    "CACHE_REDIS_SENTINEL_PASSWORD": "SENTINEL_PASSWORD",
    "CACHE_REDIS_DB": "DB",
}
_SECRET_KEYS = frozenset({"CACHE_REDIS_PASSWORD", "CACHE_REDIS_SENTINEL_PASSWORD"})
#: Every Flask setting this backend reads, for "did you mean" on a misspelled one.
READ_SETTINGS = frozenset(
    {*FLASK_OPTION_KEYS, "CACHE_REDIS_SENTINELS", "CACHE_REDIS_URL", "CACHE_OPTIONS"}
)


def misspelled(config: Mapping[str, Any], wanted: str) -> str:
    """``"; CACHE_REDIS_SENTINEL_MASTRES is set: did you mean 'CACHE_REDIS_SENTINEL_MASTERS'?"``
    when a setting this backend does not read is close to ``wanted`` (a required setting found
    missing), else "": the error then names the typo, not only the setting it left unset."""
    for key in sorted(str(k) for k in config):
        if key in READ_SETTINGS or not key.upper().startswith("CACHE_"):
            continue
        if did_you_mean(key, [wanted], cutoff=0.8):
            return f"; {key} is set, which is not read: did you mean {wanted!r}?"
    return ""


def translate_settings(
    config: Mapping[str, Any], options: dict[str, Any]
) -> tuple[Any, str, dict[str, Any], dict[str, str]]:
    """Flask settings -> (location, its setting name, options, option -> setting it came from).

    Only renames: every value is checked by the one parser, parse_cache_config.
    """
    spelled: dict[str, str] = {}
    for name in options:
        upper = str(name).upper()
        if upper in spelled:
            raise ConfigurationError(
                option="CACHE_OPTIONS",
                value=name,
                reason=f"{spelled[upper]!r} and {name!r} name the same option",
            )
        spelled[upper] = str(name)
    sources = {upper: f"CACHE_OPTIONS[{name!r}]" for upper, name in spelled.items()}
    merged = dict(options)
    for setting, option in FLASK_OPTION_KEYS.items():
        value = config.get(setting)
        if value is None or (setting in _SECRET_KEYS and value == ""):
            continue
        if option in sources:
            raise ConfigurationError(
                option=setting,
                value=value if setting not in _SECRET_KEYS else "***",
                reason=f"{option} is also set by {sources[option]}; set it once",
            )
        if setting == "CACHE_REDIS_SENTINEL_MASTER" and isinstance(value, str):
            value = [value]  # Flask-Caching's one master name, by its very name
        merged[option] = value
        sources[option] = setting

    sentinels = config.get("CACHE_REDIS_SENTINELS")
    url = config.get("CACHE_REDIS_URL")
    url_is_sentinel = isinstance(url, str) and url.lower().startswith(
        ("sentinel://", "sentinels://")
    )
    if sentinels:
        if url_is_sentinel:
            raise ConfigurationError(
                option="CACHE_REDIS_SENTINELS",
                value=sentinels,
                reason="the sentinels are also given by CACHE_REDIS_URL; set one of them",
            )
        return sentinels, "CACHE_REDIS_SENTINELS", merged, sources
    if url:
        if not url_is_sentinel:
            raise ConfigurationError(
                option="CACHE_REDIS_URL",
                value=url,
                reason="ShardedSentinelCache needs a sentinel:// URL "
                "(sentinel://host:26379,host2:26379/master_a,master_b) or CACHE_REDIS_SENTINELS "
                f"(got {url!r})",
            )
        return url, "CACHE_REDIS_URL", merged, sources
    raise ConfigurationError(
        option="CACHE_REDIS_SENTINELS",
        value=sentinels,
        reason='required, the sentinel addresses as a list of "host:port" '
        "(or a sentinel:// URL in CACHE_REDIS_URL)"
        + (f" (got {sentinels!r})" if sentinels is not None else "")
        + misspelled(config, "CACHE_REDIS_SENTINELS"),
    )


def in_flask_terms(
    exc: ConfigurationError,
    location_key: str,
    sources: Mapping[str, str],
    config: Mapping[str, Any] | None = None,
) -> ConfigurationError:
    """Name the Flask setting a core error is about (the core names its own options), from the
    error's ``option``, ``value`` and ``reason``; ``config`` (the app's) for "did you mean"."""
    option = exc.option
    if option is None:
        return ConfigurationError(option="CACHE_OPTIONS", value=exc.value, reason=str(exc))
    if option.startswith("CACHE_"):
        return exc
    if option == "LOCATION":
        return exc.renamed(location_key)
    if option == "OPTIONS":  # about the mapping: an option that is unknown, repeated or missing
        if exc.value is None:  # the one option that must be given
            return ConfigurationError(
                option="CACHE_REDIS_SENTINEL_MASTERS",
                reason="required, the ordered list of master names"
                + misspelled(config or {}, "CACHE_REDIS_SENTINEL_MASTERS"),
            )
        if location_key == "CACHE_REDIS_URL" and str(exc.value).upper() not in sources:
            return exc.renamed("CACHE_REDIS_URL")  # from its query string
        return exc.renamed("CACHE_OPTIONS")
    source = sources.get(option)
    if source is not None:
        return exc.renamed(source)
    # Not from a Flask setting nor CACHE_OPTIONS: a sentinel:// URL's query string set it.
    label = location_key if location_key == "CACHE_REDIS_URL" else "CACHE_OPTIONS"
    return ConfigurationError(option=label, value=exc.value, reason=str(exc))
