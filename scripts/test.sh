#!/usr/bin/env bash
# The Sluice test command (README, "Quickstart"). Installs what the tests need,
# builds the host and every plugin/fixture component, starts a throwaway
# PostgreSQL, then runs the whole suite: unit tests, SDK tests and the
# end-to-end tests against real built components, real files and real
# databases, and a nisshi broker (Tansu 0.6.0 for the tests of its
# faults) started per test. Extra arguments go to `cargo test`.
#
# Environment: SLUICE_TOOLS, where the brokers are installed (default
# ~/.cache/sluice-tools).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

# install_once BIN STAMP VERSION CARGO-INSTALL-ARGS...: run `cargo install
# ARGS` unless BIN exists and the file STAMP says VERSION, then write it.
install_once() {
  local bin=$1 stamp=$2 version=$3
  shift 3
  if [ ! -x "$bin" ] || ! grep -qs "^$version\$" "$stamp"; then
    cargo install "$@"
    echo "$version" > "$stamp"
  fi
}

step "wasm32-wasip2 target"
rustup target add wasm32-wasip2

# Kafka-compatible brokers for the end-to-end tests, installed once into a
# tools dir outside the repo and reused across runs.
TOOLS=${SLUICE_TOOLS:-$HOME/.cache/sluice-tools}

step "nisshi 0.8.1 (the suite's broker)"
# Its lockfile pins crates that declare rust-version 1.96 (rama 0.4.0);
# they build with this machine's 1.95, hence --ignore-rust-version. SQLite
# storage only. A cold install took about 12 minutes here on 2 cores.
install_once "$TOOLS/bin/nisshi" "$TOOLS/nisshi.version" 0.8.1 \
  nisshi --locked --ignore-rust-version --version 0.8.1 \
  --no-default-features --features libsql --root "$TOOLS"
export SLUICE_NISSHI="$TOOLS/bin/nisshi"

step "nisshi 0.7.0 (the broker of the exactly-once output tests)"
# The last nisshi release that runs Kafka transactions (0.8.x refuses a
# transactional id); its SQLite storage keeps the COMMIT/ABORT markers and
# the offsets committed in transactions. Installed beside 0.8.1. A cold
# install took about 40 minutes here, next to another build on 2 cores.
install_once "$TOOLS/nisshi-0.7.0/bin/nisshi" "$TOOLS/nisshi-0.7.0/version" 0.7.0 \
  nisshi --locked --ignore-rust-version --version 0.7.0 \
  --no-default-features --features libsql --root "$TOOLS/nisshi-0.7.0"
export SLUICE_NISSHI_TXN="$TOOLS/nisshi-0.7.0/bin/nisshi"

step "Tansu 0.6.0 (for the tests of its faults)"
# A cold install took about 20 minutes here on 2 cores.
install_once "$TOOLS/bin/tansu" "$TOOLS/tansu.version" 0.6.0 \
  tansu --locked --version 0.6.0 --features dynostore,libsql --root "$TOOLS"
export SLUICE_TANSU="$TOOLS/bin/tansu"

step "PostgreSQL (throwaway cluster on 127.0.0.1)"
# shellcheck source=scripts/pg.sh
source scripts/pg.sh
pg_start
trap pg_stop EXIT

step "build plugins and fixtures (wasm32-wasip2, debug)"
cargo build --target wasm32-wasip2 \
  -p company -p passthrough -p cdc \
  -p misbehave -p wrong-world -p future-version -p sql-counter \
  -p tag-v1 -p tag-v2 -p fat-start -p old-contract -p router -p sender

step "componentize-py 0.25.1, the Python SDK and the Python plugins"
# A virtualenv in the tools dir holds componentize-py (PyPI, a prebuilt
# wheel); the SDK is installed from this repository with pip, as a user
# would, then builds each Python plugin into target/python/NAME.wasm.
PY="$TOOLS/python"
if [ ! -x "$PY/bin/python" ] || ! grep -qs '^0.25.1$' "$TOOLS/componentize-py.version"; then
  python3 -m venv "$PY"
  "$PY/bin/pip" install -q 'componentize-py==0.25.1'
  echo 0.25.1 > "$TOOLS/componentize-py.version"
fi
"$PY/bin/pip" install -q ./guest-sdk-python
PYOUT="${CARGO_TARGET_DIR:-target}/python"
mkdir -p "$PYOUT"
for app in plugins/python/company plugins/python/passthrough tests/fixtures/python/misbehave tests/fixtures/python/tag tests/fixtures/python/sender; do
  "$PY/bin/python" -m sluice_guest.build "$app/app.py" -o "$PYOUT/$(basename "$app").wasm"
done
(cd guest-sdk-python && "$PY/bin/python" -m unittest discover -s tests -t . -q)

step "ComponentizeJS 0.23.0, the JavaScript SDK and the JavaScript plugins"
# npm installs the SDK's pinned build tools (ComponentizeJS, esbuild) from
# its lockfile; plugins/js links the SDK from this repository, as a user's
# package.json would, and its build script makes each JavaScript plugin,
# copied into target/js/NAME.wasm.
(cd guest-sdk-js && npm ci --no-audit --no-fund)
(cd plugins/js && npm install --no-audit --no-fund && npm run build)
JSOUT="${CARGO_TARGET_DIR:-target}/js"
mkdir -p "$JSOUT"
cp plugins/js/company.wasm plugins/js/passthrough.wasm "$JSOUT/"
for app in tests/fixtures/js/misbehave tests/fixtures/js/tag tests/fixtures/js/sender; do
  node guest-sdk-js/src/build.js "$app/app.js" -o "$JSOUT/$(basename "$app").wasm"
done
node tests/fixtures/js/http/build.mjs "$JSOUT/http.wasm"   # imports wasi:http: refused at load
(cd guest-sdk-js && node --test test/)

step "build host"
cargo build -p host --features failpoints
cargo build -p sluice-bench --bin produce

step "tests"
cargo test --workspace "$@"
