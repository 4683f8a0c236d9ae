#!/usr/bin/env bash
# A 3-node Apache Kafka cluster (KRaft: each node is controller + broker) on loopback.
#
#   deploy/kafka/cluster.sh up       fetch the jars once (Maven), format, start, wait for 3 brokers
#   deploy/kafka/cluster.sh down     stop the nodes (SIGTERM, then SIGKILL after 30 s); data kept
#   deploy/kafka/cluster.sh status   which nodes run
#   deploy/kafka/cluster.sh kill N   SIGKILL node N (fault tests);  start N: start it again
#   deploy/kafka/cluster.sh freeze N SIGSTOP node N: up, connected, answering nothing;  thaw N
#   deploy/kafka/cluster.sh wipe     down, then delete the data folders
#
# memstream then runs with MEMSTREAM_KAFKA__BROKER="$(deploy/kafka/cluster.sh url)",
# MEMSTREAM_KAFKA__REPLICATION_FACTOR=3 (min.insync.replicas=2 is the brokers' default
# below, so with acks=all a write survives the loss of any one node) and
# MEMSTREAM_KAFKA__PROCESSING_GUARANTEE=at_least_once (the transactions below work, but
# faust's exactly_once measured slower and not duplicate-free: make delivery, BENCHMARKS.md).
#
# Environment: KAFKA_CLUSTER_DIR (data, logs, pids; default .memstream/cluster/kafka),
# KAFKA_BASE_PORT (brokers listen on BASE+1..3, controllers on BASE+11..13; default 19090),
# KAFKA_HEAP_OPTS (default -Xmx320m -Xms128m per node: enough for tests, not for production).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
version="$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/pom.xml")"
lib="${KAFKA_LIB:-$HOME/.cache/memstream/kafka-$version/lib}"
dir="${KAFKA_CLUSTER_DIR:-.memstream/cluster/kafka}"
base="${KAFKA_BASE_PORT:-19090}"
heap="${KAFKA_HEAP_OPTS:--Xmx320m -Xms128m}"
nodes=(1 2 3)
offsets_partitions=4  # __consumer_offsets: the group coordinator's partitions

broker_port() { echo $((base + $1)); }
controller_port() { echo $((base + 10 + $1)); }
url() {
  local hosts=()
  for n in "${nodes[@]}"; do hosts+=("127.0.0.1:$(broker_port "$n")"); done
  (IFS=';'; echo "kafka://${hosts[*]}")
}
bootstrap() { url | sed 's|kafka://||; s|;|,|g'; }
java_cmd() {
  # Small heaps and one GC thread: three nodes share a 2-core machine with the tests.
  # shellcheck disable=SC2086
  java $heap -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true \
    -Dlog4j2.configurationFile="$here/log4j2.properties" -Dkafka.logs.dir="$dir" \
    -cp "$lib/*" "$@"
}

fetch() {
  if ! ls "$lib"/kafka_2.13-"$version".jar >/dev/null 2>&1; then
    echo "fetching Apache Kafka $version from Maven Central into $lib" >&2
    mvn -q -B -f "$here/pom.xml" dependency:copy-dependencies -Dkafka.lib="$lib"
  fi
}

properties() {
  local n=$1 voters=()
  for m in "${nodes[@]}"; do voters+=("$m@127.0.0.1:$(controller_port "$m")"); done
  cat <<EOF
# node $n of ${#nodes[@]}: KRaft controller and broker in one process
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$(IFS=,; echo "${voters[*]}")
listeners=PLAINTEXT://127.0.0.1:$(broker_port "$n"),CONTROLLER://127.0.0.1:$(controller_port "$n")
advertised.listeners=PLAINTEXT://127.0.0.1:$(broker_port "$n")
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$PWD/$dir/node$n/data
# Durability: every topic 3 copies, a write needs 2 in sync (acks=all), no unclean leaders.
default.replication.factor=3
min.insync.replicas=2
unclean.leader.election.enable=false
offsets.topic.replication.factor=3
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
num.partitions=4
# memstream declares its topics; keep the log (rebuilds replay memstream.events).
auto.create.topics.enable=true
log.retention.hours=-1
# Small machine: few threads, small segments, no delay before the first group rebalance.
num.network.threads=2
num.io.threads=2
num.replica.fetchers=1
background.threads=2
log.segment.bytes=16777216
group.initial.rebalance.delay.ms=0
offsets.topic.num.partitions=$offsets_partitions
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
EOF
}

pid_of() {
  local f="$dir/node$1/pid"
  [[ -f $f ]] && kill -0 "$(cat "$f")" 2>/dev/null && cat "$f"
}

wait_port() {
  local port=$1 tries=${2:-600}
  for ((i = 0; i < tries; i++)); do
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

start_node() {
  local n=$1
  local node="$dir/node$n"
  if pid_of "$n" >/dev/null; then return 0; fi
  mkdir -p "$node"
  properties "$n" >"$node/server.properties"
  if [[ ! -f $node/data/meta.properties ]]; then
    java_cmd kafka.tools.StorageTool format --ignore-formatted \
      -t "$(cat "$dir/cluster.id")" -c "$node/server.properties" >"$node/format.log" 2>&1
  fi
  nohup bash -c "exec $(printf '%q ' java $heap -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    -Djava.awt.headless=true -Dlog4j2.configurationFile="$here/log4j2.properties" \
    -cp "$lib/*" kafka.Kafka "$node/server.properties")" >"$node/server.log" 2>&1 &
  echo $! >"$node/pid"
}

up() {
  fetch
  mkdir -p "$dir"
  [[ -f $dir/cluster.id ]] || java_cmd kafka.tools.StorageTool random-uuid >"$dir/cluster.id"
  for n in "${nodes[@]}"; do start_node "$n"; done
  for n in "${nodes[@]}"; do
    if ! wait_port "$(broker_port "$n")" 900; then
      echo "node $n did not start; see $dir/node$n/server.log" >&2
      tail -20 "$dir/node$n/server.log" >&2
      exit 1
    fi
  done
  wait_brokers
  wait_coordinator
  echo "kafka $version up: $(url)"
}

wait_brokers() {
  # Every node has registered with the controller quorum, so RF 3 topics can be created.
  for ((i = 0; i < 120; i++)); do
    local seen
    seen=$(java_cmd org.apache.kafka.tools.BrokerApiVersionsCommand --bootstrap-server \
      "$(bootstrap)" 2>/dev/null | grep -c '^127.0.0.1:.*(id: [0-9]' || true)
    [[ $seen -ge ${#nodes[@]} ]] && return 0
    sleep 1
  done
  echo "the brokers did not all register" >&2
  exit 1
}

wait_coordinator() {
  # A group's first FindCoordinator makes the cluster create __consumer_offsets (RF 3): asked
  # and waited for here, not by a test's first consumer, whose commits stalled for minutes
  # while it came up on a busy machine.
  java_cmd org.apache.kafka.tools.consumer.group.ConsumerGroupCommand --bootstrap-server \
    "$(bootstrap)" --describe --group memstream-cluster-warmup >/dev/null 2>&1 || true
  for ((i = 0; i < 120; i++)); do
    local led
    led=$(java_cmd org.apache.kafka.tools.TopicCommand --bootstrap-server "$(bootstrap)" \
      --describe --topic __consumer_offsets 2>/dev/null | grep -c 'Leader: [0-9]' || true)
    [[ $led -ge $offsets_partitions ]] && return 0
    sleep 1
  done
  echo "the group coordinator did not come up (__consumer_offsets has no leaders)" >&2
  exit 1
}

stop_node() {
  local n=$1 pid
  pid=$(pid_of "$n") || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 300; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  rm -f "$dir/node$n/pid"
}

down() {
  # All at once: a controlled shutdown of the last two nodes waits for a quorum otherwise.
  for n in "${nodes[@]}"; do
    pid=$(pid_of "$n") && kill -TERM "$pid" 2>/dev/null || true
  done
  for n in "${nodes[@]}"; do stop_node "$n"; done
}

status() {
  for n in "${nodes[@]}"; do
    if pid=$(pid_of "$n"); then
      echo "node $n: running (pid $pid, 127.0.0.1:$(broker_port "$n"))"
    else
      echo "node $n: stopped"
    fi
  done
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  url) url ;;
  bootstrap) bootstrap ;;
  kill) pid=$(pid_of "$2") && kill -KILL "$pid" && rm -f "$dir/node$2/pid" ;;
  start) start_node "$2" && wait_port "$(broker_port "$2")" 900 ;;
  freeze) pid=$(pid_of "$2") && kill -STOP "$pid" ;;
  thaw) pid=$(pid_of "$2") && kill -CONT "$pid" ;;
  stop) stop_node "$2" ;;
  wipe) down; rm -rf "$dir" ;;
  topics) shift; java_cmd org.apache.kafka.tools.TopicCommand --bootstrap-server "$(bootstrap)" "$@" ;;
  groups) shift; java_cmd org.apache.kafka.tools.consumer.group.ConsumerGroupCommand \
    --bootstrap-server "$(bootstrap)" "$@" ;;
  *) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
