#!/usr/bin/env bash
# Runs the whole test suite. First installs what the tests use: the Python tools in
# scripts/requirements.txt (moto server, cfn-lint, cargo-lambda) into .venv, once per change
# of that file, and shellcheck from Debian's packages if it is missing.
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
# moto, with its writes made atomic as DynamoDB's are (see the script).
export MOTO_SERVER="$PWD/scripts/moto-atomic-server"

# shellcheck (Debian's package) lints the node scripts.
if ! command -v shellcheck >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get install -y -qq shellcheck >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq shellcheck; }) >&2
  else
    echo "shellcheck is missing: sudo apt-get install shellcheck" >&2
    exit 1
  fi
fi

cfn-lint template.yaml
shellcheck infra/buildkite/*.sh
cargo test --locked "$@" -- --include-ignored
