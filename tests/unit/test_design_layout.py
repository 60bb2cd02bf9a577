"""docs/design.md's layout is the tree: every module under services/ and kernels/ is listed with a
description, and every file the layout lists exists. A module added, moved or removed without its
layout line fails here."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "design.md"
CHECKED = ("services", "kernels")  # the packages whose every module the layout lists


def layout_block(text: str) -> list[str]:
    """The lines of the fenced block that follows the '## Layout' heading."""
    after = text[text.index("## Layout"):]
    match = re.search(r"^```\n(.*?)^```", after, re.S | re.M)
    assert match, "design.md's Layout section has no fenced block"
    return match.group(1).splitlines()


def listed_modules(lines: list[str]) -> dict[str, str]:
    """Path -> description of every .py file the layout names. A line at column 0 whose first word
    ends in '/' opens a directory; a line indented by two spaces names a file in it; a line at
    column 0 whose first word ends in '.py' names a file by its path. Deeper indents continue the
    previous line's description."""
    modules: dict[str, str] = {}
    directory = ""
    for line in lines:
        if not line.strip():
            continue
        word, _, rest = line.strip().partition(" ")
        if not line.startswith(" "):
            if word.endswith("/"):
                directory = word
            elif word.endswith(".py"):
                modules[word] = rest.strip()
        elif line.startswith("  ") and not line.startswith("   ") and word.endswith(".py"):
            path = directory + word
            assert path not in modules, f"design.md's layout lists {path} twice"
            modules[path] = rest.strip()
    return modules


def tree_modules() -> set[str]:
    return {str(p.relative_to(ROOT)) for package in CHECKED for p in (ROOT / package).rglob("*.py")
            if p.name != "__init__.py" and "__pycache__" not in p.parts}


def test_every_module_is_in_the_layout_with_a_description():
    listed = listed_modules(layout_block(DESIGN.read_text()))
    missing = sorted(tree_modules() - listed.keys())
    assert not missing, f"modules missing from docs/design.md's layout: {missing}"
    undescribed = sorted(path for path, description in listed.items() if not description)
    assert not undescribed, f"layout lines without a description: {undescribed}"


def test_every_file_the_layout_lists_exists():
    listed = listed_modules(layout_block(DESIGN.read_text()))
    absent = sorted(path for path in listed if not (ROOT / path).is_file())
    assert not absent, f"docs/design.md's layout lists files that do not exist: {absent}"


def test_the_parser_reads_directories_files_and_continuations():
    lines = ["services/common/            shared", "  errors.py                 domain errors",
             "                            continued", "protos/check_breaking.py    make breaking",
             "kernels/cpu/                C++ ops", "  library.py                build and load"]
    assert listed_modules(lines) == {"services/common/errors.py": "domain errors",
                                     "protos/check_breaking.py": "make breaking",
                                     "kernels/cpu/library.py": "build and load"}
