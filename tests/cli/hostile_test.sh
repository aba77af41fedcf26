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
*)
  fail "unknown case"
  ;;
esac
echo "cli.hostile.$case_: ok"
