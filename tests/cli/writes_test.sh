#!/bin/sh
# tests/cli/writes_test.sh — user-visible files and output written as a
# careless or hostile setting would have it: each CASE checks that a file
# is replaced whole (a symlink planted at its name is replaced, never
# written through; a failed write, here past `ulimit -f`, keeps the old
# file byte for byte and leaves no temporary), that lost stdout (/dev/full,
# a closed descriptor) exits non-zero with a message, and that SIGXFSZ does
# not kill the program silently.
#   ferry   `ferry config write`, `ferry plan --write-config`, `info`, `plan --json`
#   gpt     `ferry-gpt train --save`, `--json`, `--resume` past an empty step-* folder
# $1 = the binary (ferry or ferry-gpt), $2 = CASE, $3 = a scratch folder,
# $4 = a text file (gpt: the data), $5 = the engine configs folder (gpt).
# Exit 0 pass, 1 fail.
set -u
bin=$1
case_=$2
dir=$3
data=${4:-}
configs=${5:-}
name=writes.$case_
# shellcheck source=tests/cli/steps.sh
. "$(dirname "$0")/steps.sh"
rm -rf "$dir" && mkdir -p "$dir" || exit 1
cd "$dir" || exit 1
# lost CMD...: CMD with stdout on /dev/full, then closed: exit 1, named
lost() {
  "$@" >/dev/full 2>o.err
  got=$?
  [ "$got" = 1 ] || fail "'$*' >/dev/full exited $got, wanted 1"
  says "writing stdout failed"
  "$@" >&- 2>o.err
  got=$?
  [ "$got" = 1 ] || fail "'$*' with stdout closed exited $got, wanted 1"
  says "writing stdout failed"
}
# no_temporaries DIR: no ".NAME.tmp-*" left in DIR
no_temporaries() {
  for t in "$1"/.*.tmp-*; do [ -e "$t" ] && fail "a temporary is left: $t"; done
  return 0
}
# small_limit CMD...: CMD under a 1-block (512 bytes) file size limit
small_limit() { sh -c 'ulimit -f 1 && exec "$@"' sh "$@"; }

echo "a file outside" >victim
case $case_ in
ferry)
  # a symlink planted at the target is replaced, not written through
  ln -s victim w.cfg
  expect 0 "$bin" config write w.cfg
  [ "$(cat victim)" = "a file outside" ] || fail "config write wrote through a symlink"
  [ -f w.cfg ] && [ ! -L w.cfg ] || fail "w.cfg is not a regular file"
  ln -s victim p.cfg
  expect 0 "$bin" plan --model gpt2 --gpu-mem 24G --write-config p.cfg
  [ "$(cat victim)" = "a file outside" ] || fail "plan --write-config wrote through a symlink"
  # a failed write keeps the old file whole (it was truncated) and names the limit
  cp w.cfg w.old
  expect 1 small_limit "$bin" config write w.cfg --set chunk_size=8M
  says "file size limit"
  cmp -s w.cfg w.old || fail "a failed config write changed the old file"
  cp p.cfg p.old
  expect 1 small_limit "$bin" plan --model gpt2 --gpu-mem 24G --write-config p.cfg
  cmp -s p.cfg p.old || fail "a failed plan --write-config changed the old file"
  no_temporaries .
  # lost output is a failure
  lost "$bin" info
  lost "$bin" info --json
  lost "$bin" plan --model gpt2 --gpu-mem 24G --json
  lost "$bin" version
  ;;
gpt)
  tiny="train --model tiny --data $data --batch 2 --seq 16"
  # shellcheck disable=SC2086
  expect 0 "$bin" $tiny --steps 1 --save s
  cp s/model.safetensors old.safetensors && cp s/config.json old.json
  # a failed --save (past ulimit -f) keeps the old weights and config
  # shellcheck disable=SC2086
  expect 1 small_limit "$bin" $tiny --steps 1 --seed 3 --save s
  says "file size limit"
  cmp -s s/model.safetensors old.safetensors || fail "a failed --save changed the old weights"
  cmp -s s/config.json old.json || fail "a failed --save changed the old config.json"
  no_temporaries s
  # a full disk: a 4 MiB tmpfs (in a private mount namespace; skipped where
  # none can be made) holding a 1 MB old model.safetensors, where the new
  # one (4.2 MB) cannot fit: the save fails and keeps the old file (it was
  # truncated, then unlinked)
  if unshare -rm true 2>/dev/null; then
    mkdir full
    head -c 1000000 old.safetensors >full.old
    # shellcheck disable=SC2016
    unshare -rm sh -c 'mount -t tmpfs -o size=4m tmpfs full && cd full && mkdir s &&
      cp ../full.old s/model.safetensors && cp ../old.json s/config.json &&
      { "$@" --steps 1 --save s >../o.out 2>../o.err; echo $? >../full.rc; } &&
      cmp -s s/model.safetensors ../full.old && cmp -s s/config.json ../old.json &&
      echo same >../full.same; ls -a s >../full.ls' sh "$bin" $tiny
    [ "$(cat full.rc 2>/dev/null)" = 1 ] || fail "a --save on a full disk did not exit 1"
    says "No space left on device"
    [ -f full.same ] || fail "a --save on a full disk changed the old weights or config.json"
    grep -q '\.tmp-' full.ls && fail "a --save on a full disk left a temporary"
  fi
  # links planted in DIR are replaced, never written through
  rm s/model.safetensors s/config.json
  ln -s ../victim s/model.safetensors && ln -s ../victim s/config.json
  # shellcheck disable=SC2086
  expect 0 "$bin" $tiny --steps 1 --save s
  [ "$(cat victim)" = "a file outside" ] || fail "--save wrote through a symlink"
  [ -L s/model.safetensors ] || [ -L s/config.json ] && fail "--save left a symlink"
  cmp -s s/model.safetensors old.safetensors || fail "the weights of the same run differ"
  # lost output is a failure
  # shellcheck disable=SC2086
  lost "$bin" $tiny --steps 1 --json
  # an empty newest step-* folder: resume from the newest complete one, named
  eng="$tiny --seed 7 --engine $configs/resident.cfg"
  # shellcheck disable=SC2086
  expect 0 "$bin" $eng --steps 2 --save r --save-every 2
  mkdir r/checkpoints/step-000000000009
  # shellcheck disable=SC2086
  expect 0 "$bin" $eng --steps 3 --resume r
  says "skipped r/checkpoints/step-000000000009"
  grep -qF "resumed r/checkpoints/step-000000000002" o.out || fail "not resumed from step 2"
  rm -r r/checkpoints/step-000000000002
  # shellcheck disable=SC2086
  expect 1 "$bin" $eng --steps 3 --resume r
  says "no complete checkpoint"
  ;;
*) fail "unknown case" ;;
esac
exit 0
