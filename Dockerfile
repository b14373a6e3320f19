# syntax=docker/dockerfile:1
# hbmwatch: API, collector and detectors (`hbmwatch up`) in one container.
# Built by docker-compose.yml; on its own:
#   docker build -t hbmwatch:0.1.0 . && docker run --rm -p 127.0.0.1:8427:8427 \
#     -e HBMWATCH_API__HOST=0.0.0.0 hbmwatch:0.1.0
# The wheel is built in a stage of its own; the image installs it (not an editable tree),
# with its dependencies pinned by requirements/run.lock.
FROM python:3.11-slim AS wheel
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps -w /dist .

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

# The dependencies first, in their own layer, so a code change does not reinstall them.
COPY requirements/run.lock /tmp/run.lock
RUN pip install -r /tmp/run.lock && rm /tmp/run.lock

# The wheel: the Alembic scripts and dashboards are package data inside it.
COPY --from=wheel /dist/ /tmp/dist/
RUN pip install --no-deps /tmp/dist/hbmwatch-*.whl && rm -r /tmp/dist \
 && python -c "from hbmwatch.store.migrate import script_location; script_location()"

USER hbmwatch:hbmwatch
WORKDIR /var/lib/hbmwatch

EXPOSE 8427

HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('HBMWATCH_API__PORT', '8427'), timeout=4)"]

ENTRYPOINT ["hbmwatch"]
CMD ["up"]
