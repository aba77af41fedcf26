#!/bin/sh
# tests/cli/hostile_files_test.sh — every reader of a file someone else may
# have made, handed a hostile one: a FIFO (refused at once, never waited
# on), a symbolic link (file or folder) below the folder named, a path out
# of it, a file over its size limit, and names carrying terminal escapes
# (shown escaped). One CASE per reader:
#   checkpoint `ferry checkpoint verify|info` (manifest, index, shards, folders)
#   resume     ferry-gpt --resume (the engine's load and the trainer's user.bin)
#   weights    ferry-gpt --weights (a file, a folder, an index)
#   model      ferry-gpt --model (a config.json, a folder), ferry plan --model
#   tokenizer  ferry-gpt --tokenizer (vocab.json, merges.txt)
#   config     `ferry config check` (a libconfig file and its @include)
# $1 = ferry, $2 = CASE, $3 = a scratch folder, $4 = ferry-gpt, $5 =
# make_checkpoint, $6 = the source tree. Exit 0 pass, 1 fail.
set -u
bin=$1
case_=$2
dir=$3
gpt=$4
mk=$5
src=$6
py=/usr/bin/python3
fix=$src/tests/fixtures/gpt/gpt2
data=$src/docs/FERRY-GPT.md
esc=$(printf '\033')
rm -rf "$dir" && mkdir -p "$dir" || exit 1
cd "$dir" || exit 1
fail() {
  echo "cli.hostile.files.$case_: FAILED: $*" >&2
  for f in "$dir"/o.out "$dir"/o.err; do [ -f "$f" ] && { echo "--- $f" >&2; head -c 2000 "$f" >&2; }; done
  [ -n "${HOSTILE_KEEP_GOING:-}" ] && return 1 # every failure, to see each check fail without its fix
  exit 1
}
# expect RC CMD...: runs CMD (stdout in o.out, stderr in o.err) for at most
# 20 s (a hang exits 124, or 137 when TERM is not enough), wants exit RC
expect() {
  want=$1
  shift
  timeout -k 5 20 "$@" >o.out 2>o.err </dev/null
  got=$?
  [ "$got" = "$want" ] || fail "'$*' exited $got, wanted $want"
}
says() { grep -qF -- "$1" o.err || fail "stderr lacks '$1'"; }
# no raw ESC or BEL byte reached the terminal
clean() {
  grep -q "$esc" o.out o.err && fail "a raw ESC byte was printed"
  grep -q "$(printf '\007')" o.out o.err && fail "a raw BEL byte was printed"
  return 0
}
train() {
  rc=$1
  shift
  expect "$rc" "$gpt" train --data "$data" --batch 2 --seq 16 --steps 1 "$@"
}

case $case_ in
checkpoint)
  "$mk" ck >mk.out 2>&1 || fail "make_checkpoint failed"
  st=c/step-000000000002
  fresh() { rm -rf c out && cp -r ck c || fail "cp"; }
  # index writes params/model.safetensors.index.json mapping every tensor to
  # SHARD, and lists the index (only) in the manifest
  index() {
    names=$("$py" -c 'import json,struct,sys
raw=open(sys.argv[1],"rb").read(); n=struct.unpack("<Q",raw[:8])[0]
print(" ".join(k for k in json.loads(raw[8:8+n]) if k!="__metadata__"))' $st/params/model.safetensors)
    { printf '{"metadata": {}, "weight_map": {'; sep=
      for n in $names; do printf '%s"%s": "%s"' "$sep" "$n" "$1"; sep=', '; done; printf '}}\n'
    } >$st/params/model.safetensors.index.json
    "$py" "$src/tests/cli/ckpt_edit.py" $st --add params/model.safetensors.index.json || fail "edit"
  }
  # a listed index naming an unlisted shard that is a FIFO: refused before it is opened
  fresh && mkfifo $st/params/evil.safetensors && index evil.safetensors
  for sub in verify info; do
    expect 1 "$bin" checkpoint $sub c
    says "params/evil.safetensors: not listed in the manifest"
  done
  # ... or a link to a file outside: never opened, nothing of it shown
  fresh && ln -s /etc/passwd $st/params/evil.safetensors && index evil.safetensors
  expect 1 "$bin" checkpoint verify c
  says "not listed in the manifest"
  grep -q "header length" o.err && fail "a byte of the link's target was shown"
  # a symlinked params/ or optim/ folder (a good copy outside)
  for part in params optim; do
    fresh && mkdir out && mv $st/$part out/ && ln -s "$dir/out/$part" $st/$part
    expect 1 "$bin" checkpoint verify c
    says "$part is a symbolic link"
    expect 1 "$bin" checkpoint info c
    says "$part is a symbolic link"
  done
  # a listed file that is a link
  fresh && mkdir out && mv $st/user.bin out/ && ln -s "$dir/out/user.bin" $st/user.bin
  expect 1 "$bin" checkpoint verify c
  says "user.bin: a symbolic link"
  # the per-param step counts (version 5) a FIFO, then a link: refused at once
  fresh && printf 'param_step 0 1 x\n' >$st/param_steps
  sed -i -e 's/^ferry-checkpoint 3$/ferry-checkpoint 5/' -e 's/^crc32c /param_steps 1\ncrc32c /' \
    $st/manifest
  "$py" "$src/tests/cli/ckpt_edit.py" $st --add param_steps || fail "edit"
  cp -r c good5 && expect 0 "$bin" checkpoint verify c
  rm $st/param_steps && mkfifo $st/param_steps
  expect 1 "$bin" checkpoint verify c
  says "param_steps: a FIFO"
  rm $st/param_steps && ln -s "$dir/good5/step-000000000002/param_steps" $st/param_steps
  expect 1 "$bin" checkpoint verify c
  says "param_steps: a symbolic link"
  # out of the folder named: a step folder that is a link to a checkpoint elsewhere
  rm -rf c2 && mkdir c2 && ln -s "$dir/ck/step-000000000002" c2/step-000000000009
  expect 1 "$bin" checkpoint verify c2
  says "step-000000000009: not a folder"
  # terminal escapes in a tensor name: `checkpoint info` shows them escaped
  fresh
  "$py" "$src/tests/cli/ckpt_edit.py" $st --rename optim/model.safetensors layer0.w.exp_avg \
    "layer0.w.ex${esc}]0;pwned$(printf '\007')" || fail "edit"
  expect 0 "$bin" checkpoint verify c
  expect 0 "$bin" checkpoint info c
  grep -qF 'ex\x1b]0;pwned\x07' o.out || fail "info: the name is not shown escaped"
  clean
  ;;
resume)
  e="--model tiny --engine $src/examples/configs/resident.cfg"
  # shellcheck disable=SC2086
  train 0 $e --steps 2 --save r --save-every 2
  cp -r r good || fail "cp"
  st=r/checkpoints/step-000000000002
  # user.bin a FIFO: the trainer's blob is read before the engine exists
  rm $st/user.bin && mkfifo $st/user.bin
  # shellcheck disable=SC2086
  train 1 $e --steps 3 --resume r
  says "user.bin: a FIFO"
  # params/ a link to a good copy: the engine's load refuses it
  rm -rf r && cp -r good r && mv $st/params p && ln -s "$dir/p" $st/params
  # shellcheck disable=SC2086
  train 1 $e --steps 3 --resume r
  says "params is a symbolic link"
  # terminal escapes in a tensor's dtype and in the shard an index names:
  # the load's messages show them escaped
  rm -rf r && cp -r good r
  "$py" - $st/params/model.safetensors <<'EOF'
import json, struct, sys
p = sys.argv[1]
raw = open(p, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
h[[k for k in h if k != "__metadata__"][0]]["dtype"] = "F\x1b]0;pwned\x07"
b = json.dumps(h).encode()
b += b" " * (-len(b) % 8)
open(p, "wb").write(struct.pack("<Q", len(b)) + b + raw[8 + n:])
EOF
  "$py" "$src/tests/cli/ckpt_edit.py" $st || fail "edit"
  # shellcheck disable=SC2086
  train 1 $e --steps 3 --resume r
  says "unknown dtype 'F\x1b]0;pwned\x07'" && clean
  rm -rf r && cp -r good r
  "$py" - $st/params <<'EOF'
import json, os, struct, sys
d = sys.argv[1]
raw = open(os.path.join(d, "model.safetensors"), "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
shard = "e\x1b]0;pwned\x07.safetensors"
wm = {k: shard for k in json.loads(raw[8:8 + n]) if k != "__metadata__"}
json.dump({"metadata": {}, "weight_map": wm}, open(os.path.join(d, "model.safetensors.index.json"), "w"))
os.rename(os.path.join(d, "model.safetensors"), os.path.join(d, shard))
EOF
  sed -i '/^file params\/model.safetensors /d' $st/manifest
  "$py" "$src/tests/cli/ckpt_edit.py" $st --add params/model.safetensors.index.json || fail "edit"
  # shellcheck disable=SC2086
  train 1 $e --steps 3 --resume r
  says 'params/e\x1b]0;pwned\x07.safetensors: not listed in the manifest' && clean
  rm -rf r && cp -r good r
  # shellcheck disable=SC2086
  train 0 $e --steps 3 --resume r
  ;;
weights)
  # a FIFO named, or in the folder named
  mkfifo fifo.safetensors
  train 1 --model "$fix/config.json" --weights fifo.safetensors
  says "a FIFO"
  mkdir w && mkfifo w/model.safetensors
  train 1 --model "$fix/config.json" --weights w
  says "w/model.safetensors: a FIFO"
  train 1 --model "$fix/config.json" --weights /dev/zero
  says "a device"
  # a link in the folder named, to a file outside
  rm w/model.safetensors && ln -s /etc/passwd w/model.safetensors
  train 1 --model "$fix/config.json" --weights w
  says "a symbolic link"
  grep -q "header length" o.err && fail "a byte of the link's target was shown"
  # an index whose shard is a link (to good weights), and one naming a path out of its folder
  mkdir ix && ln -s "$fix/model.safetensors" ix/model-1.safetensors
  "$py" -c 'import json,struct,sys
raw=open(sys.argv[1],"rb").read(); n=struct.unpack("<Q",raw[:8])[0]
names=[k for k in json.loads(raw[8:8+n]) if k!="__metadata__"]
for d,f in (("ix","model-1.safetensors"),("up","../model.safetensors")):
  json.dump({"metadata":{},"weight_map":{k:f for k in names}},open(d+".json","w"))' "$fix/model.safetensors"
  mv ix.json ix/model.safetensors.index.json
  train 1 --model "$fix/config.json" --weights ix
  says "ix/model-1.safetensors: a symbolic link"
  mkdir up && cp "$fix/model.safetensors" . && mv up.json up/model.safetensors.index.json
  train 1 --model "$fix/config.json" --weights up
  says "not a plain file name"
  # terminal escapes in an unused tensor's name: the warning and the refusal show them escaped
  "$py" "$src/tests/gpt/st_edit.py" "$fix/model.safetensors" evil.safetensors \
    --add "x${esc}]0;pwned$(printf '\007')${esc}[2J=wte.weight" || fail "st_edit.py"
  train 0 --model "$fix/config.json" --weights evil.safetensors
  says 'x\x1b]0;pwned\x07\x1b[2J' && clean
  train 1 --model "$fix/config.json" --weights evil.safetensors --strict-weights
  says "refused (--strict-weights)" && says 'x\x1b]0;pwned\x07\x1b[2J' && clean
  ;;
model)
  mkdir m && mkfifo m/config.json
  train 1 --model m
  says "m/config.json: a FIFO"
  # /dev/zero: refused before a byte is read (it reached 2.1 GB of RSS)
  train 1 --model /dev/zero
  says "/dev/zero: a device"
  mkdir l && ln -s "$fix/config.json" l/config.json
  train 1 --model l
  says "l/config.json: a symbolic link"
  mkdir big && truncate -s 5M big/config.json
  train 1 --model big
  says "big/config.json: larger than 4194304 bytes"
  # `ferry plan --model` reads a config.json too
  mkfifo cfgfifo
  expect 2 "$bin" plan --model cfgfifo
  says "cfgfifo: a FIFO"
  expect 2 "$bin" plan --model /dev/zero
  says "/dev/zero: a device"
  ;;
tokenizer)
  printf '{"a": 0, "b": 1}\n' >vocab.json
  printf '#version: 0.2\na b\n' >merges.txt
  mkdir f && mkfifo f/vocab.json && cp merges.txt f/
  train 1 --model tiny --tokenizer f
  says "f/vocab.json: a FIFO"
  mkdir g && cp vocab.json g/ && mkfifo g/merges.txt
  train 1 --model tiny --tokenizer g
  says "g/merges.txt: a FIFO"
  mkdir l && ln -s "$dir/vocab.json" l/vocab.json && cp merges.txt l/
  train 1 --model tiny --tokenizer l
  says "l/vocab.json: a symbolic link"
  mkdir big && truncate -s 65M big/vocab.json && cp merges.txt big/
  train 1 --model tiny --tokenizer big
  says "big/vocab.json: larger than 67108864 bytes"
  ;;
config)
  mkfifo fifo.cfg
  expect 1 "$bin" config check fifo.cfg
  says "fifo.cfg: a FIFO"
  # @include of a FIFO, of a link to a device, nested
  mkfifo inc.fifo && printf 'chunk_size = "8M";\n@include "inc.fifo"\n' >a.cfg
  expect 1 "$bin" config check a.cfg
  says "inc.fifo: a FIFO"
  ln -s /dev/zero zero && printf '@include "a2.cfg"\n' >b.cfg && printf '@include "zero"\n' >a2.cfg
  expect 1 "$bin" config check b.cfg
  says "zero: a device"
  # over 256 KiB (one 4 MiB string took 30 s to parse)
  "$py" -c 'open("big.cfg","w").write("x = \"" + "a" * 300000 + "\";\n")'
  expect 1 "$bin" config check big.cfg
  says "big.cfg: larger than 262144 bytes"
  # a good include still works
  printf 'chunk_size = "8M";\n' >good.inc && printf '@include "good.inc"\n' >g.cfg
  expect 0 "$bin" config check g.cfg
  grep -qE '^chunk_size +8388608$' o.out || fail "the include was not read"
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "cli.hostile.files.$case_: ok"
