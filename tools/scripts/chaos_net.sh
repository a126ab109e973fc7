#!/usr/bin/env bash
# chaos_net.sh: faults of the network on real `starling node` processes
# (docs/operations.md, "Network faults"; issue 17). The twin of chaos.sh,
# which breaks processes: this one breaks the links between them. Each node
# runs in its own network namespace (veth pairs on a bridge, made by
# tools/bench/bench_lib.sh's bench_ns_up), and iptables rules inside the
# nodes' namespaces cut the cluster in two or drop a share of the packets.
# Needs root, `ip netns` and iptables (with the `statistic` match).
#
#   tools/scripts/chaos_net.sh [--scenarios LIST] [--nodes N] [--epochs E]
#        [--min-accuracy A] [--reconverge S] [--before S] [--calm S]
#        [--limit S] [--dir DIR] [--starling PATH] [--json] [-- NODE_FLAGS...]
#
# LIST is a comma-separated list of scenarios (default
# partition:5,partition:30,loss:5,loss:20; partition:300 is the long one),
# each run on a fresh cluster of N nodes (default 6; node K trains shard
# K/N of Fashion-MNIST for E epochs, default 10, with the recipe of the
# integration tests and --min-nodes N; NODE_FLAGS are added to every node's):
#   partition:S   after --before seconds (default 5) of training, nodes
#                 0..N/2-1 and N/2..N-1 drop every packet from the other
#                 half for S seconds (INPUT rules: packets vanish, as in a
#                 real split), then the rules go.
#   loss:P[:S]    from the moment all N are alive, every node drops P% of
#                 the packets it receives (UDP and TCP alike:
#                 `-m statistic --mode random --probability P/100`), for S
#                 seconds or, without S, until every node has run its
#                 epochs; then the rules go.
# Measured per scenario, from the nodes' logs ("member X at A is suspect"
# or "dead") and their `status --json` / `peers --json`:
#   suspects and deaths of members on the same side of the split (false:
#   those could reach each other), of members across it (a detection for a
#   long split, false for a short one), and any after the views agreed
#   again; time from the heal to the moment every node's `peers` holds all
#   N - 1 others alive; averaging exchanges completed / failed (summed over
#   the nodes) before, during and after the fault; exchanges across the
#   split after it; ring rounds aborted; the lowest and mean test accuracy
#   once every node has run its epochs.
# Bounds (a scenario fails when one does not hold):
#   - no same-side death, ever; no death at all in a partition of at most
#     5 s or under at most 5% loss; none after the views agreed again;
#   - the views agree again within --reconverge seconds of the heal
#     (default 35: the push-pull interval, 30 s, plus 5 s);
#   - a partition: nodes average across the former split within 30 s of
#     the views agreeing; a loss: exchanges complete during the loss;
#   - every node runs its epochs within --calm seconds (default 180) of its
#     start and reaches --min-accuracy (default 0.85).
# Prints one line per phase and one summary line per scenario (with --json,
# one JSON object on stdout instead, the lines going to stderr). Exit
# status 0 when every bound held, 1 when one failed (named), 2 for bad
# usage or a missing tool, 130 on SIGINT (Ctrl-C), 143 on SIGTERM. The
# whole run stops (failed) after --limit seconds (default 1800). Every
# namespace, the rules in them and every node are removed on exit, Ctrl-C
# and SIGTERM included. Logs: DIR/SCENARIO/nodeK.log (DIR
# default out/chaos-net; kept).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/bench/bench_lib.sh

scenarios=partition:5,partition:30,loss:5,loss:20
nodes=6
epochs=10
min_acc=0.85
reconverge=35
before=5
calm=180
limit=1800
dir=out/chaos-net
starling=build/starling
json=0
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; }
bad() { echo "chaos_net.sh: $*; see tools/scripts/chaos_net.sh --help" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --scenarios) scenarios=${2:-}; shift 2 ;;
    --nodes) nodes=${2:-}; shift 2 ;;
    --epochs) epochs=${2:-}; shift 2 ;;
    --min-accuracy) min_acc=${2:-}; shift 2 ;;
    --reconverge) reconverge=${2:-}; shift 2 ;;
    --before) before=${2:-}; shift 2 ;;
    --calm) calm=${2:-}; shift 2 ;;
    --limit) limit=${2:-}; shift 2 ;;
    --dir) dir=${2:-}; shift 2 ;;
    --starling) starling=${2:-}; shift 2 ;;
    --json) json=1; shift ;;
    --) shift; break ;;
    -h|--help) usage; exit 0 ;;
    *) bad "unknown option '$1' (node flags go after --)" ;;
  esac
done
node_flags=("$@")
isnum() { [[ "$1" =~ ^[0-9]+$ ]]; }
isnum "$nodes" && [ "$nodes" -ge 2 ] && [ "$nodes" -le 200 ] || bad "--nodes wants a number from 2 to 200"
for v in epochs reconverge before calm limit; do isnum "${!v}" || bad "--$v wants a whole number"; done
[[ "$min_acc" =~ ^[0-9]*\.?[0-9]+$ ]] || bad "--min-accuracy wants a number such as 0.85"
IFS=, read -r -a scen <<<"$scenarios"
[ "${#scen[@]}" -gt 0 ] || bad "--scenarios is empty"
for s in "${scen[@]}"; do
  [[ "$s" =~ ^partition:[0-9]+$ || "$s" =~ ^loss:[0-9]+(:[0-9]+)?$ ]] ||
    bad "--scenarios: '$s' is neither partition:SECONDS nor loss:PERCENT[:SECONDS]"
  [[ "$s" =~ ^loss:([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -gt 100 ] &&
    bad "--scenarios: '$s' drops more than 100%"
done
[ -x "$starling" ] || bad "no starling at $starling (build it: tools/scripts/setup.sh, or pass --starling PATH)"
[ "$(id -u)" -eq 0 ] || { echo "chaos_net.sh: needs root (network namespaces and iptables)" >&2; exit 2; }
ip netns list >/dev/null 2>&1 || { echo "chaos_net.sh: 'ip netns' does not work here (iproute2, a kernel with network namespaces)" >&2; exit 2; }
command -v iptables >/dev/null || { echo "chaos_net.sh: no iptables (apt-get install -y iptables)" >&2; exit 2; }
PY=/usr/bin/python3
if [ "$json" = 1 ]; then exec 3>&1 1>&2; else exec 3>/dev/null; fi

# ---- Namespaces, nodes, clean-up ------------------------------------------
# The prefix holds our PID: runs beside each other (tests in parallel) use
# other namespaces, and every rule lives inside one of ours, never in the
# host's chains.
pfx="stnet$$"
up_ns=()
declare -a pid
half=$((nodes / 2))
deadline=$(($(date +%s) + limit))
ns() { echo "$pfx-n-$1"; }
addr() { echo "10.77.0.$(($1 + 1)):7946"; }

stop_nodes() { # SIGTERM, 10 s to leave, then -9
  local k i
  for k in "${!pid[@]}"; do kill -TERM "${pid[$k]}" 2>/dev/null || true; done
  for ((i = 0; i < 100; i++)); do
    local running=0
    for k in "${!pid[@]}"; do kill -0 "${pid[$k]}" 2>/dev/null && running=1; done
    [ "$running" = 0 ] && break
    sleep 0.1
  done
  for k in "${!pid[@]}"; do
    kill -9 "${pid[$k]}" 2>/dev/null || true
    wait "${pid[$k]}" 2>/dev/null || true
  done
  pid=()
}
cleanup() {
  stop_nodes
  bench_ns_down "$pfx" n "$nodes"
}
trap cleanup EXIT
trap 'echo "chaos_net.sh: interrupted (SIGINT)" >&2; exit 130' INT
trap 'echo "chaos_net.sh: stopped (SIGTERM)" >&2; exit 143' TERM

t0=$(date +%s.%N)
say() { printf '[%6.1f s] %s\n' "$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { print b - a }')" "$*"; }
now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }
over_limit() { [ "$(date +%s)" -ge "$deadline" ]; }
us() { echo "${EPOCHREALTIME/./}"; } # microseconds, without a fork
nap() { # nap SECONDS: sleeps (to the ms, whatever the load), not past --limit
  local end left
  end=$(($(us) + $1 * 1000000))
  while :; do
    left=$((end - $(us)))
    [ "$left" -gt 0 ] || return 0
    over_limit && { why="--limit $limit s reached"; return 1; }
    check_running || return 1
    if [ "$left" -gt 500000 ]; then sleep 0.5; else sleep "$(printf '0.%06d' "$left")"; fi
  done
}
check_running() {
  local k
  for k in "${!pid[@]}"; do
    kill -0 "${pid[$k]}" 2>/dev/null || { why="node $k exited on its own"; return 1; }
  done
}

start_node() { # start_node SDIR K
  local sd=$1 k=$2 join=()
  [ "$k" -eq 0 ] || join=(--join "$(addr 0)")
  ip netns exec "$(ns "$k")" "$starling" node --listen "$(addr "$k")" "${join[@]}" \
    --cluster-key "$sd/cluster.key" --data-dir "$sd/node$k" --shard "$k/$nodes" \
    --model mlp:784-256-128-10 --data fashion-mnist --batch 64 --lr 0.05 \
    --momentum 0.9 --schedule cosine --device cpu --threads 1 --epochs "$epochs" \
    --min-nodes "$nodes" --log-every 5 "${node_flags[@]}" >"$sd/node$k.log" 2>&1 &
  pid[$k]=$!
}
# start_cluster SDIR: node 0, then the others one at a time, each once the
# one before has its state (not `syncing`): joiners started at once ask
# each other, syncing too, for the state again and again, and some end up
# taking a finished model instead of training their shard (docs/operations.md,
# "Network faults").
start_cluster() {
  local sd=$1 k i st
  mkdir -p "$sd"
  "$starling" keygen --cluster --out "$sd/cluster.key" >/dev/null
  for ((k = 0; k < nodes; k++)); do
    start_node "$sd" "$k"
    for ((i = 0; i < 300; i++)); do
      check_running || return 1
      st=$("$starling" status --json --data-dir "$sd/node$k" 2>/dev/null |
        "$PY" -c 'import json,sys; print(json.load(sys.stdin)["state"])' 2>/dev/null) || st=
      [ -n "$st" ] && [ "$st" != syncing ] && break
      sleep 0.1
    done
  done
}

# probe SDIR: one line from every node's status and peers:
#   answered ok failed rings_ok rings_aborted cross agree done acc_min acc_mean
# (ok, failed: exchanges summed over the nodes; cross: exchanges a node
# applied with a member of the other half, summed; agree: 1 when every node
# holds all N - 1 others alive; done: nodes that ran their epochs).
probe() {
  "$PY" - "$starling" "$1" "$nodes" "$half" <<'EOF'
import json, subprocess, sys
starling, d, n, half = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
def ask(cmd, k):
    try:
        r = subprocess.run([starling, cmd, "--json", "--data-dir", "%s/node%d" % (d, k)],
                           capture_output=True, text=True, timeout=5)
        return json.loads(r.stdout) if r.returncode == 0 else None
    except (subprocess.TimeoutExpired, ValueError):
        return None
side = lambda a: int(a.split(":")[0].split(".")[-1]) - 1 < half
answered = ok = failed = rok = rab = cross = done = 0
agree, accs = 1, []
for k in range(n):
    s, p = ask("status", k), ask("peers", k)
    if s is None or p is None:
        agree = 0
        continue
    answered += 1
    ok += s["exchanges_ok"]; failed += s["exchanges_failed"]
    rok += s["ring_rounds_ok"]; rab += s["ring_rounds_aborted"]
    done += s["state"] == "done"
    if s["test_accuracy"] is not None:
        accs.append(s["test_accuracy"])
    others = [m for m in p if not m["self"]]
    if sum(m["state"] == "alive" for m in others) != n - 1:
        agree = 0
    cross += sum(m["averaged"] for m in others if side(m["address"]) != (k < half))
amin = min(accs) if len(accs) == n else 0.0
amean = sum(accs) / len(accs) if accs else 0.0
print(answered, ok, failed, rok, rab, cross, agree, done, "%.4f" % amin, "%.4f" % amean)
EOF
}
P=() # the fields of the last probe
snap() { read -r -a P < <(probe "$1"); }

# marks SDIR: the line count of every node's log (a point in time).
marks() {
  local k out=()
  for ((k = 0; k < nodes; k++)); do out+=("$(wc -l <"$1/node$k.log")"); done
  echo "${out[*]}"
}
# events SDIR FROM TO STATE: "same cross" counts of log lines saying a
# member is STATE between two marks (from every node's log), split by
# whether the member is on the logging node's side of the partition.
events() {
  local sd=$1 st=$4 k same=0 cross=0 a b l
  local -a from to
  read -r -a from <<<"$2"
  read -r -a to <<<"$3"
  for ((k = 0; k < nodes; k++)); do
    a=${from[$k]} b=${to[$k]}
    [ "$b" -gt "$a" ] || continue
    read -r l c < <(sed -n "$((a + 1)),${b}p" "$sd/node$k.log" | awk -v st="$st" -v h="$half" -v me="$k" '
      $0 ~ (" member [0-9a-f]+ at [0-9.]+:[0-9]+ is " st "$") {
        split($(NF - 2), ip, "[.:]"); peer = ip[4] - 1
        if ((peer < h) == (me < h)) s++; else x++
      }
      END { print s + 0, x + 0 }')
    same=$((same + l)) cross=$((cross + c))
  done
  echo "$same $cross"
}

# ---- Faults: rules inside the nodes' namespaces only ----------------------
ipt() { ip netns exec "$(ns "$1")" iptables -w 5 "${@:2}"; }
partition_on() { # each half drops every packet from the other
  local k far
  for ((k = 0; k < nodes; k++)); do
    if [ "$k" -lt "$half" ]; then far="10.77.0.$((half + 1))-10.77.0.$nodes"
    else far="10.77.0.1-10.77.0.$half"; fi
    ipt "$k" -A INPUT -m iprange --src-range "$far" -j DROP
  done
}
loss_on() { # loss_on PERCENT: every node drops that share of what it receives
  local k p
  p=$(awk -v x="$1" 'BEGIN { printf "%.4f", x / 100 }')
  for ((k = 0; k < nodes; k++)); do
    ipt "$k" -A INPUT -i eth0 -m statistic --mode random --probability "$p" -j DROP
  done
}
faults_off() { local k; for ((k = 0; k < nodes; k++)); do ipt "$k" -F INPUT; done; }

# ---- Waits (each bounded) -------------------------------------------------
# wait_agree SECONDS: until every node holds all others alive; sets AGREE_S
# (seconds waited, empty when they did not within SECONDS).
wait_agree() {
  local start end
  start=$(now) end=$(($(date +%s) + $1))
  AGREE_S=
  while :; do
    check_running || return 1
    snap "$sd"
    [ "${P[6]}" = 1 ] && { AGREE_S=$(since "$start"); return 0; }
    [ "$(date +%s)" -lt "$end" ] && ! over_limit || return 1
    sleep 0.3
  done
}
# wait_done: until every node has run its epochs (--calm from its start).
wait_done() {
  while :; do
    check_running || return 1
    snap "$sd"
    [ "${P[7]}" = "$nodes" ] && return 0
    awk -v a="$t_start" -v b="$(now)" -v c="$calm" 'BEGIN { exit !(b - a < c) }' && ! over_limit ||
      { why="not every node ran its $epochs epochs within $calm s (--calm)"; return 1; }
    sleep 1
  done
}
# wait_cross SECONDS: until nodes have averaged across the former split
# since the last probe; sets CROSS_S.
wait_cross() {
  local start base=${P[5]} end=$(($(date +%s) + $1))
  start=$(now) CROSS_S=
  while :; do
    check_running || return 1
    snap "$sd"
    [ "${P[5]}" -gt "$base" ] && { CROSS_S=$(since "$start"); return 0; }
    [ "$(date +%s)" -lt "$end" ] && ! over_limit || return 1
    sleep 0.5
  done
}

# ---- Scenarios --------------------------------------------------------------
fails=()
fail_s() { fails+=("$*"); say "FAIL ($spec): $*"; }
declare -A R # the results of the scenario

# count_events M1 M2 M3: the suspicions and deaths the logs tell, during
# the fault (R[m0] to M1), between the heal and the views agreeing (M1 to
# M2: rumours of the fault arriving late) and after (M2 to M3), and the
# bounds on them. In a partition a death across the split during it is a
# detection (false only for a split of at most 5 s); one on the same side
# is false. Under loss every member stays reachable: every death is false.
count_events() {
  local sc dc k
  read -r sc dc <<<"$(events "$sd" "${R[m0]}" "$1" suspect)"
  R[suspects_same]=$sc R[suspects_cross]=$dc
  read -r sc dc <<<"$(events "$sd" "${R[m0]}" "$1" dead)"
  R[deaths_same]=$sc R[deaths_cross]=$dc
  read -r sc dc <<<"$(events "$sd" "$1" "$2" dead)"
  R[deaths_heal]=$((sc + dc))
  read -r sc dc <<<"$(events "$sd" "$2" "$3" dead)"
  R[deaths_after]=$((sc + dc))
  if [ "$kind" = loss ]; then
    R[suspects]=$((R[suspects_same] + R[suspects_cross]))
    R[deaths]=$((R[deaths_same] + R[deaths_cross] + R[deaths_heal]))
    for k in suspects_same suspects_cross deaths_same deaths_cross deaths_heal; do unset "R[$k]"; done
    [ "${R[small]}" = 0 ] || [ "${R[deaths]}" -eq 0 ] ||
      fail_s "${R[deaths]} false deaths under $spec"
  else
    [ "${R[deaths_same]}" -eq 0 ] ||
      fail_s "${R[deaths_same]} deaths of members on the same side during the split"
    [ "${R[small]}" = 0 ] || [ "$((R[deaths_cross] + R[deaths_heal]))" -eq 0 ] ||
      fail_s "$((R[deaths_cross] + R[deaths_heal])) deaths in a split this short ($spec)"
  fi
  [ "${R[deaths_after]}" -eq 0 ] || fail_s "${R[deaths_after]} deaths after the views agreed again"
}

# after_fault: the heal is done; measures the views agreeing, the averaging
# after, training to its end and the counts of the log.
after_fault() {
  local m1 m2 m3 sc dc
  R[during_ok]=$((P[1] - R[before_ok])) R[during_failed]=$((P[2] - R[before_failed]))
  m1=$(marks "$sd")
  if wait_agree $((reconverge + 30)); then
    R[reconverge_s]=$AGREE_S
    say "$spec: every node holds all $((nodes - 1)) others alive $AGREE_S s after the heal"
    awk -v a="$AGREE_S" -v b="$reconverge" 'BEGIN { exit !(a > b) }' &&
      fail_s "views agreed only $AGREE_S s after the heal (bound $reconverge s)"
  else
    fail_s "views did not agree within $((reconverge + 30)) s of the heal${why:+ ($why)}"
  fi
  m2=$(marks "$sd")
  local ok2=${P[1]} f2=${P[2]}
  if [ "$kind" = partition ]; then
    if wait_cross 30; then
      R[cross_resume_s]=$CROSS_S
      say "$spec: averaging across the former split again after $CROSS_S s more"
    else
      fail_s "no exchange across the former split within 30 s of the views agreeing"
    fi
  fi
  nap 5 || fail_s "$why"
  wait_done || fail_s "$why"
  m3=$(marks "$sd")
  R[after_ok]=$((P[1] - ok2)) R[after_failed]=$((P[2] - f2))
  R[rings_aborted]=${P[4]} R[acc_min]=${P[8]} R[acc_mean]=${P[9]}
  awk -v a="${P[8]}" -v b="$min_acc" 'BEGIN { exit !(a < b) }' &&
    fail_s "lowest test accuracy ${P[8]} < $min_acc"
  count_events "$m1" "$m2" "$m3"
}

run_partition() {
  local secs=${spec#partition:}
  R[seconds]=$secs R[small]=$((secs <= 5 ? 1 : 0))
  nap "$before" || { fail_s "$why"; return 0; }
  snap "$sd"
  R[before_ok]=${P[1]} R[before_failed]=${P[2]} R[m0]=$(marks "$sd")
  local t_cut
  t_cut=$(now)
  partition_on
  say "$spec: split nodes 0-$((half - 1)) | $half-$((nodes - 1)) for $secs s"
  nap "$secs" || fail_s "$why"
  snap "$sd"
  faults_off
  R[fault_s]=$(since "$t_cut")
  say "$spec: healed (the split lasted ${R[fault_s]} s, from its first rule in to its last out)"
  after_fault
}

run_loss() {
  local rest=${spec#loss:} pct secs
  pct=${rest%%:*} secs=
  [ "$rest" != "$pct" ] && secs=${rest#*:}
  R[percent]=$pct R[seconds]=${secs:-null} R[small]=$((pct <= 5 ? 1 : 0))
  snap "$sd"
  R[before_ok]=${P[1]} R[before_failed]=${P[2]} R[m0]=$(marks "$sd")
  local t_on
  t_on=$(now)
  loss_on "$pct"
  local until="until every node has run its epochs"
  [ -z "$secs" ] || until="for $secs s"
  say "$spec: every node drops $pct% of what it receives, $until"
  if [ -n "$secs" ]; then nap "$secs" || fail_s "$why"; else wait_done || fail_s "$why"; fi
  snap "$sd"
  [ "$((P[1] - R[before_ok]))" -gt 0 ] || fail_s "no exchange completed during the loss"
  faults_off
  R[fault_s]=$(since "$t_on")
  say "$spec: loss off after ${R[fault_s]} s"
  after_fault
}

# report: the scenario's summary line, and its JSON object kept for --json.
report() {
  local verdict=passed
  [ "${#fails[@]}" -eq 0 ] || verdict="FAILED: $(IFS=';'; echo "${fails[*]}")"
  local ev
  if [ "$kind" = loss ]; then
    ev="suspicions ${R[suspects]:-?}, deaths ${R[deaths]:-?} during the loss and until the views agreed, ${R[deaths_after]:-?} after"
  else
    ev="during the split suspicions same/across ${R[suspects_same]:-?}/${R[suspects_cross]:-?}, deaths same/across ${R[deaths_same]:-?}/${R[deaths_cross]:-?}; deaths from the heal to agreement ${R[deaths_heal]:-?}, after ${R[deaths_after]:-?}; averaging across again ${R[cross_resume_s]:-never} s after agreement"
  fi
  say "$spec: $ev; views agree ${R[reconverge_s]:-never} s after the heal (bound $reconverge);" \
    "exchanges ok before/during/after ${R[before_ok]:-?}/${R[during_ok]:-?}/${R[after_ok]:-?}," \
    "failed ${R[before_failed]:-?}/${R[during_failed]:-?}/${R[after_failed]:-?};" \
    "rings aborted ${R[rings_aborted]:-?}; accuracy min ${R[acc_min]:-?} mean ${R[acc_mean]:-?}: $verdict"
  local kv=() k
  for k in seconds percent fault_s suspects deaths suspects_same suspects_cross deaths_same \
           deaths_cross deaths_heal deaths_after reconverge_s cross_resume_s before_ok during_ok after_ok before_failed \
           during_failed after_failed rings_aborted acc_min acc_mean; do
    kv+=("$k=${R[$k]:-null}")
  done
  "$PY" - "$spec" "${#fails[@]}" "${fails[@]}" -- "${kv[@]}" >>"$dir/results.jsonl" <<'EOF'
import json, sys
a = sys.argv[1:]
spec, nf = a[0], int(a[1])
fails, kv = a[2:2 + nf], a[3 + nf:]
o = {"scenario": spec}
for item in kv:
    k, v = item.split("=", 1)
    o[k] = None if v == "null" else (float(v) if "." in v else int(v))
o["failures"] = fails
o["passed"] = not fails
print(json.dumps(o))
EOF
}

run_scenario() { # run_scenario INDEX SPEC
  spec=$2 kind=${2%%:*} sd="$dir/$1-${2//:/-}" fails=() why=
  R=()
  rm -rf "$sd"
  t_start=$(now)
  if start_cluster "$sd" && wait_agree 60; then
    say "$spec: $nodes nodes alive after $(since "$t_start") s (logs in $sd)"
    "run_$kind"
  else
    fail_s "the cluster of $nodes did not form within 60 s${why:+ ($why)}"
  fi
  stop_nodes
  report
}

# ---- Main ---------------------------------------------------------------------
mkdir -p "$dir"
rm -f "$dir/results.jsonl"
bench_ns_up "$pfx" n "$nodes"
say "$nodes namespaces $pfx-n-0..$((nodes - 1)) on a bridge; scenarios: $scenarios"
for i in "${!scen[@]}"; do
  over_limit && { fails=("--limit $limit s reached"); spec=${scen[$i]} kind=${spec%%:*}; R=(); report; continue; }
  run_scenario "$((i + 1))" "${scen[$i]}"
done
passed=$("$PY" -c '
import json, sys
rs = [json.loads(l) for l in open(sys.argv[1])]
print(int(all(r["passed"] for r in rs)))
json.dump({"date": sys.argv[2], "nodes": int(sys.argv[3]), "epochs": int(sys.argv[4]),
           "reconverge_bound_s": int(sys.argv[5]), "scenarios": rs,
           "passed": all(r["passed"] for r in rs)}, open(sys.argv[6], "w"))
' "$dir/results.jsonl" "$(date -u +%FT%TZ)" "$nodes" "$epochs" "$reconverge" "$dir/results.json")
cat "$dir/results.json" >&3
[ "$json" = 1 ] && echo >&3
if [ "$passed" = 1 ]; then say "every bound held"; exit 0; fi
say "a bound failed (see above; logs in $dir)"
exit 1
