#!/usr/bin/env bash
# Apache Kafka from Maven Central: the broker the test suite runs, and a
# local one to try Sluice on (docs/operations.md, "A local broker").
#
#   bash scripts/kafka.sh fetch    fetch the jars servers/kafka/pom.xml pins
#                                  into $SLUICE_TOOLS/kafka-VERSION/lib
#                                  (once; prints that directory)
#   bash scripts/kafka.sh start    fetch, then start one KRaft broker
#                                  (broker and controller in one process) on
#                                  127.0.0.1:${KAFKA_PORT:-9092}, its data and
#                                  log in ${KAFKA_DIR:-$SLUICE_TOOLS/kafka-local}
#   bash scripts/kafka.sh stop     stop it (SIGTERM: a controlled shutdown)
#   bash scripts/kafka.sh status   say whether it runs
#   bash scripts/kafka.sh topic NAME [PARTITIONS]
#                                  create a topic on it (Kafka's TopicCommand;
#                                  PARTITIONS defaults to 1)
#
# Needs Java 17 or later and Maven (mvn). SLUICE_TOOLS defaults to
# ~/.cache/sluice-tools. Exit codes: 0 done, 1 failed, 2 usage.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
POM="$ROOT/servers/kafka/pom.xml"
TOOLS=${SLUICE_TOOLS:-$HOME/.cache/sluice-tools}
VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$POM")
LIB="$TOOLS/kafka-$VERSION/lib"
DIR=${KAFKA_DIR:-$TOOLS/kafka-local}
PORT=${KAFKA_PORT:-9092}
CPORT=${KAFKA_CONTROLLER_PORT:-$((PORT + 1))}

# fetch: copy the pinned artifacts and their dependencies into $LIB unless
# the stamp there names this pom's checksum.
fetch() {
  local sum
  sum=$(sha256sum "$POM" | cut -d' ' -f1)
  if [ -f "$LIB/.pom.sha256" ] && [ "$(cat "$LIB/.pom.sha256")" = "$sum" ]; then
    echo "$LIB"
    return
  fi
  command -v mvn >/dev/null || { echo "kafka.sh: mvn (Maven) is needed to fetch Kafka" >&2; exit 1; }
  command -v java >/dev/null || { echo "kafka.sh: java (17 or later) is needed" >&2; exit 1; }
  rm -rf "$LIB.tmp"
  echo "kafka.sh: fetching Apache Kafka $VERSION from Maven Central into $LIB" >&2
  mvn -q -B -f "$POM" dependency:copy-dependencies -DoutputDirectory="$LIB.tmp" >&2
  rm -rf "$LIB"
  mv "$LIB.tmp" "$LIB"
  echo "$sum" > "$LIB/.pom.sha256"
  echo "$LIB"
}

JAVA_ARGS=(-Xms256m -Xmx1g "-Dlog4j2.configurationFile=$ROOT/servers/kafka/log4j2.properties" -cp "$LIB/*")
java_kafka() { java "${JAVA_ARGS[@]}" "$@"; }

running() { [ -f "$DIR/pid" ] && kill -0 "$(cat "$DIR/pid")" 2>/dev/null; }

start() {
  fetch >/dev/null
  if running; then
    echo "kafka.sh: already running (pid $(cat "$DIR/pid")), bootstrap 127.0.0.1:$PORT"
    return
  fi
  mkdir -p "$DIR"
  if [ ! -f "$DIR/data/meta.properties" ]; then
    cat > "$DIR/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CPORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CPORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$DIR/data
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
group.initial.rebalance.delay.ms=0
PROPS
    java_kafka kafka.tools.StorageTool format -t "$(java_kafka kafka.tools.StorageTool random-uuid)" \
      -c "$DIR/server.properties" >/dev/null
  fi
  nohup java "${JAVA_ARGS[@]}" kafka.Kafka "$DIR/server.properties" >> "$DIR/broker.log" 2>&1 &
  echo $! > "$DIR/pid"
  for _ in $(seq 1 600); do
    if (exec 3<>/dev/tcp/127.0.0.1/"$PORT") 2>/dev/null; then
      echo "kafka.sh: Apache Kafka $VERSION runs (pid $(cat "$DIR/pid")), bootstrap 127.0.0.1:$PORT; log $DIR/broker.log"
      return
    fi
    running || { echo "kafka.sh: the broker exited; its log:" >&2; tail -20 "$DIR/broker.log" >&2; exit 1; }
    sleep 0.1
  done
  echo "kafka.sh: the broker did not listen on 127.0.0.1:$PORT within 60 s; see $DIR/broker.log" >&2
  exit 1
}

stop() {
  if ! running; then
    echo "kafka.sh: not running"
    return
  fi
  local pid
  pid=$(cat "$DIR/pid")
  kill -TERM "$pid"
  for _ in $(seq 1 600); do
    kill -0 "$pid" 2>/dev/null || { rm -f "$DIR/pid"; echo "kafka.sh: stopped"; return; }
    sleep 0.1
  done
  echo "kafka.sh: pid $pid did not stop within 60 s" >&2
  exit 1
}

topic() {
  [ -n "${1:-}" ] || { echo "kafka.sh: topic NAME [PARTITIONS]" >&2; exit 2; }
  running || { echo "kafka.sh: the broker is not running: bash scripts/kafka.sh start" >&2; exit 1; }
  java_kafka org.apache.kafka.tools.TopicCommand --bootstrap-server "127.0.0.1:$PORT" \
    --create --topic "$1" --partitions "${2:-1}" --replication-factor 1
}

case "${1:-}" in
  fetch) fetch ;;
  topic) shift; topic "$@" ;;
  start) start ;;
  stop) stop ;;
  status) if running; then echo "running (pid $(cat "$DIR/pid")), bootstrap 127.0.0.1:$PORT"; else echo "not running"; exit 1; fi ;;
  *) sed -n '2,20p' "$0" >&2; exit 2 ;;
esac
