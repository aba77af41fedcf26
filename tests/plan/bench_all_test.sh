#!/bin/sh
# tests/plan/bench_all_test.sh — `ferry bench all --quick` passes, prints its
# JSON, and writes a profile that `ferry plan --profile` accepts with every
# host-measurable key taken from it; its write figure is a rewrite pass. $1 = the ferry binary, $2 = a scratch
# folder. Exit 0 pass, 1 fail, 77 skip (bench io cannot run here).
set -u
bin=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir" || exit 1
prof="$dir/profile.json"

fail() {
  echo "plan.bench_all: FAILED: $*" >&2
  for f in "$dir"/*.out "$dir"/*.err "$prof"; do [ -f "$f" ] && { echo "--- $f" >&2; cat "$f" >&2; }; done
  exit 1
}

"$bin" bench all --help >"$dir/help.out" 2>&1 || fail "--help exited non-zero"
grep -q "profile-out" "$dir/help.out" || fail "--help does not document --profile-out"
"$bin" bench all --quick >/dev/null 2>&1
[ $? -eq 2 ] || fail "no --path should exit 2"

if ! "$bin" bench io --path "$dir" --size 1M --qd 1 >"$dir/io.out" 2>&1; then
  echo "plan.bench_all: skip: ferry bench io does not run here: $(tail -1 "$dir/io.out")"
  exit 77
fi
rm -f "$dir/io.out"

"$bin" bench all --quick --json --path "$dir" --profile-out "$prof" >"$dir/all.out" 2>"$dir/all.err" ||
  fail "ferry bench all exited $?"
[ -s "$prof" ] || fail "no profile written"
[ "$(grep '^{"bench":' "$dir/all.out" | grep -vc '^{"bench":"compute"')" -eq 8 ] ||
  fail "expected 7 sub-results (io 2, adam 2, copy 3) and the summary"
[ "$(grep -c '^{"bench":"compute","result":"step"' "$dir/all.out")" -eq 1 ] ||
  fail "expected the compute step's result"
tail -1 "$dir/all.out" | grep -q "^{\"bench\":\"all\",\"profile\":\"$prof\"" ||
  fail "last line is not the summary object"
grep -q '"failed":\[\]' "$dir/all.out" || fail "a sub-benchmark failed"
# the write figure is a rewrite pass, as the swap files are written each step
grep -q '^{"bench":"io","mode":"write".*"overwrite":true' "$dir/all.out" ||
  fail "the write benchmark does not time a rewrite (--overwrite)"
grep -q '"nvme_write_gbps": "ferry bench io --mode write .*--overwrite' "$prof" ||
  fail "the profile's nvme_write_gbps source does not say --overwrite"

"$bin" plan --profile "$prof" --params 1e9 --gpu-mem 24G --host-mem 64G --nvme 1T --json \
  >"$dir/plan.out" 2>"$dir/plan.err" || fail "ferry plan --profile exited $?"
# only what bench all cannot measure may remain assumed
grep -q '"assumed":\["device_mem_gbps"\]' "$dir/plan.out" ||
  fail "plan still assumes a key the profile measured"
rm -rf "$dir"
exit 0
