#!/usr/bin/env bash
# Make sure PostgreSQL answers on 127.0.0.1:5432 and the test database exists.
set -euo pipefail
url=${SIGNOFF_TEST_POSTGRES_URL:-postgresql://postgres@127.0.0.1:5432/signoff_test}
db=${url##*/}

if ! pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then
  echo "==> starting PostgreSQL"
  if command -v pg_ctlcluster >/dev/null 2>&1 && [ -d /etc/postgresql ]; then
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | sort -V | tail -1)" main start
  else
    echo "error: PostgreSQL is not running on 127.0.0.1:5432 and no local cluster was found;" >&2
    echo "       start one, or set SIGNOFF_TEST_POSTGRES_URL to a reachable server" >&2
    exit 1
  fi
  for _ in $(seq 1 30); do pg_isready -h 127.0.0.1 -p 5432 -q && break; sleep 1; done
fi
if ! psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$db'" | grep -q 1; then
  echo "==> creating database $db"
  psql -h 127.0.0.1 -U postgres -qc "CREATE DATABASE \"$db\""
fi
