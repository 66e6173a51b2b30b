#!/usr/bin/env bash
# What the test suite needs beyond pip: installed from Debian's packages when missing (as root), so that
# `make test` does all set-up on a fresh machine. Fast when everything is there.
#
# PostgreSQL and MariaDB (tests/databases.py): unless TEST_POSTGRES_URL / TEST_MARIADB_URL point elsewhere,
# the tests use the local servers, which this script installs, starts and sets up when they do not answer:
#   PostgreSQL on 127.0.0.1:5432, user postgres without a password over TCP (trust), database test;
#   MariaDB on 127.0.0.1:3306, user root without a password over TCP, database test.
# A fresh Debian server refuses both logins (PostgreSQL asks for a password over TCP, MariaDB's root logs in
# through its Unix socket only); the set-up goes through each server's socket as its administrator.
# PG_PORT, PG_SOCKET_DIR, MARIADB_PORT and MARIADB_SOCKET name another local server (to check this script).
set -euo pipefail

PG_DEFAULT_URL=postgresql://postgres@127.0.0.1:5432/test
MARIADB_DEFAULT_URL=mysql://root@127.0.0.1:3306/test
PG_PORT=${PG_PORT:-5432}
PG_SOCKET_DIR=${PG_SOCKET_DIR:-/var/run/postgresql}
MARIADB_PORT=${MARIADB_PORT:-3306}
MARIADB_SOCKET=${MARIADB_SOCKET:-/run/mysqld/mysqld.sock}
want_pg=$([ "${TEST_POSTGRES_URL:-$PG_DEFAULT_URL}" = "$PG_DEFAULT_URL" ] && echo 1 || echo 0)
want_mariadb=$([ "${TEST_MARIADB_URL:-$MARIADB_DEFAULT_URL}" = "$MARIADB_DEFAULT_URL" ] && echo 1 || echo 0)

pg_answers() {  # the login the tests use: TCP, no password
  PGCONNECT_TIMEOUT=3 psql "host=127.0.0.1 port=$PG_PORT user=postgres dbname=test" -w -X -Atqc 'SELECT 1' \
    >/dev/null 2>&1
}
mariadb_answers() {
  mariadb --no-defaults --protocol=TCP -h 127.0.0.1 -P "$MARIADB_PORT" -u root --connect-timeout=3 \
    -e 'USE test' >/dev/null 2>&1
}

pg_ok=1; mariadb_ok=1
if [ "$want_pg" = 1 ] && ! { command -v psql >/dev/null 2>&1 && pg_answers; }; then pg_ok=0; fi
if [ "$want_mariadb" = 1 ] && ! { command -v mariadb >/dev/null 2>&1 && mariadb_answers; }; then mariadb_ok=0; fi

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
# the local-cluster test puts nginx in front of the gateways; the alert-rule and dashboard tests run Prometheus
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx-light)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
# the SQL tests' private servers run these programs even when the machine's servers are elsewhere
compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || missing+=(postgresql)
command -v psql >/dev/null 2>&1 || missing+=(postgresql-client)
[ -x /usr/sbin/mariadbd ] || missing+=(mariadb-server)
command -v mariadb >/dev/null 2>&1 || missing+=(mariadb-client)

if [ ${#missing[@]} -eq 0 ] && [ $pg_ok = 1 ] && [ $mariadb_ok = 1 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  needs=("${missing[@]}")
  [ $pg_ok = 1 ] || needs+=("PostgreSQL answering on 127.0.0.1:$PG_PORT (user postgres, database test)")
  [ $mariadb_ok = 1 ] || needs+=("MariaDB answering on 127.0.0.1:$MARIADB_PORT (user root, database test)")
  printf 'the tests need: %s\n' "${needs[@]}" >&2
  echo "run this script as root to install and set them up, or set TEST_POSTGRES_URL / TEST_MARIADB_URL" >&2
  exit 1
fi
if [ ${#missing[@]} -gt 0 ]; then
  apt-get update -qq
  # a package's post-install script may try to start its server: without systemd that fails harmlessly
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...: poll until COMMAND succeeds
  local seconds=$1 what=$2; shift 2
  for _ in $(seq $((seconds * 5))); do "$@" && return 0; sleep 0.2; done
  echo "timed out after ${seconds} s waiting for $what" >&2
  return 1
}

setup_postgres() {
  local version cluster hba
  pg_local() { runuser -u postgres -- psql -h "$PG_SOCKET_DIR" -p "$PG_PORT" -X -Atq -v ON_ERROR_STOP=1 "$@"; }
  pg_up() { pg_local -c 'SELECT 1' >/dev/null 2>&1; }
  if [ "$PG_PORT" = 5432 ] && ! pg_up; then
    version=$(ls /usr/lib/postgresql | sort -n | tail -1)
    [ -d "/etc/postgresql/$version/main" ] || pg_createcluster "$version" main
    install -d -o postgres -g postgres -m 2775 /var/run/postgresql
    pg_ctlcluster --skip-systemctl-redirect "$version" main start || true  # "already running" is fine
    wait_for 30 "PostgreSQL $version to start (see /var/log/postgresql)" pg_up
  fi
  if ! PGCONNECT_TIMEOUT=3 psql "host=127.0.0.1 port=$PG_PORT user=postgres dbname=postgres" -w -X -Atqc 'SELECT 1' \
      >/dev/null 2>&1; then
    # a fresh cluster asks for a password over TCP (scram-sha-256): trust local TCP logins, first rules win
    hba=$(pg_local -c 'SHOW hba_file')
    cluster=$(mktemp)
    { printf '%s\n' "# the test suite logs in over TCP without a password (scripts/ensure_test_services.sh)" \
        "host all all 127.0.0.1/32 trust" "host all all ::1/128 trust"; cat "$hba"; } > "$cluster"
    cat "$cluster" > "$hba" && rm -f "$cluster"
    pg_local -c 'SELECT pg_reload_conf()' >/dev/null
  fi
  if [ -z "$(pg_local -c "SELECT 1 FROM pg_database WHERE datname = 'test'")" ]; then
    pg_local -c 'CREATE DATABASE test' >/dev/null
  fi
  wait_for 10 "PostgreSQL to accept the tests' login (postgres over TCP, database test)" pg_answers
}

setup_mariadb() {
  maria_local() { mariadb --no-defaults --protocol=SOCKET -S "$MARIADB_SOCKET" -u root "$@"; }
  maria_up() { maria_local -e 'SELECT 1' >/dev/null 2>&1; }
  if [ "$MARIADB_SOCKET" = /run/mysqld/mysqld.sock ] && ! maria_up; then
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null
    install -d -o mysql -g mysql /run/mysqld
    # the start command of this kind of machine, plus: --pidfile, so that a test's private mariadbd does not
    # pass for this one; --user, in case the configuration names none (Debian's does not)
    start-stop-daemon --start --oknodo --background --pidfile /run/mysqld/mysqld.pid --exec /usr/sbin/mariadbd \
      -- --user=mysql
    wait_for 60 "MariaDB to start (see its error log, /var/log/mysql)" maria_up
  fi
  # a fresh root logs in through the socket only (unix_socket): let it in over TCP without a password too
  maria_local <<'SQL'
ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('');
CREATE USER IF NOT EXISTS 'root'@'127.0.0.1';
ALTER USER 'root'@'127.0.0.1' IDENTIFIED VIA mysql_native_password USING PASSWORD('');
GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
CREATE DATABASE IF NOT EXISTS test;
SQL
  wait_for 10 "MariaDB to accept the tests' login (root over TCP, database test)" mariadb_answers
}

if [ $pg_ok = 0 ] && ! pg_answers; then setup_postgres; fi
if [ $mariadb_ok = 0 ] && ! mariadb_answers; then setup_mariadb; fi
