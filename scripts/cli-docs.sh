#!/usr/bin/env bash
# Regenerate docs/cli.md from the host's own --help (a test checks they match).
set -euo pipefail
cd "$(dirname "$0")/.."
HOST=${HOST:-target/debug/host}
{
  echo "# CLI reference"
  echo
  echo "Generated from \`host … --help\` by \`scripts/cli-docs.sh\`; a test fails when it is out of date."
  for cmd in "" "run" "demo" "test" "swap" "status" "plugin new" "plugin inspect" "checkpoint show" "checkpoint reset" "group status" "group swap" "group reset" "group adopt" "group disband"; do
    echo
    echo "## host${cmd:+ $cmd}"
    echo
    echo '```text'
    # shellcheck disable=SC2086
    COLUMNS=100 "$HOST" $cmd --help
    echo '```'
  done
} > docs/cli.md
