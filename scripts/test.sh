#!/usr/bin/env bash
# Runs the whole test suite. First installs the Python tools the tests use into .venv
# (scripts/requirements.txt: moto server, cfn-lint, cargo-lambda), once per change of that file.
set -euo pipefail
cd "$(dirname "$0")/.."

stamp=.venv/.requirements
if ! cmp -s scripts/requirements.txt "$stamp" 2>/dev/null; then
  echo "Installing test tools into .venv..." >&2
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check -r scripts/requirements.txt
  cp scripts/requirements.txt "$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"
export MOTO_SERVER="$PWD/.venv/bin/moto_server"

cfn-lint template.yaml
cargo test --locked "$@"
