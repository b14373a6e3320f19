"""The layout is the pipeline: each room imports only the floors below it.

The kernel (``hbmwatch/``: metrics, SKUs, records, settings, validation, matchers, log) is
the ground; the composition root (``runtime/``) builds the rooms; evaluation, benchmarks
and the CLI sit on top. Rooms of one floor do not import each other. Every import is
read, those inside functions too, so a lazy import cannot run back up a floor either.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import REPO

#: room (the subpackage under hbmwatch) -> floor; "" is the kernel, hbmwatch itself
FLOORS = {
    "": 0,
    "store": 1,
    "collector": 2, "detectors": 2, "alerts": 2, "promql": 2,
    "simulator": 3,
    "api": 4,
    "runtime": 5,
    "evaluation": 6,
    "bench": 7,
    "cli": 8,
}  # fmt: skip
CODE_ROOMS = {room: folder for room, folder in (
    (name.removeprefix("hbmwatch").lstrip("."), folder)
    for name, folder in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"][
        "setuptools"]["package-dir"].items()
) if folder not in ("alembic", "dashboards")}  # fmt: skip


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            yield from ((node.lineno, n) for n in names)
        elif isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)


def _room_of(module: str) -> str | None:
    """The room an absolute import lands in, or None if it is not hbmwatch's."""
    parts = module.split(".")
    if parts[0] != "hbmwatch":
        return None
    return parts[1] if len(parts) > 1 and parts[1] in FLOORS else ""


def test_every_room_has_a_floor() -> None:
    assert set(CODE_ROOMS) == set(FLOORS)


def test_no_import_runs_up_a_floor_or_across_one() -> None:
    wrong: list[str] = []
    folders = set(CODE_ROOMS.values()) - {"hbmwatch"}
    for room, folder in CODE_ROOMS.items():
        for path in sorted((REPO / folder).rglob("*.py")):
            where = f"{path.relative_to(REPO)}"
            for line, module in _imports(path):
                if module.split(".")[0] in folders | {"tests"}:
                    wrong.append(f"{where}:{line} imports {module}, not as hbmwatch.*")
                target = _room_of(module)
                if target is None or target == room:
                    continue
                if FLOORS[target] >= FLOORS[room]:
                    wrong.append(
                        f"{where}:{line} ({room or 'kernel'}, floor {FLOORS[room]}) "
                        f"imports {module} (floor {FLOORS[target]})"
                    )
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_the_checker_sees_a_wrong_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from hbmwatch.cli import app\n")
    assert any(m == "hbmwatch.cli" for _, m in _imports(bad))
    assert _room_of("hbmwatch.cli.main") == "cli" and _room_of("hbmwatch.metrics") == ""
    assert FLOORS[_room_of("hbmwatch.cli")] > FLOORS[_room_of("hbmwatch.store.store")]


def test_the_readme_shows_these_floors() -> None:
    import re

    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Architecture") : readme.index("## Documentation")]
    shown: dict[str, int] = {}
    for floor, rooms in re.findall(r"^\| (\d+) \| ([^|]+) \|", section, re.M):
        for folder in re.findall(r"`([a-z_]+)/`", rooms):
            room = next(r for r, f in CODE_ROOMS.items() if f == folder)
            shown[room] = int(floor)
    assert shown == FLOORS
