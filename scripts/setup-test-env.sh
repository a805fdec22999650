#!/usr/bin/env bash
# System packages the test suite needs: Debian's chromium (browser tests), the PostgreSQL server
# binaries (Argilla on PostgreSQL) and a C++ compiler (pip builds llama-cpp-python[server] from
# its sdist; cmake and ninja come from PyPI when missing). `make test` runs this before any pip
# work, and `.ci/run` only calls `make test`.
#   - everything present: exits 0 at once (two lookups, no stamp to go stale);
#   - missing and root: installs the missing packages with apt-get, quietly;
#   - missing and not root (or no apt-get): one line naming the install command, exit 2.
# The Python side (the venv, the pinned packages, llama-cpp-python[server]) is the Makefile's.
set -euo pipefail

missing=() what=()
if ! command -v chromium >/dev/null 2>&1; then
  missing+=(chromium) what+=("Chromium as \`chromium\` on PATH")
fi
# the same places tests/support/argilla_fixtures.py looks for the server binaries
if ! compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null && ! command -v initdb >/dev/null 2>&1; then
  missing+=(postgresql) what+=("the PostgreSQL server (initdb, pg_ctl)")
fi
if ! command -v c++ >/dev/null 2>&1 && ! command -v g++ >/dev/null 2>&1; then
  missing+=(g++) what+=("a C++ compiler")
fi
[ ${#missing[@]} -eq 0 ] && exit 0

packages="${missing[*]}"
if ! command -v apt-get >/dev/null 2>&1; then
  needs="$(IFS=';'; echo "${what[*]}")"
  needs="${needs//;/, }"
  echo "make test needs $needs; this machine has no apt-get: install with its own package manager" >&2
  exit 2
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "make test needs the Debian packages $packages: run \`sudo apt-get update && sudo apt-get install -y $packages\`, then \`make test\` again" >&2
  exit 2
fi

echo "setup-test-env: installing $packages with apt-get (first run only)" >&2
export DEBIAN_FRONTEND=noninteractive
log="$(mktemp -t grouppref-apt.XXXXXX)"
# --force-confold: keep any existing config file instead of asking
if ! { apt-get update -qq && apt-get install -y -qq -o Dpkg::Options::=--force-confold $packages; } >"$log" 2>&1; then
  tail -n 20 "$log" >&2
  echo "setup-test-env: apt-get install $packages failed (full log: $log)" >&2
  exit 2
fi
rm -f "$log"
