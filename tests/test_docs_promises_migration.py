"""docs/migration.md, "From django-redis", Settings: every django-redis option the page says is
refused is refused, naming what the page says it names; every option the code refuses is on
the page; the serializer and compressor classes become what the page says, or are refused
naming the page's choices. Refused before anything connects: no server is needed."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from sentinel_cache import ConfigurationError
from sentinel_cache.django.compat import DJANGO_REDIS_OPTIONS, translate_options

PAGE = Path(__file__).resolve().parent.parent / "docs" / "migration.md"
NO_SETTINGS = SimpleNamespace()  # no DJANGO_REDIS_* globals


def settings_table() -> list[tuple[str, str]]:
    text = PAGE.read_text(encoding="utf-8")
    section = text[text.index("\n### Settings") :].split("\n### ", 2)[1]
    return re.findall(r"^\| (.+?) \| (.+?) \|$", section, re.M)[1:]  # no header row


def refused_on_the_page() -> dict[str, list[str]]:
    """OPTIONS key -> the names its row says the refusal names (may be empty)."""
    refused: dict[str, list[str]] = {}
    for options, status in settings_table():
        keys = re.findall(r'\["([A-Z_]+)"\]', options)
        whole = status.startswith("refused") or "(the option is refused" in status
        if not keys or not (whole or re.match(r"`[A-Z_]+` refused", status)):
            continue  # supported, or refused only for some values (COMPRESSOR's classes)
        if status.startswith("`"):  # "`SENTINELS` refused, naming ...": only the one named
            keys = [k for k in keys if status.startswith(f"`{k}` refused")]
        naming = status.split("naming", 1)[1] if "naming" in status else ""
        for key in keys:
            refused[key] = re.findall(r"`([A-Z_]{3,})`", naming.split(";")[0])
    return refused


REFUSED = refused_on_the_page()


def test_every_option_the_code_refuses_is_on_the_page() -> None:
    assert sorted(REFUSED) == sorted(DJANGO_REDIS_OPTIONS)


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_a_refused_option_names_its_replacement(key: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        translate_options({"MASTERS": ["shard_a"], key: "anything"}, NO_SETTINGS)
    assert raised.value.option == key
    message = str(raised.value)
    assert all(name in message for name in REFUSED[key]), (message, REFUSED[key])


def _codec_row(option: str) -> str:
    return next(status for name, status in settings_table() if f'["{option}"]' in name)


@pytest.mark.parametrize(
    ("option", "path", "becomes"),
    [
        ("SERIALIZER", "django_redis.serializers.pickle.PickleSerializer", "pickle"),
        ("SERIALIZER", "django_redis.serializers.json.JSONSerializer", "json"),
        ("SERIALIZER", "django_redis.serializers.msgpack.MSGPackSerializer", "msgpack"),
        ("COMPRESSOR", "django_redis.compressors.zlib.ZlibCompressor", "zlib"),
        ("COMPRESSOR", "django_redis.compressors.zstd.ZStdCompressor", "zstd"),
        ("COMPRESSOR", "django_redis.compressors.identity.IdentityCompressor", None),
    ],
)
def test_a_django_redis_class_becomes_the_pages_name(
    option: str, path: str, becomes: str | None
) -> None:
    row = _codec_row(option)
    cls = path.rpartition(".")[2]
    said = f'`"{becomes}"`' if becomes else "none"
    assert f"`{cls}`" in row and said in row, row  # the page says so
    options = translate_options({"MASTERS": ["shard_a"], option: path}, NO_SETTINGS).options
    assert options.get(option) == becomes  # and the code does it


@pytest.mark.parametrize(
    "path",
    [
        "django_redis.compressors.lz4.Lz4Compressor",
        "django_redis.compressors.gzip.GzipCompressor",
        "django_redis.compressors.lzma.LzmaCompressor",
    ],
)
def test_a_compressor_without_an_equivalent_is_refused_naming_the_two(path: str) -> None:
    row = _codec_row("COMPRESSOR")
    assert f"`{path.rpartition('.')[2]}`" in row and "refused, naming the two" in row, row
    with pytest.raises(ConfigurationError) as raised:
        translate_options({"MASTERS": ["shard_a"], "COMPRESSOR": path}, NO_SETTINGS)
    assert '"zlib"' in str(raised.value) and '"zstd"' in str(raised.value)
