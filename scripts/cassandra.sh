#!/usr/bin/env bash
# Apache Cassandra from Maven Central: a local single node to try CQL on,
# and the server the Cassandra sink's tests will start (issue 53).
#
#   bash scripts/cassandra.sh fetch   fetch the jars servers/cassandra/pom.xml
#                                     pins into $SLUICE_TOOLS/cassandra-VERSION/lib
#                                     (once; prints that directory)
#   bash scripts/cassandra.sh start   fetch, then start one node: CQL on
#                                     127.0.0.1:${CASSANDRA_PORT:-9042}, its
#                                     data and log in
#                                     ${CASSANDRA_DIR:-$SLUICE_TOOLS/cassandra-local}
#   bash scripts/cassandra.sh stop    stop it (SIGTERM)
#   bash scripts/cassandra.sh status  say whether it runs
#
# Needs Java 17 or later and Maven (mvn). SLUICE_TOOLS defaults to
# ~/.cache/sluice-tools. A node takes ~1 GB of memory (-Xmx1g). Exit
# codes: 0 done, 1 failed, 2 usage.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
POM="$ROOT/servers/cassandra/pom.xml"
TOOLS=${SLUICE_TOOLS:-$HOME/.cache/sluice-tools}
VERSION=$(sed -n 's:.*<cassandra.version>\(.*\)</cassandra.version>.*:\1:p' "$POM")
LIB="$TOOLS/cassandra-$VERSION/lib"
DIR=${CASSANDRA_DIR:-$TOOLS/cassandra-local}
PORT=${CASSANDRA_PORT:-9042}
# Gossip between nodes; a single node listens on it all the same.
SPORT=${CASSANDRA_STORAGE_PORT:-$((PORT + 1))}

# fetch: copy the pinned artifacts and their dependencies into $LIB unless
# the stamp there names this pom's checksum.
fetch() {
  local sum
  sum=$(sha256sum "$POM" | cut -d' ' -f1)
  if [ -f "$LIB/.pom.sha256" ] && [ "$(cat "$LIB/.pom.sha256")" = "$sum" ]; then
    echo "$LIB"
    return
  fi
  command -v mvn >/dev/null || { echo "cassandra.sh: mvn (Maven) is needed to fetch Cassandra" >&2; exit 1; }
  command -v java >/dev/null || { echo "cassandra.sh: java (17 or later) is needed" >&2; exit 1; }
  rm -rf "$LIB.tmp"
  echo "cassandra.sh: fetching Apache Cassandra $VERSION from Maven Central into $LIB" >&2
  mvn -q -B -f "$POM" dependency:copy-dependencies -DoutputDirectory="$LIB.tmp" >&2
  rm -rf "$LIB"
  mv "$LIB.tmp" "$LIB"
  echo "$sum" > "$LIB/.pom.sha256"
  echo "$LIB"
}

running() { [ -f "$DIR/pid" ] && kill -0 "$(cat "$DIR/pid")" 2>/dev/null; }

start() {
  fetch >/dev/null
  if running; then
    echo "cassandra.sh: already running (pid $(cat "$DIR/pid")), CQL on 127.0.0.1:$PORT"
    return
  fi
  mkdir -p "$DIR"
  # The settings a node cannot start without (cassandra.yaml's defaults
  # cover the rest); one token: a single node owns the whole ring.
  cat > "$DIR/cassandra.yaml" <<YAML
cluster_name: sluice-local
num_tokens: 1
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: SimpleSnitch
commitlog_sync: periodic
commitlog_sync_period: 10000ms
seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "127.0.0.1:$SPORT"
listen_address: 127.0.0.1
rpc_address: 127.0.0.1
storage_port: $SPORT
native_transport_port: $PORT
start_native_transport: true
data_file_directories:
  - $DIR/data
commitlog_directory: $DIR/commitlog
saved_caches_directory: $DIR/saved_caches
hints_directory: $DIR/hints
cdc_raw_directory: $DIR/cdc_raw
YAML
  local opts=()
  while IFS= read -r line; do
    case "$line" in ''|'#'*) ;; *) opts+=("$line") ;; esac
  done < "$ROOT/servers/cassandra/jvm17.options"
  # Foreground, or Cassandra closes stdout; a short ring delay, as a test
  # node has no peers to wait for.
  nohup java -Xms512m -Xmx1g -XX:+UseG1GC "${opts[@]}" \
    "-Dcassandra.config=file://$DIR/cassandra.yaml" \
    "-Dcassandra.storagedir=$DIR" "-Dcassandra.logdir=$DIR/logs" \
    -Dcassandra-foreground=yes -Dcassandra.ring_delay_ms=1000 \
    -Dcassandra.load_ring_state=false -Dcassandra.skip_wait_for_gossip_to_settle=0 \
    "-Dlogback.configurationFile=$ROOT/servers/cassandra/logback.xml" \
    -cp "$LIB/*" org.apache.cassandra.service.CassandraDaemon >> "$DIR/node.log" 2>&1 &
  echo $! > "$DIR/pid"
  for _ in $(seq 1 1200); do
    if (exec 3<>/dev/tcp/127.0.0.1/"$PORT") 2>/dev/null; then
      echo "cassandra.sh: Apache Cassandra $VERSION runs (pid $(cat "$DIR/pid")), CQL on 127.0.0.1:$PORT; log $DIR/node.log"
      return
    fi
    running || { echo "cassandra.sh: the node exited; its log:" >&2; tail -20 "$DIR/node.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "cassandra.sh: the node did not listen on 127.0.0.1:$PORT within 120 s; see $DIR/node.log" >&2
  exit 1
}

stop() {
  if ! running; then
    echo "cassandra.sh: not running"
    return
  fi
  local pid
  pid=$(cat "$DIR/pid")
  kill -TERM "$pid"
  for _ in $(seq 1 600); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$DIR/pid"; echo "cassandra.sh: stopped"; return; }
    sleep 0.1
  done
  echo "cassandra.sh: pid $pid did not stop within 60 s" >&2
  exit 1
}

case "${1:-}" in
  fetch) fetch ;;
  start) start ;;
  stop) stop ;;
  status) if running; then echo "running (pid $(cat "$DIR/pid")), CQL on 127.0.0.1:$PORT"; else echo "not running"; exit 1; fi ;;
  *) sed -n '2,17p' "$0" >&2; exit 2 ;;
esac
