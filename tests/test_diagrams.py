"""The docs' pictures are drawn from their descriptions (scripts/diagrams/*.txt) by
scripts/draw.py: the committed SVGs are what it draws (as ``unasync.py --check``), well-formed,
and shown where the docs say they are."""

from __future__ import annotations

import importlib.util
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "draw.py"
SVG = "{http://www.w3.org/2000/svg}"
SHOWN = {
    "architecture.svg": ["README.md", "docs/index.md"],
    "failover.svg": ["README.md", "docs/failover.md"],
}


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("draw_under_test", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_pictures_are_what_the_descriptions_draw() -> None:
    draw = load()
    pictures = draw.pictures()
    assert sorted(target.name for target in pictures.values()) == sorted(SHOWN)
    for source, target in pictures.items():
        drawn = draw.render(source.read_text(encoding="utf-8"), source.stem)
        assert target.read_text(encoding="utf-8") == drawn, f"run python scripts/draw.py ({target})"
    assert draw.main(["--check"]) == 0


def test_a_stale_picture_fails_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    draw = load()
    sources, output = tmp_path / "diagrams", tmp_path / "img"
    sources.mkdir()
    (sources / "one.txt").write_text('canvas 100 50 "one"\nbox a 10 10 80 30 default "A"\n')
    monkeypatch.setattr(draw, "SOURCES", sources)
    monkeypatch.setattr(draw, "OUTPUT", output)
    monkeypatch.setattr(draw, "ROOT", tmp_path)
    assert draw.main(["--check"]) == 1  # never drawn
    assert draw.main([]) == 0 and draw.main(["--check"]) == 0
    (sources / "one.txt").write_text('canvas 100 50 "one"\nbox a 10 10 80 30 default "B"\n')
    assert draw.main(["--check"]) == 1
    assert "img/one.svg" in capsys.readouterr().err


@pytest.mark.parametrize("name", sorted(SHOWN))
def test_each_picture_is_well_formed_svg_and_shown(name: str) -> None:
    path = ROOT / "docs" / "img" / name
    root = ElementTree.parse(path).getroot()
    assert root.tag == f"{SVG}svg"
    title = root.find(f"{SVG}title")
    assert title is not None and title.text  # what a screen reader says
    words = " ".join(t.text or "" for t in root.iter(f"{SVG}text"))
    expected = {
        "architecture.svg": ["HashRing", "write fence", "Listeners", "Discovery", "sentinel 1"],
        "failover.svg": ["+switch-master", "raise the fence", "safety net", "FAILOVER_HOLD"],
    }[name]
    assert all(word in words for word in expected), words
    for page in SHOWN[name]:
        text = (ROOT / page).read_text(encoding="utf-8")
        link = f"docs/img/{name}" if page == "README.md" else f"img/{name}"
        assert f"]({link})" in text, f"{page} does not show {link}"


def test_a_bad_line_names_the_file_and_line() -> None:
    draw = load()
    with pytest.raises(draw.DiagramError, match=r"^pic:2: 'circle 1 2 3': unknown shape 'circle'"):
        draw.render('canvas 10 10 "t"\ncircle 1 2 3\n', "pic")
