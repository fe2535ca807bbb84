# Sourced by scripts/test.sh and scripts/bench.sh: installs the Python tools in
# scripts/requirements.txt (moto server, cfn-lint, cargo-lambda) and the kernelbot launcher's
# in infra/kernelbot/requirements.txt into .venv, once per change of those files, then puts
# them on PATH and names the moto server the DynamoDB tests start.
# shellcheck shell=bash

requirements=(scripts/requirements.txt infra/kernelbot/requirements.txt)
stamp=.venv/.requirements
if ! cat "${requirements[@]}" | cmp -s - "$stamp" 2>/dev/null; then
  echo "Installing tools into .venv..." >&2
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check "${requirements[@]/#/-r}"
  cat "${requirements[@]}" > "$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"
# moto, with its writes made atomic as DynamoDB's are (see the script).
export MOTO_SERVER="$PWD/scripts/moto-atomic-server"
