#!/usr/bin/env bash
# test_node_datadir.sh: what a node keeps in its data directory, and who may
# use it (issue 17, "Lower"):
#   (a) the directory the node makes is 0700, and every file in it (the
#       checkpoint included) 0600;
#   (b) a second node on the directory of a running one exits 1 with one
#       sentence naming the directory and the first node's PID, before it
#       touches anything: the first keeps its control socket and answers;
#   (c) 100 idle connections to the control socket do not keep `starling
#       status` out: the oldest idle ones are closed for newcomers, the rest
#       at their 5 s deadline, and status --json counts both;
#   (d) temporary files an interrupted checkpoint write left are removed at
#       the next start (only the node's own names), and it says how many;
#   (e) the boot epoch grows at every start, even when the boot_epoch file
#       is lost.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"

awk 'BEGIN { srand(5); for (r = 0; r < 64; r++) { for (c = 0; c < 784; c++) printf "%.3f,", rand(); print r % 10 } }' \
  >"$SCRATCH/data.csv"
ARGS=(--model mlp:784-16-10 --data "csv:$SCRATCH/data.csv" --epochs 100000
      --batch 8 --device cpu --threads 1 --eval-every 0 --checkpoint-every 1)
dir=$(node_dir 0)
mode() { stat -c %a "$1"; }

# --- (a) modes ----------------------------------------------------------------
node_start 0 "${ARGS[@]}"
node_up 0
id0=$(node_field 0 id)
epoch1=$(node_field 0 boot_epoch)
wait_for 20 "node 0 writing a checkpoint" test -s "$dir/checkpoint.safetensors"
[ "$(mode "$dir")" = 700 ] || node_fail "(a) the data directory is $(mode "$dir"), want 700"
for f in "$dir"/*; do
  [ "$(mode "$f")" = 600 ] || node_fail "(a) $(basename "$f") is mode $(mode "$f"), want 600"
done
for f in checkpoint.safetensors lock boot_epoch identity.key control.sock; do
  [ -e "$dir/$f" ] || node_fail "(a) no $f in the data directory"
done
pass "(a) data directory 0700; checkpoint, lock, boot_epoch, identity.key, control.sock 0600"

# --- (b) a second node on the same directory ----------------------------------
sock_before=$(stat -c %i "$dir/control.sock")
ckpt_mode_before=$(mode "$dir/checkpoint.safetensors")
status=0
timeout 30 "$STARLING" node --listen 127.0.0.1:0 --cluster-key "$KEY" --data-dir "$dir" \
  "${ARGS[@]}" >"$SCRATCH/second.out" 2>"$SCRATCH/second.err" || status=$?
[ "$status" -eq 1 ] || node_fail "(b) second node: exit status $status, want 1: $(cat "$SCRATCH/second.err")"
want="PID ${NODE_PID[0]}, which holds --data-dir '$dir'); stop it, or give this node another --data-dir"
grep -qF -- "$want" "$SCRATCH/second.err" ||
  node_fail "(b) the refusal does not name the directory and PID ${NODE_PID[0]}: $(cat "$SCRATCH/second.err")"
[ "$(wc -l <"$SCRATCH/second.err")" -eq 1 ] ||
  node_fail "(b) the refusal is not one line: $(cat "$SCRATCH/second.err")"
[ "$(stat -c %i "$dir/control.sock")" = "$sock_before" ] ||
  node_fail "(b) the second node replaced the first one's control socket"
node_alive 0 || node_fail "(b) the running node died"
[ "$(node_field 0 id)" = "$id0" ] || node_fail "(b) the running node no longer answers"
[ "$(node_field 0 boot_epoch)" = "$epoch1" ] || node_fail "(b) the boot epoch changed under the running node"
pass "(b) a second node on $dir exits 1 naming PID ${NODE_PID[0]}; the first answers on its socket"

# --- (c) a flood of idle control connections -----------------------------------
"$NUMPY_PY" - "$dir/control.sock" "$SCRATCH/flood" <<'PY' &
import os, select, socket, sys, time
path, out = sys.argv[1], sys.argv[2]
socks = []
for _ in range(100):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    socks.append(s)
open(out + ".ready", "w").close()
# Count the connections the node closes (EOF), for at most 12 s.
closed, deadline = set(), time.time() + 12
while len(closed) < len(socks) and time.time() < deadline:
    r, _, _ = select.select([s for s in socks if s not in closed], [], [], 0.2)
    for s in r:
        if s.recv(1) == b"":
            closed.add(s)
with open(out + ".tmp", "w") as f:
    f.write("%d\n" % len(closed))
os.rename(out + ".tmp", out)
PY
PIDS+=("$!")
flood_pid=$!
wait_for 10 "the flood's 100 connections" test -e "$SCRATCH/flood.ready"
t_status=$(date +%s%N)
doc=$(timeout 10 "$STARLING" status --json --data-dir "$dir") ||
  node_fail "(c) starling status did not answer beside 100 idle connections"
status_ms=$((($(date +%s%N) - t_status) / 1000000))
[ "$status_ms" -le $((3000 * SLOW)) ] || node_fail "(c) starling status took $status_ms ms"
counter() {
  "$NUMPY_PY" -c 'import json,sys; d=json.loads(sys.argv[1]); print(d["rejected"][sys.argv[2]])' "$1" "$2"
}
evicted=$(counter "$doc" control_evicted)
[ "$evicted" -ge 68 ] || node_fail "(c) control_evicted is $evicted, want >= 68 (100 idle, 32 slots)"
# The idle ones left go at their 5 s deadline.
wait_for 15 "the flood's end" test -e "$SCRATCH/flood"
closed=$(cat "$SCRATCH/flood")
[ "$closed" -eq 100 ] || node_fail "(c) the node closed $closed of 100 idle connections, want all"
doc=$(node_status 0) || node_fail "(c) no status after the flood"
timed_out=$(counter "$doc" control_timed_out)
[ "$timed_out" -ge 1 ] || node_fail "(c) control_timed_out is $timed_out"
[ $(("$(counter "$doc" control_evicted)" + timed_out)) -ge 100 ] ||
  node_fail "(c) evicted + timed out = $(("$(counter "$doc" control_evicted)" + timed_out)), want >= 100"
wait "$flood_pid" 2>/dev/null || true
pass "(c) status answered in $status_ms ms beside 100 idle connections ($evicted evicted, $timed_out timed out)"

# --- (d) stale temporary files ------------------------------------------------
node_leave 0
[ "$(mode "$dir/checkpoint.safetensors")" = 600 ] || node_fail "(d) final checkpoint mode $(mode "$dir/checkpoint.safetensors")"
for f in checkpoint.safetensors.tmp.Ab9xYz boot_epoch.tmp checkpoint.safetensors.tmp.keep-me notes.tmp.Ab9xYz; do
  echo partial >"$dir/$f"
done
sleep 1.1 # a new second: (e) must not owe its growth to the clock alone
echo "--- restart 1" >>"$(node_log 0)"
node_start 0 "${ARGS[@]}"
node_up 0
for f in checkpoint.safetensors.tmp.Ab9xYz boot_epoch.tmp; do
  [ ! -e "$dir/$f" ] || node_fail "(d) the stale $f is still there"
done
for f in checkpoint.safetensors.tmp.keep-me notes.tmp.Ab9xYz; do
  [ -e "$dir/$f" ] || node_fail "(d) $f, not a name of the node's, was removed"
done
sed -n '/^--- restart 1/,$p' "$(node_log 0)" | grep -q "removed 2 temporary files that an interrupted write left in $dir" ||
  node_fail "(d) the node does not say it removed 2 temporary files"
pass "(d) the 2 stale temporary files removed at start, other names kept"

# --- (e) boot epochs ------------------------------------------------------------
epoch2=$(node_field 0 boot_epoch)
[ "$epoch2" -gt "$epoch1" ] || node_fail "(e) boot epoch $epoch2 after $epoch1"
node_leave 0
rm "$dir/boot_epoch"
sleep 1.1
echo "--- restart 2" >>"$(node_log 0)"
node_start 0 "${ARGS[@]}"
node_up 0
epoch3=$(node_field 0 boot_epoch)
[ "$epoch3" -gt "$epoch2" ] || node_fail "(e) boot epoch $epoch3 after $epoch2 once boot_epoch was deleted"
[ "$(node_field 0 id)" = "$id0" ] || node_fail "(e) the node came back with another id"
grep -q " $id0\$" "$dir/boot_epoch" || node_fail "(e) boot_epoch does not name the identity: $(cat "$dir/boot_epoch")"
node_leave 0
pass "(e) boot epochs $epoch1 < $epoch2 < $epoch3 (the last after boot_epoch was deleted)"
echo "all data directory tests passed in $(elapsed) s"
