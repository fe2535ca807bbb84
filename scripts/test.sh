#!/usr/bin/env bash
# Runs the whole test suite. First installs what the tests use: the Python tools in
# scripts/requirements.txt (moto server, cfn-lint, aws-sam-cli, cargo-lambda, ruff, mypy) and
# the kernelbot launcher package (infra/kernelbot) into .venv, again whenever either changes,
# and Debian's ShellCheck, PostgreSQL and Chromium if they are missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# shellcheck source=scripts/tools.sh
source scripts/tools.sh

# Debian's shellcheck lints the node scripts.
if ! command -v shellcheck >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get install -y -qq shellcheck >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq shellcheck; }) >&2
  else
    echo "shellcheck is missing: sudo apt-get install shellcheck" >&2
    exit 1
  fi
fi

# Debian's PostgreSQL server programs: the launcher's PostgresInbox tests start a server of
# their own with them (not the cluster the package may set up).
if ! compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null && [ -z "${POSTGRES_BIN:-}" ]; then
  if [ "$(id -u)" = 0 ]; then
    (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null 2>&1 ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql; }) >&2
  else
    echo "PostgreSQL is missing: sudo apt-get install postgresql" >&2
    exit 1
  fi
fi

# Debian's Chromium: a test opens the public status page in it, headless.
if ! command -v chromium >/dev/null 2>&1 && [ -z "${CHROMIUM:-}" ]; then
  if [ "$(id -u)" = 0 ]; then
    (DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null 2>&1 ||
      { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }) >&2
  else
    echo "Chromium is missing: sudo apt-get install chromium" >&2
    exit 1
  fi
fi

cfn-lint template.yaml
# SAM's own checks of the transformed template (offline, no credentials).
sam validate --lint --region us-east-1 --template-file template.yaml >/dev/null
shellcheck -x infra/buildkite/*.sh scripts/test.sh scripts/bench.sh scripts/tools.sh
# Every binary first: the launcher's suite below runs `local` directly. Then the runner as
# `devstack::runner_program` builds it (its package alone, whose dependencies' features differ
# from a workspace build's), named to the tests' local stacks by `KERNELBOT_RUNNER`: asked of
# cargo, it would wait on the build directory's lock while another test's cargo builds.
cargo build --locked --quiet --workspace --bins
cargo build --locked --quiet -p kernelbot-runner --bin kernelbot-runner
target_dir="${CARGO_TARGET_DIR:-target}"
case "$target_dir" in /*) ;; *) target_dir="$PWD/$target_dir" ;; esac
export KERNELBOT_RUNNER="$target_dir/debug/kernelbot-runner"
cargo test --locked --workspace "$@" -- --include-ignored
# The kernelbot launcher's lint and strict type check, as its pyproject.toml configures them.
(cd infra/kernelbot && ruff check . && mypy)
# The kernelbot launcher's suite, against the installed package, its round trips through the
# real local stack included.
KERNELBOT_LOCAL_BIN="${CARGO_TARGET_DIR:-target}/debug/local" python3 -m pytest -q infra/kernelbot/tests
