# syntax=docker/dockerfile:1
# hbmwatch: API, collector and detectors (`hbmwatch up`) in one container.
# Built by docker-compose.yml; on its own:
#   docker build -t hbmwatch:0.1.0 . && docker run --rm -p 127.0.0.1:8427:8427 \
#     -e HBMWATCH_API__HOST=0.0.0.0 hbmwatch:0.1.0
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# An unprivileged user; it owns only its data directory (spool, simulator ground truth,
# the SQLite file when no PostgreSQL URL is given), never the code.
RUN groupadd --system --gid 10001 hbmwatch \
 && useradd --system --uid 10001 --gid hbmwatch --home-dir /var/lib/hbmwatch \
      --no-create-home --shell /usr/sbin/nologin hbmwatch \
 && install -d -o hbmwatch -g hbmwatch -m 0750 /var/lib/hbmwatch

WORKDIR /opt/hbmwatch

# The dependencies first, in their own layer, so a code change does not reinstall them.
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
      > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt \
 && rm /tmp/requirements.txt

# The checkout (.dockerignore leaves out .venv, .git, databases and test output), installed
# from its folder with `pip install -e .`: the Alembic migration scripts (alembic/) are not
# in the wheel, and `hbmwatch up` finds them beside the installed packages only in a
# checkout (store/migrate.py), so a plain `pip install .` would fail at its first migration.
COPY . .
RUN pip install --no-deps -e . \
 && python -c "from store.migrate import script_location; script_location()"

USER hbmwatch:hbmwatch
WORKDIR /var/lib/hbmwatch

EXPOSE 8427

HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('HBMWATCH_API__PORT', '8427'), timeout=4)"]

ENTRYPOINT ["hbmwatch"]
CMD ["up"]
