#!/usr/bin/env bash
# A Redis Cluster on loopback: 3 primaries, each with 1 replica (Debian's redis-server).
#
#   deploy/redis-cluster/cluster.sh up       start 6 nodes, create the cluster once, wait for ok
#   deploy/redis-cluster/cluster.sh down     stop the nodes (SHUTDOWN, data kept)
#   deploy/redis-cluster/cluster.sh status   cluster state and each node's role
#   deploy/redis-cluster/cluster.sh kill P   SIGKILL the node on port P; start P: start it again
#   deploy/redis-cluster/cluster.sh wipe     down, then delete the data folders
#
# memstream then runs with MEMSTREAM_REDIS__URL="$(deploy/redis-cluster/cluster.sh url)":
# the redis+cluster:// scheme selects redis-py's cluster client, the seed nodes after it.
# Every key of one user carries the hash tag {tenant:user}, so a user's state lives on one
# primary and its writes stay one MULTI/EXEC.
#
# Environment: REDIS_CLUSTER_DIR (default .memstream/cluster/redis), REDIS_BASE_PORT
# (nodes on BASE+1..6, cluster bus on port+10000; default 17000).
set -euo pipefail

dir="${REDIS_CLUSTER_DIR:-.memstream/cluster/redis}"
base="${REDIS_BASE_PORT:-17000}"
ports=()
for i in 1 2 3 4 5 6; do ports+=($((base + i))); done

url() {
  local seeds=()
  for p in "${ports[@]:0:3}"; do seeds+=("127.0.0.1:$p"); done
  (IFS=,; echo "redis+cluster://${seeds[*]}/0")
}

cli() { redis-cli -h 127.0.0.1 -p "$1" "${@:2}"; }

start_node() {
  local p=$1
  local node="$dir/$p"
  cli "$p" ping >/dev/null 2>&1 && return 0
  mkdir -p "$node"
  # Append-only file fsynced every second: a killed primary's replica holds what it acked.
  # node-timeout 2 s: a dead primary's replica is promoted within a few seconds.
  redis-server --bind 127.0.0.1 --port "$p" --dir "$PWD/$node" --daemonize yes \
    --pidfile "$PWD/$node/redis.pid" --logfile "$PWD/$node/redis.log" \
    --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 2000 \
    --appendonly yes --appendfsync everysec --save "" --maxmemory-policy noeviction
  for ((i = 0; i < 100; i++)); do cli "$p" ping >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "redis node $p did not start; see $node/redis.log" >&2
  exit 1
}

wait_ok() {
  for ((i = 0; i < 300; i++)); do
    local ok=0
    for p in "${ports[@]}"; do
      [[ $(cli "$p" cluster info 2>/dev/null) == *cluster_state:ok* ]] && ok=$((ok + 1))
    done
    [[ $ok -eq ${#ports[@]} ]] && return 0
    sleep 0.2
  done
  echo "the Redis Cluster did not reach cluster_state:ok" >&2
  exit 1
}

up() {
  command -v redis-server >/dev/null || { echo "needs redis-server (apt-get install redis-server)" >&2; exit 1; }
  for p in "${ports[@]}"; do start_node "$p"; done
  # (no `| grep -q`: with pipefail, grep closing the pipe early would read as "not created")
  if [[ $(cli "${ports[0]}" cluster info) != *cluster_slots_assigned:16384* ]]; then
    local nodes=()
    for p in "${ports[@]}"; do nodes+=("127.0.0.1:$p"); done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$dir/create.log"
  fi
  wait_ok
  echo "redis cluster up: $(url)"
}

stop_node() {
  local p=$1 pid
  cli "$p" shutdown nosave >/dev/null 2>&1 || true
  pid=$(cat "$dir/$p/redis.pid" 2>/dev/null) || return 0
  for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

down() { for p in "${ports[@]}"; do stop_node "$p"; done; }

status() {
  cli "${ports[0]}" cluster info 2>/dev/null | grep '^cluster_state' || echo "cluster_state:down"
  for p in "${ports[@]}"; do
    echo "127.0.0.1:$p $(cli "$p" role 2>/dev/null | head -1 || echo stopped)"
  done
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  url) url ;;
  kill) kill -KILL "$(cat "$dir/$2/redis.pid")" ;;
  start) start_node "$2" ;;
  wipe) down; rm -rf "$dir" ;;
  *) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
