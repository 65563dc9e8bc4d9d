#!/usr/bin/env bash
# The Sluice test command (README, "Quickstart"). Installs what the tests need,
# builds the host and every plugin/fixture component, starts a throwaway
# PostgreSQL, fetches Apache Kafka from Maven Central, then runs the whole
# suite: unit tests, SDK tests and the end-to-end tests against real built
# components, real files, real databases and Apache Kafka brokers started
# per test (librdkafka's mock cluster where a test injects faults).
# Extra arguments go to `cargo test`.
#
# Environment: SLUICE_TOOLS, where downloaded tools are kept (default
# ~/.cache/sluice-tools).
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }

step "wasm32-wasip2 target"
# Where rustup cannot download it, shared/toolchain installs the same
# component (Rust 1.95.0) from a copy.
if ! rustup target add wasm32-wasip2; then
  bash ../shared/toolchain/install-wasm32-wasip2.sh
fi

# Servers for the end-to-end tests, fetched once into a tools dir outside
# the repo and reused across runs.
TOOLS=${SLUICE_TOOLS:-$HOME/.cache/sluice-tools}
export SLUICE_TOOLS="$TOOLS"

step "Apache Kafka (Maven Central, pinned in servers/kafka/pom.xml)"
# Java 17 or later runs the brokers; Maven fetches them.
for tool in java mvn; do
  command -v "$tool" >/dev/null || { echo "test.sh: $tool is needed (Java 17+ and Maven) to fetch and run Apache Kafka" >&2; exit 1; }
done
# The tests start their own KRaft brokers from these jars (tests/e2e/kafka.rs).
SLUICE_KAFKA_LIB=$(bash scripts/kafka.sh fetch)
export SLUICE_KAFKA_LIB

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
