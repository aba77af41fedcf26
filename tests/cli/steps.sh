# tests/cli/steps.sh — the steps the script tests of tests/cli/ share,
# sourced after the script sets $name (the test's name, for messages) and
# $dir (its scratch folder, the current directory).
# fail MSG: says which test failed and why, shows *.out and *.err, exits 1
fail() {
  echo "$name: FAILED: $*" >&2
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
