#!/usr/bin/env bash
# Runs the whole test suite. Installs what the tests need first: a moto server (PyPI) in
# .venv, the DynamoDB-compatible server the DynamoDB store is tested against.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ ! -x .venv/bin/moto_server ]; then
  echo "Installing moto server into .venv (one time)..." >&2
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check "moto[server]>=5.1,<6"
fi
export MOTO_SERVER="$PWD/.venv/bin/moto_server"

cargo test --locked "$@"
