# sync_lib.sh: what the multi-donor sync tests with two donors and a
# joiner share (test_node_sync_liar.sh, test_node_sync_corrupt.sh); sourced
# after lib.sh and node_lib.sh. Sets MODEL (a tiny MLP on a 200-row CSV,
# written with seed $1) and DONOR (the donors' flags: local steps, ring
# rounds, two members), and defines:
#   sync_donors_agree        waits for nodes 0 and 1 to end their epochs
#                            and hold one agreed state (not null)
#   alive_seen_by K N        node K holds N members alive, itself included
# shellcheck shell=bash

"$NUMPY_PY" - "$SCRATCH/data.csv" "$1" <<'EOF'
import sys
import numpy as np
rng = np.random.default_rng(int(sys.argv[2]))
x = rng.normal(size=(200, 8))
y = (x[:, :4].sum(axis=1) > 0).astype(int)
np.savetxt(sys.argv[1], np.column_stack([x, y]), delimiter=",", fmt="%.5f")
EOF
# shellcheck disable=SC2034 # used by the sourcing test
MODEL=(--model mlp:8-16-2 --data "csv:$SCRATCH/data.csv" --batch 8 --lr 0.05
       --epochs 3 --threads 1 --device cpu --gossip-every 0 --eval-every 0
       --checkpoint-every 0)
# shellcheck disable=SC2034 # used by the sourcing test
DONOR=(--local-steps 10 --ring-every 0 --min-nodes 2)

sync_donors_agree() {
  both_done() { node_state_is 0 "done" && node_state_is 1 "done"; }
  wait_for 60 "the two donors finishing their epochs" both_done
  same_agreed() {
    local a b
    a=$(node_field 0 agreed.id) && b=$(node_field 1 agreed.id) &&
      [ -n "$a" ] && [ "$a" != null ] && [ "$a" = "$b" ]
  }
  wait_for 30 "the two donors holding one agreed state" same_agreed
}

alive_seen_by() {
  [ "$(node_peers "$1" | "$NUMPY_PY" -c 'import json,sys; print(sum(m["state"] == "alive" for m in json.load(sys.stdin)))')" = "$2" ]
}
