#!/usr/bin/env bash
# Starts a throw-away PostgreSQL cluster for the tests and prints its URL on stdout
# (`export CAIRN_TEST_PG_URL=$(.ci/postgres.sh start DIR)`); `.ci/postgres.sh stop DIR` stops
# it, `restart DIR` restarts it (a test restarts a cluster of its own under load). Installs Debian's `postgresql` when it is missing. The cluster lives in DIR (data and
# socket), listens on 127.0.0.1 on a free port, and runs as the `postgres` user: initdb
# refuses root.
set -euo pipefail

bindir() {
    local d
    d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
    [ -n "$d" ] && [ -x "$d/initdb" ] && echo "$d"
}

as_postgres() {
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

case "${1:-}" in
start)
    dir=$2
    if ! bindir >/dev/null; then
        echo "installing postgresql" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2 \
            || { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >&2; }
    fi
    bin=$(bindir)
    mkdir -p "$dir"
    [ "$(id -u)" = 0 ] && chown postgres "$dir"
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    as_postgres "$bin/initdb" -D "$dir/data" -U postgres -A trust --no-sync -E UTF8 >"$dir/initdb.log" 2>&1 \
        || { cat "$dir/initdb.log" >&2; exit 1; }
    # Tests create a schema each and many connections at once.
    as_postgres "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=300 -c fsync=on" start >&2 \
        || { cat "$dir/server.log" >&2; exit 1; }
    echo "postgres://postgres@127.0.0.1:$port/postgres"
    ;;
stop)
    dir=$2
    bin=$(bindir)
    as_postgres "$bin/pg_ctl" -D "$dir/data" -m immediate stop >&2 || true
    ;;
restart)
    # A fast restart on the same port (pg_ctl reuses the options of the last start).
    dir=$2
    bin=$(bindir)
    as_postgres "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 -m fast restart >&2
    ;;
*)
    echo "usage: $0 start DIR | restart DIR | stop DIR" >&2
    exit 2
    ;;
esac
