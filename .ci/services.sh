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
