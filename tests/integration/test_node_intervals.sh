#!/usr/bin/env bash
# test_node_intervals.sh: --checkpoint-every and --log-every in steps
# (issue 18, "one meaning per flag"); durations are what every other node
# test runs with.
#   (a) --checkpoint-every 2000steps: checkpoints come at least 2000 steps
#       apart (checkpoints_written, checkpoint_step in status --json), not
#       every 30 s;
#   (b) --log-every 5000steps: a progress line only when the step has
#       passed another multiple of 5000 (docs/operations.md: looked at
#       every 0.1 s, so two lines may be less than 5000 steps apart, as
#       4,400 under ASan once), and with a mark no run reaches, one line
#       in 3 s (not one a second);
#   (c) a value without a known unit is refused, naming both ways to
#       write it; `starling train --checkpoint-every 500` (a bare number,
#       once steps there) is refused with "500steps" in the sentence;
#   (d) `starling train` takes the same units: checkpoints every 3 steps
#       (and at epoch ends), a progress line every 2 steps.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/node_lib.sh"

awk 'BEGIN { srand(3); for (r = 0; r < 64; r++) { for (c = 0; c < 20; c++) printf "%.3f,", rand(); print r % 4 } }' \
  >"$SCRATCH/data.csv"
ARGS=(--model mlp:20-16-4 --data "csv:$SCRATCH/data.csv" --epochs 1000000 --batch 8
      --device cpu --threads 1 --eval-every 0 --gossip-every 0 --ring-every 0
      --checkpoint-every 2000steps --log-every 5000steps)

node_start 0 "${ARGS[@]}"
node_up 0
past() { local s; s=$(node_field 0 step 2>/dev/null) && [ "$s" -ge "$1" ]; }
wait_for 30 "node 0 past step 300000" past 300000

# --- (a) checkpoints by steps -------------------------------------------------
# One status document: the count and the last one's step agree.
read -r step written last < <(node_status 0 | "$NUMPY_PY" -c '
import json, sys
d = json.load(sys.stdin)
print(d["step"], d["checkpoints_written"], d["checkpoint_step"])')
[ "$written" -ge 3 ] || node_fail "(a) $written checkpoints by step $step, want at least 3 (one each 2000 steps)"
# The k-th comes at step >= 2000 k.
[ $((written * 2000)) -le "$last" ] ||
  node_fail "(a) $written checkpoints, the last at step $last: more than one each 2000 steps"
pass "(a) $written checkpoints by step $step, the last at step $last"

# --- (b) progress lines by steps ----------------------------------------------
# Lines "[ SECONDS ID] training step S ...", each past another multiple
# of 5000 than the line before.
steps=$(sed -n 's/.*\] training step \([0-9]*\) .*/\1/p' "$(node_log 0)")
[ "$(wc -l <<<"$steps")" -ge 2 ] || node_fail "(b) fewer than 2 progress lines: $(cat "$(node_log 0)")"
prev=-5000
while read -r s; do
  [ $((s / 5000)) -gt $((prev / 5000)) ] ||
    node_fail "(b) progress lines at steps $prev and $s: no multiple of 5000 passed between them"
  prev=$s
done <<<"$steps"
pass "(b) progress lines at steps $(head -8 <<<"$steps" | tr '\n' ' ')..."
node_leave 0

# And not by time: with a mark no run here reaches, one line (step 0) in
# 3 s of training, where node_start's --log-every 1 would give three.
node_start 1 "${ARGS[@]/5000steps/4000000000steps}"
node_up 1
past1() { local s; s=$(node_field 1 step 2>/dev/null) && [ "$s" -ge 1000 ]; }
wait_for 30 "node 1 training" past1
sleep 3
lines=$(grep -c '\] training step ' "$(node_log 1)" || true)
[ "$lines" -le 1 ] || node_fail "(b) $lines progress lines with --log-every 4000000000steps: by time, not by steps"
pass "(b) with a mark not reached: $lines progress line in 3 s"
node_leave 1

# --- (c) refusals -------------------------------------------------------------
expect_fail "(c) a misspelled unit" 2 "'3stepz' is not a duration" -- \
  "$STARLING" node --listen 127.0.0.1:0 --cluster-key "$KEY" --data-dir "$SCRATCH/x" --log-every 3stepz
expect_fail "(c) a fraction of a step" 2 "'1.5steps' is not a number of steps" -- \
  "$STARLING" node --listen 127.0.0.1:0 --cluster-key "$KEY" --data-dir "$SCRATCH/x" --checkpoint-every 1.5steps
expect_fail "(c) train's bare --checkpoint-every" 2 "needs a unit: 500steps for steps, or 500s" -- \
  "$STARLING" train --model mlp:20-16-4 --data "csv:$SCRATCH/data.csv" --checkpoint-every 500

# --- (d) starling train takes the same units ----------------------------------
"$STARLING" train --model mlp:20-16-4 --data "csv:$SCRATCH/data.csv" --epochs 2 --batch 8 \
  --checkpoint-every 3steps --log-every 2steps --checkpoint "$SCRATCH/t.safetensors" \
  >"$SCRATCH/train.out" 2>&1 || fail "(d) starling train: $(cat "$SCRATCH/train.out")"
ckpts=$(sed -n 's/^checkpoint: .* (step \([0-9]*\))$/\1/p' "$SCRATCH/train.out" | tr '\n' ' ')
# Every 3 steps, and at each epoch's end (8 steps an epoch).
[ "$ckpts" = "3 6 8 9 12 15 16 " ] || fail "(d) checkpoints at steps '$ckpts', want 3 6 8 9 12 15 16: $(cat "$SCRATCH/train.out")"
lines=$(grep -c '^epoch [12]/2  step [2468]/8 ' "$SCRATCH/train.out" || true)
[ "$lines" -eq 8 ] || fail "(d) $lines progress lines, want 8 (every 2 steps): $(cat "$SCRATCH/train.out")"
pass "(d) starling train: checkpoints at steps $ckpts; a progress line every 2 steps"
echo "all interval tests passed in $(elapsed) s"
