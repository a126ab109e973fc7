#!/usr/bin/env bash
# test_node_metrics.sh: `starling node --metrics` (docs/operations.md,
# "Metrics"), the Prometheus endpoint.
#   (a) a bad --metrics value is refused naming the flag and the value;
#   (b) two nodes serve /metrics, one on a bare port 0 and one on
#       127.0.0.1:0: the address chosen is in `status --json` ("metrics")
#       and in the log; every figure of status --json has its series, the
#       histograms agree with their counters, `promtool check metrics`
#       passes; another path is 404 (metrics_check.py);
#   (c) a real Prometheus server (Debian's prometheus) scrapes both every
#       second, and the PromQL query starling_step gives both nodes' steps;
#   (d) --metrics on an address in use is refused, naming it;
#   (e) both nodes leave cleanly, and their endpoints close with them.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"

CHECK=("$NUMPY_PY" "$SRC/tests/integration/metrics_check.py")
HAVE_PROM=1
command -v promtool >/dev/null && command -v prometheus >/dev/null || HAVE_PROM=0
ARGS=("${RECIPE[@]}" --epochs 100 --gossip-every 0.2 --ring-every 1
      --eval-every 2)

# --- (a) bad values: refused before anything starts -------------------------
expect_fail "(a) --metrics 127.0.0.1:99999" 1 \
  "--metrics: '127.0.0.1:99999': the port is not a number in 0..65535" -- \
  "$STARLING" node --metrics 127.0.0.1:99999 --listen 127.0.0.1:0 \
  --cluster-key "$KEY" --data-dir "$SCRATCH/refused" "${ARGS[@]}"
expect_fail "(a) --metrics nohost:9100" 1 \
  "--metrics: 'nohost:9100': 'nohost' is neither an IPv4 or IPv6 address nor a host name" -- \
  "$STARLING" node --metrics nohost:9100 --listen 127.0.0.1:0 \
  --cluster-key "$KEY" --data-dir "$SCRATCH/refused" "${ARGS[@]}"
[ ! -e "$SCRATCH/refused" ] || fail "(a) a refused start made its data directory"

# --- (b) two nodes with endpoints -------------------------------------------
node_start 0 "${ARGS[@]}" --shard 0/10 --metrics 0
node_up 0
node_start 1 "${ARGS[@]}" --shard 1/10 --metrics 127.0.0.1:0 --join "$NODE_ADDR"
node_up 1
declare -A MADDR=()
for k in 0 1; do
  MADDR[$k]=$(node_field "$k" metrics) || node_fail "status of node $k"
  [[ ${MADDR[$k]} =~ ^127\.0\.0\.1:[1-9][0-9]*$ ]] ||
    node_fail "node $k: status --json metrics is '${MADDR[$k]}', want 127.0.0.1:PORT"
  grep -q "metrics at http://${MADDR[$k]}/metrics" "$(node_log "$k")" ||
    node_fail "node $k does not log its metrics address ${MADDR[$k]}"
done
pass "(b) endpoints at ${MADDR[0]} (bare port 0) and ${MADDR[1]}, in status and logs"

# --- (c) a Prometheus server scrapes both -------------------------------------
# Started now: Prometheus 2.42 applies its targets 5 s after it starts, time
# that (b) uses.
if [ $HAVE_PROM = 1 ]; then
  cat >"$SCRATCH/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  scrape_timeout: 1s
scrape_configs:
  - job_name: starling
    static_configs:
      - targets: ['${MADDR[0]}', '${MADDR[1]}']
EOF
  promtool check config "$SCRATCH/prometheus.yml" >/dev/null ||
    fail "(c) promtool check config"
  prometheus --config.file="$SCRATCH/prometheus.yml" \
    --storage.tsdb.path="$SCRATCH/prometheus" \
    --web.listen-address=127.0.0.1:0 --log.level=warn \
    >"$SCRATCH/prometheus.log" 2>&1 &
  PROM_PID=$!
  PIDS+=("$PROM_PID")
fi

# --- (b) the exposition -------------------------------------------------------
# Read once each node has averaged and run a ring round: both histograms
# have observations.
moved() {
  local doc
  doc=$(node_status "$1") || return 1
  "$NUMPY_PY" -c 'import json, sys
d = json.loads(sys.argv[1])
sys.exit(0 if d["exchanges_ok"] > 0 and d["ring_rounds_ok"] > 0 else 1)' "$doc"
}
for k in 0 1; do
  wait_for 15 "node $k averaging and in a ring round" moved "$k"
done
sleep 1 # the endpoint renders once a second
for k in 0 1; do
  out=$("${CHECK[@]}" check "$STARLING" "$(node_dir "$k")" \
    "$SCRATCH/metrics$k.txt" 2>&1) || node_fail "node $k: $out"
  pass "(b) node $k: $out"
  if [ $HAVE_PROM = 1 ]; then
    lint=$(promtool check metrics <"$SCRATCH/metrics$k.txt" 2>&1) ||
      node_fail "node $k: promtool check metrics: $lint"
    pass "(b) node $k: promtool check metrics passes"
  else
    echo "skipped: promtool check metrics (apt-get install prometheus)"
  fi
done

# --- (c) PromQL gives both nodes' steps ----------------------------------------
if [ $HAVE_PROM = 1 ]; then
  prom_up() { PROM=$("${CHECK[@]}" listen "$PROM_PID" 2>/dev/null); }
  wait_for 10 "(c) prometheus listening ($(tail -3 "$SCRATCH/prometheus.log"))" prom_up
  steps() { "${CHECK[@]}" promql "$PROM" starling_step "${MADDR[0]}" "${MADDR[1]}" >"$SCRATCH/promql"; }
  wait_for 15 "(c) PromQL starling_step with both nodes' steps" steps
  pass "(c) prometheus at $PROM scrapes both: starling_step $(cat "$SCRATCH/promql") ($(elapsed) s)"
  kill "$PROM_PID"
  wait "$PROM_PID" 2>/dev/null || true
else
  echo "skipped: (c) needs prometheus (apt-get install prometheus)"
fi

# --- (d) an address in use ----------------------------------------------------
# An --attach node loads no data: it gets to the bind at once.
expect_fail "(d) --metrics ${MADDR[0]} (in use)" 1 \
  "--metrics ${MADDR[0]}: address already in use" -- \
  "$STARLING" node --attach --metrics "${MADDR[0]}" --listen 127.0.0.1:0 \
  --cluster-key "$KEY" --data-dir "$SCRATCH/inuse"

# --- (e) leave ------------------------------------------------------------------
"$STARLING" leave --data-dir "$(node_dir 1)" >/dev/null || node_fail "leave node 1"
node_leave 0
node_wait_exit 1 20
[ "$NODE_STATUS" -eq 0 ] || node_fail "node 1 exited $NODE_STATUS after leave"
for k in 0 1; do
  grep -q "stopped: every handle closed" "$(node_log "$k")" ||
    node_fail "node $k: no 'stopped: every handle closed' in its log"
  ! (exec 3<>"/dev/tcp/${MADDR[$k]%:*}/${MADDR[$k]##*:}") 2>/dev/null ||
    node_fail "node $k's endpoint still accepts connections after it left"
done
pass "(e) both left cleanly; endpoints closed ($(elapsed) s)"
