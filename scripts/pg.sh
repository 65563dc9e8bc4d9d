#!/usr/bin/env bash
# Start/stop a throwaway PostgreSQL cluster for tests: Debian's
# `postgresql` package (installed if missing), initdb in a temp dir with
# trust auth, listening on a free port on 127.0.0.1 only. No system service
# is used. Source this file, then `pg_start` (exports SLUICE_TEST_PG_URL)
# and `pg_stop`.

pg_bindir() {
  local d
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then echo "$d"; return 0; fi
  done
  if command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then
    dirname "$(command -v initdb)"; return 0
  fi
  return 1
}

pg_as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_start() {
  local bin
  if ! bin=$(pg_bindir); then
    echo "installing Debian's postgresql package"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq postgresql >/dev/null
    bin=$(pg_bindir)
  fi
  if [ "$(id -u)" = 0 ] && ! id postgres >/dev/null 2>&1; then
    useradd --system --home-dir /var/lib/postgresql postgres
  fi
  SLUICE_PG_DIR=$(mktemp -d /tmp/sluice-pg.XXXXXX)
  [ "$(id -u)" = 0 ] && chown postgres "$SLUICE_PG_DIR"
  local port
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  pg_as_owner "$bin/initdb" -D "$SLUICE_PG_DIR/data" -A trust -U postgres --no-sync >"$SLUICE_PG_DIR/initdb.log" 2>&1 \
    || { cat "$SLUICE_PG_DIR/initdb.log"; return 1; }
  # One role that must authenticate with a password (the tests of
  # --sink-db-password-file, PGPASSWORD and ~/.pgpass create it); every
  # other connection is trusted.
  sed -i '1i host all sluice_pw 127.0.0.1/32 scram-sha-256' "$SLUICE_PG_DIR/data/pg_hba.conf"
  pg_as_owner "$bin/pg_ctl" -D "$SLUICE_PG_DIR/data" -l "$SLUICE_PG_DIR/server.log" -w -t 60 \
    -o "-p $port -k $SLUICE_PG_DIR -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" start >/dev/null \
    || { cat "$SLUICE_PG_DIR/server.log"; return 1; }
  SLUICE_PG_BIN=$bin
  export SLUICE_PG_DIR SLUICE_PG_BIN
  export SLUICE_TEST_PG_URL="postgres://postgres@127.0.0.1:$port/postgres"
  echo "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$port (data in $SLUICE_PG_DIR)"
}

pg_stop() {
  if [ -n "${SLUICE_PG_DIR:-}" ] && [ -d "$SLUICE_PG_DIR/data" ]; then
    pg_as_owner "$SLUICE_PG_BIN/pg_ctl" -D "$SLUICE_PG_DIR/data" -m immediate stop >/dev/null 2>&1 || true
    rm -rf "$SLUICE_PG_DIR"
  fi
}
