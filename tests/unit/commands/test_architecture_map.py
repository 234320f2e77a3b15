"""docs/architecture.md's module map against the package as it is: every module of every accelkit package is listed
under its package's heading, and nothing listed there is missing from the code (issue 33)."""

from __future__ import annotations

import re
from pathlib import Path

import accelkit

ROOT = Path(accelkit.__file__).parent
DOC = ROOT.parent / "docs" / "architecture.md"
SECTION = "## Module map"
HEADING = re.compile(r"^### `(accelkit(?:/\w+)*)/`$")  # ### `accelkit/plan/`
ENTRY = re.compile(r"^- `(\w+(?:\.py|/))`")  # - `api.py`: ...   or   - `measure/`: ...


def documented(text: str) -> dict[str, list[str]]:
    """Package folder (`accelkit/plan`) -> the entries its map lists, in order, from the doc's module map."""
    maps: dict[str, list[str]] = {}
    section = text.split(f"\n{SECTION}\n", 1)[1].split("\n## ", 1)[0]
    package = None
    for line in section.splitlines():
        heading = HEADING.match(line)
        if heading:
            package = heading.group(1)
            assert package not in maps, f"{package}/ has two maps"
            maps[package] = []
        elif line.startswith("- "):
            entry = ENTRY.match(line)
            assert package is not None and entry, f"not a map entry under a package heading: {line!r}"
            maps[package].append(entry.group(1))
    return maps


def actual(root: Path = ROOT) -> dict[str, list[str]]:
    """Package folder -> its modules and subpackages (`name.py`, `name/`), as the map lists them."""
    found = {}
    for init in sorted(root.rglob("__init__.py")):
        folder = init.parent
        found[folder.relative_to(root.parent).as_posix()] = sorted(
            [p.name for p in folder.glob("*.py") if p.name != "__init__.py"]
            + [f"{p.name}/" for p in folder.iterdir() if (p / "__init__.py").is_file()])
    return found


def differences(maps: dict[str, list[str]], code: dict[str, list[str]]) -> list[str]:
    found = [f"{package}/ has no map in {DOC.name}" for package in code if package not in maps]
    found += [f"{DOC.name} maps {package}/, which is not a package" for package in maps if package not in code]
    for package in sorted(set(maps) & set(code)):
        listed, present = maps[package], set(code[package])
        found += [f"{package}/{name} is missing from its map" for name in sorted(present - set(listed))]
        found += [f"{package}/{name} is in the map but not in the code" for name in sorted(set(listed) - present)]
        found += [f"{package}/{name} is listed twice" for name in sorted({n for n in listed if listed.count(n) > 1})]
    return found


def test_the_module_map_lists_every_module_and_nothing_else() -> None:
    """Every package, merge included: whatever a package holds when this runs must be what its map says."""
    assert differences(documented(DOC.read_text(encoding="utf-8")), actual()) == []


def test_the_check_finds_a_missing_a_stale_and_an_unmapped_module(tmp_path: Path) -> None:
    package = tmp_path / "accelkit"
    (package / "sub").mkdir(parents=True)
    for path in ("__init__.py", "kept.py", "new.py", "sub/__init__.py"):
        (package / path).write_text('"""x"""\n')
    doc = (f"# A\n\n{SECTION}\n\n### `accelkit/`\n\n- `kept.py`: kept\n- `gone.py`: removed\n- `sub/`: a package\n"
           "\n### `accelkit/old/`\n\n- `a.py`: a\n\n## Next\n\n- `ignored.py`: outside the map\n")
    assert documented(doc) == {"accelkit": ["kept.py", "gone.py", "sub/"], "accelkit/old": ["a.py"]}
    assert differences(documented(doc), actual(package)) == [
        "accelkit/sub/ has no map in architecture.md", "architecture.md maps accelkit/old/, which is not a package",
        "accelkit/new.py is missing from its map", "accelkit/gone.py is in the map but not in the code"]
