# Sourced by scripts/test.sh and scripts/bench.sh: installs the Python tools in
# scripts/requirements.txt (moto server, cfn-lint, cargo-lambda) and the kernelbot launcher
# (infra/kernelbot, a package, with its test extras) into .venv, again whenever either
# changes, then puts them on PATH and names the moto server the DynamoDB tests start.
# shellcheck shell=bash

launcher=infra/kernelbot
stamp=.venv/.requirements
# What the install depends on: the tools' list and every file of the launcher's package.
wanted="$(cat scripts/requirements.txt; find "$launcher/pyproject.toml" "$launcher/README.md" "$launcher/src" -type f -not -name '*.pyc' | LC_ALL=C sort | xargs sha256sum)"
if [ "$wanted" != "$(cat "$stamp" 2>/dev/null)" ]; then
  echo "Installing tools and the kernelbot launcher into .venv..." >&2
  python3 -m venv .venv
  .venv/bin/pip install --quiet --disable-pip-version-check -r scripts/requirements.txt
  # Not editable: the launcher's suite tests the package as kernelbot would install it.
  .venv/bin/pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "./$launcher"
  .venv/bin/pip install --quiet --disable-pip-version-check "./${launcher}[test]"
  printf '%s' "$wanted" > "$stamp"
fi
export PATH="$PWD/.venv/bin:$PATH"
# moto, with its writes made atomic as DynamoDB's are (see the script).
export MOTO_SERVER="$PWD/scripts/moto-atomic-server"
