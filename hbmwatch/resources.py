"""Where the files hbmwatch ships beside its code are: Alembic scripts, Grafana dashboards.

A wheel holds them as package data inside the ``hbmwatch`` package (``hbmwatch/migrations``,
``hbmwatch/dashboards``: pyproject's ``package-dir``), found with ``importlib.resources``.
An editable install of a checkout keeps them in their own top-level folders; they cannot
be regular packages there, since a checkout's ``alembic/__init__.py`` on ``sys.path`` would
shadow the Alembic library itself.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

# installed name inside the hbmwatch package -> the checkout's folder
_CHECKOUT_FOLDER = {"migrations": "alembic", "dashboards": "dashboards"}
# a file each folder must hold: the Alembic library's own alembic/ (beside site-packages'
# hbmwatch/) has no env.py, so a wheel missing its migrations fails here, not in Alembic
_MARKER = {"migrations": "env.py", "dashboards": "json"}


def data_dir(name: str) -> Path:
    """The folder of shipped files ``name`` (``migrations`` or ``dashboards``)."""
    package = Path(str(resources.files("hbmwatch")))
    candidates = [package / name, package.parent / _CHECKOUT_FOLDER[name]]
    for folder in candidates:
        if (folder / _MARKER[name]).exists():
            return folder
    tried = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"hbmwatch's {name} are missing (looked in {tried}); reinstall hbmwatch"
    )
