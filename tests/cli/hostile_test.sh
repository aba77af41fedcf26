#!/bin/sh
# tests/cli/hostile_test.sh — the `ferry` command used as a careless or
# hostile user would (issue 25): each CASE checks one defect's fix, the
# exit code and that the message names the bad value.
#   config     --set values in the config grammar, empty paths refused
#   checkpoint `ferry checkpoint verify|info` on a good and a damaged checkpoint
#   bench      usage errors of the bench subcommands (exit 2, naming the value)
#   wording    messages that say what is wrong once, units in MiB/GiB
# $1 = the ferry binary, $2 = CASE, $3 = a scratch folder, $4 = a helper
# program where the case needs one. Exit 0 pass, 1 fail.
set -u
bin=$1
case_=$2
dir=$3
aux=${4:-}
rm -rf "$dir" && mkdir -p "$dir" || exit 1
cd "$dir" || exit 1
fail() {
  echo "cli.hostile.$case_: FAILED: $*" >&2
  for f in "$dir"/*.out "$dir"/*.err; do [ -f "$f" ] && { echo "--- $f" >&2; cat "$f" >&2; }; done
  exit 1
}
# expect RC CMD...: runs CMD (stdout in o.out, stderr in o.err), wants exit RC
expect() {
  want=$1
  shift
  "$@" >o.out 2>o.err
  got=$?
  [ "$got" = "$want" ] || fail "'$*' exited $got, wanted $want"
}
# says PATTERN: the last command's stderr holds PATTERN (fixed string)
says() { grep -qF -- "$1" o.err || fail "stderr lacks '$1'"; }
# prints PATTERN: the last command's stdout holds PATTERN (fixed string)
prints() { grep -qF -- "$1" o.out || fail "stdout lacks '$1'"; }

case $case_ in
config)
  # a bracketed list sets one path /mnt/x (it used to be a path named ["/mnt/x"])
  expect 0 "$bin" config check /dev/null --set 'tiers.nvme.paths=["/mnt/x"]'
  grep -qE '^tiers.nvme.paths +/mnt/x$' o.out || fail "paths is not /mnt/x"
  expect 0 "$bin" config check /dev/null --set 'tiers.nvme.paths=["/a", "/b"]'
  grep -qE '^tiers.nvme.paths +/a, /b$' o.out || fail "paths is not /a, /b"
  expect 0 "$bin" config check /dev/null --set 'tiers.nvme.paths=/a, /b' --set chunk_size=8M
  grep -qE '^tiers.nvme.paths +/a, /b$' o.out || fail "the bare list form broke"
  # garbage is refused naming the key and the value
  expect 1 "$bin" config check /dev/null --set 'tiers.nvme.paths=["'
  says "tiers.nvme.paths" && says "'[\"'"
  expect 1 "$bin" config write "$dir/w.cfg" --set 'tiers.nvme.paths=["/a"'
  says "tiers.nvme.paths"
  [ -e "$dir/w.cfg" ] && fail "config write wrote a file for a refused --set"
  # empty paths: in a file, in --set, and a placement on nvme with none
  printf 'tiers: { nvme: { paths = [""]; }; };\n' >empty.cfg
  expect 1 "$bin" config check empty.cfg
  says "empty.cfg:1" && says "empty"
  expect 1 "$bin" config check /dev/null --set 'tiers.nvme.paths=""'
  says "tiers.nvme.paths" && says "empty"
  printf 'placement: { optimizer = "nvme"; };\ntiers: { nvme: { paths = []; }; };\n' >nopath.cfg
  expect 1 "$bin" config check nopath.cfg
  says 'placement.optimizer = "nvme" but tiers.nvme.paths is empty'
  ;;
checkpoint)
  # flip DIR FILE OFFSET: changes the byte at OFFSET of FILE (to another value)
  flip() {
    b=$(od -An -tu1 -j"$2" -N1 "$1" | tr -d ' ')
    # shellcheck disable=SC2059
    printf "\\$(printf %o $(((b + 1) % 256)))" | dd of="$1" bs=1 seek="$2" conv=notrunc 2>/dev/null
  }
  "$aux" ck >aux.out 2>&1 || fail "make_checkpoint failed"
  s=ck/step-000000000002
  [ -f $s/manifest ] || fail "no checkpoint written"
  expect 0 "$bin" checkpoint verify ck
  prints "$s: ok (step 2, 8 tensors"
  expect 0 "$bin" checkpoint verify $s --json
  prints '"ok":true' && prints '"step":2'
  expect 0 "$bin" checkpoint info ck
  grep -qE '^step +2$' o.out || fail "info: no step 2"
  grep -qE '^format +3$' o.out || fail "info: no format 3"
  grep -qE '^ranks +1 \(dist.zero_stage' o.out || fail "info: no ranks"
  for fam in params master exp_avg exp_avg_sq; do
    grep -qE "^ +$fam +8 " o.out || fail "info: no family $fam of 8 tensors"
  done
  prints "user.bin"
  expect 0 "$bin" checkpoint info ck --json
  prints '"format":3' && prints '"step":2' && prints '"name":"exp_avg_sq","tensors":8'
  # a flipped byte in a tensor's data: verify exit 1 naming the file
  for f in params/model.safetensors optim/model.safetensors user.bin; do
    rm -rf bad && cp -r ck bad || fail "cp"
    flip "bad/step-000000000002/$f" 3
    expect 1 "$bin" checkpoint verify bad
    says "bad/step-000000000002/$f" && says "CRC32C"
    expect 1 "$bin" checkpoint verify bad --json
    prints '"ok":false' && prints "$f"
  done
  # a damaged manifest: verify and info exit 1 naming it
  rm -rf bad && cp -r ck bad && flip bad/step-000000000002/manifest 20
  expect 1 "$bin" checkpoint verify bad
  says "step-000000000002/manifest"
  expect 1 "$bin" checkpoint info bad
  says "step-000000000002/manifest"
  # nothing there; usage errors
  expect 1 "$bin" checkpoint verify "$dir/none"
  says "$dir/none"
  expect 2 "$bin" checkpoint verify
  says "needs a DIR"
  expect 2 "$bin" checkpoint check ck
  says "unknown subcommand 'check'"
  expect 2 "$bin" checkpoint info ck --jsn
  says "'--jsn'"
  expect 0 "$bin" checkpoint --help
  prints "exit status" && prints "ferry checkpoint verify DIR"
  expect 0 "$bin" help checkpoint
  prints "ferry checkpoint info DIR"
  ;;
*)
  fail "unknown case"
  ;;
esac
echo "cli.hostile.$case_: ok"
