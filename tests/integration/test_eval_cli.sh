#!/usr/bin/env bash
# test_eval_cli.sh: a trained model used on its own. `starling train` keeps
# its model by default (out/train/model.safetensors, path printed;
# --no-checkpoint for none); the checkpoint carries its input transform and
# description; `starling eval` reports exactly the accuracy and loss that
# train reported; `starling predict` writes per-row classes and
# probabilities (CSV, JSON) from IDX or raw CSV input that agree with eval;
# and unusable checkpoints and inputs are refused with clear messages. On a
# small Fashion-MNIST (tests/integration/mini_fashion_mnist.py), to stay
# quick.
source "$(dirname "$0")/lib.sh"

MINI=$SCRATCH/fmnist
"$NUMPY_PY" "$SRC/tests/integration/mini_fashion_mnist.py" "$MINI" 3000 1000 ||
  fail "cannot make the small Fashion-MNIST"
export STARLING_FASHION_MNIST_DIR=$MINI
# The default checkpoint goes under the current directory (not $SCRATCH
# itself: expect_fail keeps its output in $SCRATCH/out).
mkdir "$SCRATCH/run" && cd "$SCRATCH/run"
common=(--model mlp:784-32-10 --data fashion-mnist --epochs 2 --batch 32
        --momentum 0.9 --device cpu --threads 1)

# --- help and usage ------------------------------------------------------------
grep -q -- "--checkpoint FILE" <<<"$("$STARLING" eval --help)" || fail "eval --help"
grep -q -- "--format csv|json" <<<"$("$STARLING" predict --help)" || fail "predict --help"
grep -q -- "--no-checkpoint" <<<"$("$STARLING" train --help)" || fail "train --help"
grep -q "predict" <<<"$("$STARLING" --help)" || fail "starling --help lists predict"
pass "help"
expect_fail "eval without arguments" 2 "--checkpoint and --data are required" -- \
  "$STARLING" eval
expect_fail "predict without --input" 2 "--checkpoint and --input are required" -- \
  "$STARLING" predict --checkpoint x
expect_fail "eval unknown option" 2 "'--bogus' is an unknown option" -- \
  "$STARLING" eval --bogus
expect_fail "predict bad format" 2 "--format: 'xml' is not csv or json" -- \
  "$STARLING" predict --checkpoint x --input y --format xml
expect_fail "checkpoint and no-checkpoint" 2 "contradict" -- \
  "$STARLING" train "${common[@]}" --checkpoint a --no-checkpoint

# --- train keeps its model by default ------------------------------------------
"$STARLING" train "${common[@]}" --json >train.json 2>train.log ||
  fail "training: $(cat train.log)"
[ -s out/train/model.safetensors ] || fail "no default checkpoint: $(ls -R out 2>&1)"
grep -q "^model saved to out/train/model.safetensors; score it with: starling eval --checkpoint out/train/model.safetensors --data fashion-mnist" train.log ||
  fail "train does not say where the model went: $(tail -3 train.log)"
[ "$(json_field train.json checkpoint)" = out/train/model.safetensors ] ||
  fail "json checkpoint: $(cat train.json)"
# Two short epochs: the default checkpoint is written once, at the end.
[ "$(grep -c '^checkpoint: ' train.log)" = 1 ] ||
  fail "default checkpoint written more than once: $(grep '^checkpoint: ' train.log)"
pass "train saves out/train/model.safetensors by default and says so"
mkdir none && (cd none && "$STARLING" train "${common[@]}" --epochs 1 --no-checkpoint \
  >log 2>&1) || fail "--no-checkpoint run: $(cat none/log)"
[ ! -e none/out ] || fail "--no-checkpoint wrote $(ls -R none/out)"
! grep -q "model saved" none/log || fail "--no-checkpoint says it saved"
pass "--no-checkpoint writes nothing"

# --- the checkpoint describes its model ----------------------------------------
"$NUMPY_PY" "$SRC/tests/integration/check_safetensors_numpy.py" \
  out/train/model.safetensors >np.txt || fail "numpy cannot read the checkpoint"
for want in 'tensor "normalize.mean" shape=\[1\]' 'tensor "normalize.std" shape=\[1\]' \
    'meta "model" = "mlp:784-32-10"' 'meta "classes" = "10"' \
    'meta "input_shape" = "28,28"' 'meta "input_scale" = "255"' \
    'meta "normalize" = "scalar"' \
    'meta "architecture" = "Linear\(784, 32\), ReLU, Linear\(32, 10\)"'; do
  grep -Eq "$want" np.txt || fail "checkpoint lacks $want: $(grep -v layers np.txt)"
done
pass "checkpoint carries normalize.mean/std, model, classes, input shape and scale"

# --- eval reports what train reported -------------------------------------------
"$STARLING" eval --checkpoint out/train/model.safetensors --data fashion-mnist \
  --device cpu --json >eval.json 2>eval.err || fail "eval: $(cat eval.err)"
for k in accuracy:test_accuracy loss:test_loss; do
  got=$(json_field eval.json "${k%%:*}") want=$(json_field train.json "${k##*:}")
  [ "$got" = "$want" ] || fail "eval ${k%%:*} $got, train reported $want"
done
[ "$(json_field eval.json set)" = test ] && [ "$(json_field eval.json examples)" = 1000 ] &&
  [ "$(json_field eval.json step)" = 188 ] || fail "eval json: $(cat eval.json)"
acc=$(json_field eval.json accuracy)
"$STARLING" eval --checkpoint out/train/model.safetensors --data fashion-mnist \
  --device cpu >eval.txt || fail "eval (text)"
grep -Eq "^accuracy [0-9.]+  loss [0-9.]+  \(1000 examples: the test set of fashion-mnist; model mlp:784-32-10 at step 188\)" eval.txt ||
  fail "eval text: $(cat eval.txt)"
pass "eval: accuracy $acc and loss equal to train's"

# --- predict --------------------------------------------------------------------
"$STARLING" predict --checkpoint out/train/model.safetensors --device cpu \
  --input "$MINI/t10k-images-idx3-ubyte.gz" --out p.csv 2>p.err || fail "predict: $(cat p.err)"
grep -q "wrote 1000 predictions to p.csv" p.err || fail "predict message: $(cat p.err)"
"$STARLING" predict --checkpoint out/train/model.safetensors --device cpu \
  --input "$MINI/t10k-images-idx3-ubyte.gz" --out p.json || fail "predict json"
"$NUMPY_PY" - "$MINI" "$acc" <<'PY' || fail "predictions disagree with eval"
import gzip, json, sys
import numpy as np
mini, acc = sys.argv[1], float(sys.argv[2])
labels = np.frombuffer(gzip.open(mini + "/t10k-labels-idx1-ubyte.gz").read(), np.uint8, offset=8)
images = np.frombuffer(gzip.open(mini + "/t10k-images-idx3-ubyte.gz").read(), np.uint8, offset=16)
lines = open("p.csv").read().splitlines()
assert lines[0] == "class," + ",".join("p%d" % k for k in range(10)), lines[0]
rows = np.array([[float(v) for v in l.split(",")] for l in lines[1:]])
assert rows.shape == (1000, 11), rows.shape
assert np.allclose(rows[:, 1:].sum(1), 1, atol=1e-4)
assert (rows[:, 1:].argmax(1) == rows[:, 0]).all()
got = (rows[:, 0] == labels).mean()
assert abs(got - acc) < 1e-9, (got, acc)
doc = json.load(open("p.json"))
assert doc["model"] == "mlp:784-32-10" and doc["classes"] == 10
assert [p["class"] for p in doc["predictions"]] == rows[:, 0].astype(int).tolist()
# The first 20 images as an IDX file, as raw CSV pixels (0..255), and with
# a label column.
raw = gzip.open(mini + "/t10k-images-idx3-ubyte.gz").read()
open("first20.idx", "wb").write(raw[:4] + (20).to_bytes(4, "big") + raw[8:16 + 20 * 784])
x = images.reshape(-1, 784)[:20]
np.savetxt("raw.csv", x, fmt="%d", delimiter=",")
np.savetxt("labelled.csv", np.hstack([x, labels[:20, None]]), fmt="%d", delimiter=",")
PY
"$STARLING" predict --checkpoint out/train/model.safetensors --device cpu \
  --input raw.csv >raw_p.csv || fail "predict csv input"
"$STARLING" predict --checkpoint out/train/model.safetensors --device cpu \
  --input first20.idx >idx_p.csv || fail "predict raw idx input"
cmp -s idx_p.csv raw_p.csv || fail "CSV pixels predict otherwise than IDX images"
pass "predict: CSV and JSON, classes match eval's accuracy, raw CSV input = IDX input"

# --- refusals -------------------------------------------------------------------
expect_fail "missing checkpoint" 1 "cannot open .*nope.safetensors: No such file" -- \
  "$STARLING" eval --checkpoint nope.safetensors --data fashion-mnist
expect_fail "not a safetensors file" 1 "raw.csv: header length .* not safetensors" -- \
  "$STARLING" eval --checkpoint raw.csv --data fashion-mnist
"$NUMPY_PY" - <<'PY' || fail "cannot write an old-style checkpoint"
import json, struct
raw = open("out/train/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
for k in ("classes", "input_shape", "input_scale", "architecture", "normalize"):
    del h["__metadata__"][k]
end = h.pop("normalize.mean")["data_offsets"][0]
del h["normalize.std"]
t = json.dumps(h).encode()
t += b" " * (-len(t) % 8)
open("old.safetensors", "wb").write(struct.pack("<Q", len(t)) + t + raw[8 + n:8 + n + end])
PY
expect_fail "checkpoint without the model's description" 1 \
  "old.safetensors: the checkpoint lacks the metadata classes, input_shape, input_scale and the tensors normalize.mean, normalize.std" -- \
  "$STARLING" eval --checkpoint old.safetensors --data fashion-mnist
expect_fail "predict with a label column" 1 \
  "labelled.csv has 785 features per example but the model of out/train/model.safetensors \(mlp:784-32-10\) expects 784 inputs; predict reads features only" -- \
  "$STARLING" predict --checkpoint out/train/model.safetensors --input labelled.csv
expect_fail "eval on data of another width" 1 "raw.csv has 783 features per example but .* expects 784 inputs" -- \
  "$STARLING" eval --checkpoint out/train/model.safetensors --data csv:raw.csv
expect_fail "missing input" 1 "--input: nothere.csv: cannot open" -- \
  "$STARLING" predict --checkpoint out/train/model.safetensors --input nothere.csv

echo "all eval/predict CLI tests passed"
