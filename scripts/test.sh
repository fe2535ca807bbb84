#!/usr/bin/env bash
# Runs the whole test suite. First installs what the tests use: the Python tools in
# scripts/requirements.txt (moto server, cfn-lint, cargo-lambda) and the kernelbot launcher's
# in infra/kernelbot/requirements.txt into .venv, once per change of those files, and
# Debian's shellcheck package if it is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

requirements=(scripts/requirements.txt infra/kernelbot/requirements.txt)
stamp=.venv/.requirements
if ! cat "${requirements[@]}" | cmp -s - "$stamp" 2>/dev/null; then
  echo "Installing test tools into .venv..." >&2
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check "${requirements[@]/#/-r}"
  cat "${requirements[@]}" > "$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"
# moto, with its writes made atomic as DynamoDB's are (see the script).
export MOTO_SERVER="$PWD/scripts/moto-atomic-server"

# Debian's shellcheck lints the node scripts.
if ! command -v shellcheck >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get install -y -qq shellcheck >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq shellcheck; }) >&2
  else
    echo "shellcheck is missing: sudo apt-get install shellcheck" >&2
    exit 1
  fi
fi

cfn-lint template.yaml
shellcheck infra/buildkite/*.sh scripts/test.sh scripts/bench.sh
cargo test --locked "$@" -- --include-ignored
# The kernelbot launcher's suite, its round trips through the real local stack included.
cargo build --locked --quiet --bin local
KERNELBOT_LOCAL_BIN="${CARGO_TARGET_DIR:-target}/debug/local" python3 -m pytest -q infra/kernelbot/tests
