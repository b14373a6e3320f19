"""The examples in docstrings run, imported by their installed names (``hbmwatch.*``).

pytest's ``--doctest-modules`` would import ``store/store.py`` as a second module named
``store.store`` (from the checkout's folder), beside ``hbmwatch.store.store``.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

ROOMS = ("hbmwatch", "hbmwatch.alerts", "hbmwatch.api", "hbmwatch.collector", "hbmwatch.runtime",
         "hbmwatch.evaluation", "hbmwatch.bench", "hbmwatch.cli",
         "hbmwatch.detectors", "hbmwatch.simulator", "hbmwatch.store")  # fmt: skip
SKIP = ("hbmwatch.collector.probe", "hbmwatch.cli.__main__")  # scripts, run with -m


def _module_names() -> list[str]:
    names: set[str] = set()
    for room in ROOMS:
        package = importlib.import_module(room)
        names.add(room)
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{room}."):
            if not info.name.startswith(SKIP) and info.name.count(".") >= 1:
                names.add(info.name)
    return sorted(names)


def _with_examples() -> list[str]:
    finder = doctest.DocTestFinder()
    return [n for n in _module_names()
            if any(t.examples for t in finder.find(importlib.import_module(n)))]  # fmt: skip


@pytest.mark.parametrize("name", _with_examples())
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_the_examples_are_found() -> None:
    assert len(_with_examples()) >= 5
