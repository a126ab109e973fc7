#!/usr/bin/env bash
# test_top.sh: the live views (docs/operations.md, "Live view"): `starling
# top`, the cluster from one node, and `starling monitor`, its events.
#   (a) bad flags and a socket with no node: refused with a clear message;
#   (b) two nodes: `top --once` into a file prints one block of plain lines
#       (no escape sequences) with a row for each member; `--json --once`
#       one object whose members are both nodes, with sane figures and
#       this node's rates; `--count 2` two blocks;
#   (c) on a terminal (a pty): the alternate screen, q ends it with status
#       0 and the terminal restored; so does Ctrl-C (SIGINT);
#   (d) `monitor` and `monitor --json` at node 0 stream the events it kept
#       and new ones: node 1 alive, exchanges with it, ring rounds, a
#       garbage datagram refused; a 9th monitor is refused;
#   (e) `top` streaming into a file (plain blocks, no escapes): when its
#       node dies it says so and exits 1; node 0 leaves cleanly with its
#       monitors attached, which then say the node stopped and exit 1.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"

# A small CSV task (8 features, 3 classes) rather than Fashion-MNIST: the
# nodes start at once and their exchanges are light, which keeps this test
# short on a loaded machine; top reads the same figures either way.
"$NUMPY_PY" - "$SCRATCH" <<'EOF'
import random, sys
rng = random.Random(7)
w = [[rng.gauss(0, 1) for _ in range(8)] for _ in range(3)]
for name, n in (("train.csv", 2000), ("test.csv", 300)):
    with open(sys.argv[1] + "/" + name, "w") as f:
        for _ in range(n):
            x = [rng.gauss(0, 1) for _ in range(8)]
            y = max(range(3), key=lambda k: sum(a * b for a, b in zip(w[k], x)))
            f.write(",".join("%.4f" % v for v in x) + ",%d\n" % y)
EOF
ARGS=(--model mlp:8-16-3 --data "csv:$SCRATCH/train.csv,$SCRATCH/test.csv"
      --batch 32 --lr 0.05 --device cpu --threads 1 --epochs 1000000
      --gossip-every 0.2 --ring-every 1 --eval-every 1)

# --- (a) refusals -------------------------------------------------------------
expect_fail "(a) --interval 0" 2 \
  "starling top: --interval: '0' is not a number between 0.1 and 3600" -- \
  "$STARLING" top --interval 0
expect_fail "(a) --interval soon" 2 "--interval: 'soon' is not a number" -- \
  "$STARLING" top --interval soon
expect_fail "(a) --count 0" 2 "--count: '0' is not a whole number" -- \
  "$STARLING" top --count 0
expect_fail "(a) --once --count 2" 2 "--once and --count 2 disagree" -- \
  "$STARLING" top --once --count 2
expect_fail "(a) no node at the socket" 1 \
  "starling top: no node is running at '$SCRATCH/none/control.sock'" -- \
  "$STARLING" top --once --data-dir "$SCRATCH/none"
grep -q -- "--interval S" <<<"$("$STARLING" top --help)" || fail "(a) top --help"
expect_fail "(a) monitor: no node at the socket" 1 \
  "starling monitor: no node is running at '$SCRATCH/none/control.sock'" -- \
  "$STARLING" monitor --data-dir "$SCRATCH/none"
expect_fail "(a) monitor --jsn" 2 "starling monitor: unknown option '--jsn'" -- \
  "$STARLING" monitor --jsn

# --- (b) two nodes --------------------------------------------------------------
node_start 0 "${ARGS[@]}" --shard 0/10
node_up 0
node_start 1 "${ARGS[@]}" --shard 1/10 --join "$NODE_ADDR"
node_up 1
ID0=$(node_field 0 id) && ID1=$(node_field 1 id) || node_fail "node ids"
# Both members known to node 0 with a step, each having gossiped a status.
both_stepping() {
  "$STARLING" top --json --once --interval 0.2 --data-dir "$(node_dir 0)" \
    >"$SCRATCH/top.json" 2>/dev/null || return 1
  "$NUMPY_PY" -c 'import json, sys
d = json.load(open(sys.argv[1]))
ms = d["members"]
ok = len(ms) == 2 and all(m["step"] > 0 and m["state"] == "alive" for m in ms)
sys.exit(0 if ok else 1)' "$SCRATCH/top.json"
}
wait_for 10 "(b) both members alive and stepping in top --json" both_stepping

"$STARLING" top --once --interval 0.3 --data-dir "$(node_dir 0)" \
  >"$SCRATCH/once.txt" || node_fail "(b) top --once"
grep -q $'\033' "$SCRATCH/once.txt" && node_fail "(b) escape sequences in a file"
[ "$(grep -c '^starling top - node' "$SCRATCH/once.txt")" -eq 1 ] ||
  node_fail "(b) --once: not one block: $(cat "$SCRATCH/once.txt")"
grep -Eq "^${ID0:0:12}\* +alive +[0-9]+ " "$SCRATCH/once.txt" ||
  node_fail "(b) no row for node 0 (this node): $(cat "$SCRATCH/once.txt")"
grep -Eq "^${ID1:0:12}  +alive +[0-9]+ " "$SCRATCH/once.txt" ||
  node_fail "(b) no row for node 1: $(cat "$SCRATCH/once.txt")"
grep -q "^ID .*STEP .*LOSS .*ACC .*SAMPLES/S .*XCHG/S .*BYTES/S" \
  "$SCRATCH/once.txt" || node_fail "(b) no header row: $(cat "$SCRATCH/once.txt")"
pass "(b) top --once into a file: one plain block, rows for both members ($(elapsed) s)"

"$STARLING" top --json --once --interval 0.3 --data-dir "$(node_dir 1)" \
  >"$SCRATCH/top1.json" || node_fail "(b) top --json --once"
out=$("$NUMPY_PY" -c 'import json, math, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, "not one line: %r" % lines
d = json.loads(lines[0])
id0, id1 = sys.argv[2], sys.argv[3]
assert d["node"]["id"] == id1 and d["node"]["state"] == "training", d["node"]
assert 0.2 < d["interval_s"] < 5, d["interval_s"]
assert d["bytes_in_per_sec"] >= 0 and d["bytes_out_per_sec"] >= 0, d
ms = {m["id"]: m for m in d["members"]}
assert set(ms) == {id0, id1}, sorted(ms)
me, other = ms[id1], ms[id0]
assert me["self"] and not other["self"], d["members"]
for m in (me, other):
    assert m["state"] == "alive" and m["step"] > 0, m
    assert m["loss"] is not None and 0 < m["loss"] < 10, m
    assert m["test_accuracy"] is None or 0 <= m["test_accuracy"] <= 1, m
    assert m["samples_per_sec"] is None or m["samples_per_sec"] >= 0, m
    assert m["exchanges_per_sec"] is None or m["exchanges_per_sec"] >= 0, m
assert me["bytes_per_sec"] is not None and me["bytes_per_sec"] >= 0, me
assert other["bytes_per_sec"] is None, other
assert me["last_heard_s"] == 0 and other["last_heard_s"] < 5, d["members"]
print("steps %d and %d, %.0f bytes/s, %s exchanges/s" % (me["step"],
      other["step"], me["bytes_per_sec"], me["exchanges_per_sec"]))' \
  "$SCRATCH/top1.json" "$ID0" "$ID1" 2>&1) || node_fail "(b) --json: $out"
pass "(b) top --json --once at node 1: both members, $out ($(elapsed) s)"

"$STARLING" top --count 2 --interval 0.2 --data-dir "$(node_dir 0)" |
  cat >"$SCRATCH/count.txt" || node_fail "(b) top --count 2"
[ "$(grep -c '^starling top - node' "$SCRATCH/count.txt")" -eq 2 ] ||
  node_fail "(b) --count 2 through a pipe: not two blocks"
pass "(b) top --count 2 through a pipe: two blocks ($(elapsed) s)"

# --- (c) on a terminal ----------------------------------------------------------
# A pty runs top; after its first frames the script sends q (or SIGINT) and
# prints the exit status and whether the output entered and left the
# alternate screen.
on_pty() {
  "$NUMPY_PY" - "$1" "$STARLING" top --interval 0.2 --data-dir "$(node_dir 0)" <<'EOF'
import os, pty, select, signal, sys, time
how, argv = sys.argv[1], sys.argv[2:]
pid, fd = pty.fork()
if pid == 0:
    os.execv(argv[0], argv)
out, t0, sent = b"", time.time(), False
while time.time() - t0 < 8:
    r, _, _ = select.select([fd], [], [], 0.1)
    if r:
        try:
            d = os.read(fd, 65536)
        except OSError:
            break
        if not d:
            break
        out += d
    if not sent and out.count(b"starling top - node") >= 2:
        sent = True
        if how == "q":
            os.write(fd, b"q")
        else:
            os.kill(pid, signal.SIGINT)
else:
    os.kill(pid, signal.SIGKILL)
_, st = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(st), int(sent),
      int(out.startswith(b"\x1b[?1049h")), int(out.endswith(b"\x1b[?1049l")),
      int(b"| q quits" in out))
EOF
}
# Both at once: each mostly waits.
on_pty q >"$SCRATCH/pty_q" 2>&1 &
PTY_Q=$!
on_pty int >"$SCRATCH/pty_int" 2>&1 || true
wait "$PTY_Q" || true
for how in q int; do
  res=$(cat "$SCRATCH/pty_$how")
  [ "$res" = "0 1 1 1 1" ] ||
    node_fail "(c) $how on a terminal: status, sent, entered, restored, hint = $res"
done
pass "(c) on a terminal: alternate screen; q and Ctrl-C end it with status 0, terminal restored ($(elapsed) s)"

# --- (d) monitor --------------------------------------------------------------------
mon_start() { # mon_start NAME ARGS...: a monitor of node 0 into $SCRATCH/NAME
  local name=$1
  shift
  "$STARLING" monitor --data-dir "$(node_dir 0)" "$@" \
    >"$SCRATCH/$name" 2>"$SCRATCH/$name.err" &
  MON_PID=$!
  PIDS+=("$MON_PID")
}
mon_start mon.txt
MON_TEXT=$MON_PID
mon_start mon.json --json
MON_JSON=$MON_PID
# A datagram no member would send: refused (packet_short), reported within
# a second as a "rejected" event.
ADDR0=$(node_field 0 address) || node_fail "(d) node 0's address"
"$NUMPY_PY" -c 'import socket, sys
h, p = sys.argv[1].rsplit(":", 1)
socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", (h, int(p)))' "$ADDR0"
mon_saw() {
  "$NUMPY_PY" -c 'import json, sys
want = {"member": "member %s at " % sys.argv[2][:12],
        "exchange": "averaged with %s in " % sys.argv[2][:12],
        "ring": " members done in ", "rejected": "1 packet_short"}
seqs = []
for line in open(sys.argv[1]):
    e = json.loads(line)
    seqs.append(e["seq"])
    assert set(e) == {"seq", "time", "type", "message"}, e
    if want.get(e["type"], "\0") in e["message"]:
        del want[e["type"]]
assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
sys.exit(1 if want else 0)' "$SCRATCH/mon.json" "$ID1" 2>/dev/null
}
wait_for 8 "(d) monitor --json: node 1 alive, an exchange, a ring round, a refusal" mon_saw
grep -Eq "^20[0-9-]+T[0-9:.]+Z member +member ${ID1:0:12} at .* is alive$" \
  "$SCRATCH/mon.txt" || node_fail "(d) monitor: no line for node 1: $(head -3 "$SCRATCH/mon.txt")"
grep -Eq "Z rejected +refused (.*, )?1 packet_short" "$SCRATCH/mon.txt" ||
  node_fail "(d) monitor: no line for the refused datagram"
MORE=()
for k in 3 4 5 6 7 8; do
  mon_start "mon$k.txt"
  MORE+=("$MON_PID")
done
all_streaming() {
  local k
  for k in 3 4 5 6 7 8; do
    [ -s "$SCRATCH/mon$k.txt" ] || return 1
  done
}
wait_for 5 "(d) 8 monitors streaming" all_streaming
expect_fail "(d) a 9th monitor" 1 "too many monitors on this node \(8\)" -- \
  "$STARLING" monitor --data-dir "$(node_dir 0)"
kill "${MORE[@]}"
pass "(d) monitor and monitor --json: node 1 alive, exchanges, rings, a refusal; a 9th refused ($(elapsed) s)"

# --- (e) the node stops under a running top --------------------------------------
"$STARLING" top --interval 0.2 --data-dir "$(node_dir 1)" \
  >"$SCRATCH/stream.txt" 2>"$SCRATCH/stream.err" &
TOP_PID=$!
PIDS+=("$TOP_PID")
wait_for 5 "(e) top's first block" grep -qs '^starling top - node' "$SCRATCH/stream.txt"
kill -9 "${NODE_PID[1]}"
status=0
for _ in $(seq $((50 * SLOW))); do
  kill -0 "$TOP_PID" 2>/dev/null || break
  sleep 0.1
done
wait "$TOP_PID" 2>/dev/null || status=$?
[ "$status" -eq 1 ] || node_fail "(e) top exited $status after its node died, want 1"
# Dead between two requests (no node at the socket) or during one (the
# connection closed unanswered).
grep -Eq "starling top: (no node is running at|the node at) '$(node_dir 1)/control.sock'" \
  "$SCRATCH/stream.err" ||
  node_fail "(e) top's message when its node dies: $(cat "$SCRATCH/stream.err")"
grep -q $'\033' "$SCRATCH/stream.txt" &&
  node_fail "(e) escape sequences from top streaming into a file"
pass "(e) top exits 1 naming the socket when its node dies ($(elapsed) s)"
node_leave 0
for pid in "$MON_TEXT" "$MON_JSON"; do
  status=0
  wait "$pid" 2>/dev/null || status=$?
  [ "$status" -eq 1 ] || fail "(e) a monitor exited $status when its node left, want 1"
done
grep -q "starling monitor: the node at '$(node_dir 0)/control.sock' closed the stream" \
  "$SCRATCH/mon.txt.err" || fail "(e) monitor's message: $(cat "$SCRATCH/mon.txt.err")"
pass "(e) node 0 left cleanly with monitors attached; they said so and exited 1 ($(elapsed) s)"
