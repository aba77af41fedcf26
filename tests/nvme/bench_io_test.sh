#!/bin/sh
# tests/nvme/bench_io_test.sh — `ferry bench io` and `ferry bench uring` (the
# io_uring floor) run small passes, validate them, and print the JSON keys
# scripts read, with each buffer page kind; --overwrite times a second
# write pass and says so in the JSON; bench io's --mode mixed times reads and
# rewrites in one pass; bench io's --outstanding keeps more
# requests submitted than the disk's queue depth; bad options exit 2; --hugetlb
# with no hugetlb pages reserved fails with a line that says how to reserve
# them. $1 = the ferry binary, $2 = a scratch folder. Exit 0 pass, 1 fail,
# 77 skip (io_uring or O_DIRECT not usable here).
set -u
bin=$1
dir=$2
rm -rf "$dir" && mkdir -p "$dir" || exit 1
fail() {
  echo "nvme.bench_io: FAILED: $*" >&2
  for f in "$dir"/*.out; do [ -f "$f" ] && { echo "--- $f" >&2; cat "$f" >&2; }; done
  exit 1
}
if ! "$bin" bench uring --path "$dir" --size 256k --bs 64k --qd 2 --mode write >"$dir/probe.out" 2>&1; then
  echo "nvme.bench_io: skip: the io_uring floor does not run here: $(tail -1 "$dir/probe.out")"
  exit 77
fi
for b in io uring; do
  "$bin" bench $b --help >"$dir/help.out" 2>&1 || fail "bench $b --help exited non-zero"
  grep -q -- "--hugetlb" "$dir/help.out" || fail "bench $b --help does not document --hugetlb"
  "$bin" bench $b --path "$dir" --mode sideways >"$dir/bad.out" 2>&1
  [ $? -eq 2 ] || fail "bench $b --mode sideways should exit 2"
  for mode in write read; do
    for pages in "" --no-hugepages; do
      "$bin" bench $b --path "$dir" --size 1M --bs 64k --qd 4 --mode $mode $pages --json \
        >"$dir/run.out" 2>&1 || fail "bench $b --mode $mode $pages exited $?"
      for k in '"bench":"'$b'"' '"mode":"'$mode'"' '"bs":65536' '"qd":4' '"bytes":1048576' \
               '"gb_per_s":' '"iops":' '"p50_us":' '"p99_us":' '"pages":"'; do
        grep -q "$k" "$dir/run.out" || fail "bench $b $mode $pages: no $k in its JSON"
      done
      want=thp; [ -n "$pages" ] && want=4k
      grep -q "\"pages\":\"$want\"" "$dir/run.out" || fail "bench $b $pages: pages is not $want"
      grep -q '"overwrite":false' "$dir/run.out" || fail "bench $b $mode $pages: overwrite is not false"
    done
  done
  "$bin" bench $b --path "$dir" --size 1M --bs 64k --qd 4 --mode write --overwrite --json \
    >"$dir/ow.out" 2>&1 || fail "bench $b --overwrite exited $?"
  grep -q '"overwrite":true' "$dir/ow.out" || fail "bench $b --overwrite: overwrite is not true"
  if [ $b = io ]; then
    for mode in write randread; do
      "$bin" bench io --path "$dir" --size 1M --bs 64k --qd 4 --outstanding 9 --mode $mode --json \
        >"$dir/out.out" 2>&1 || fail "bench io --outstanding 9 --mode $mode exited $?"
      grep -q '"outstanding":9' "$dir/out.out" || fail "bench io --outstanding 9: not in its JSON"
    done
    # the read checks are timed in the read pass, and absent without a CRC
    "$bin" bench io --path "$dir" --size 1M --bs 64k --qd 4 --json >"$dir/ck.out" 2>&1 ||
      fail "bench io read exited $?"
    grep -Eq '"check_gb_per_s":([1-9]|0\.0*[1-9])' "$dir/ck.out" || fail "bench io read: check_gb_per_s is not positive"
    "$bin" bench io --path "$dir" --size 1M --bs 64k --qd 4 --no-verify --json >"$dir/ck.out" 2>&1 ||
      fail "bench io --no-verify exited $?"
    grep -q '"check_s_per_gb":0[,}]' "$dir/ck.out" || fail "bench io --no-verify: check_s_per_gb is not 0"
    # mixed: reads and rewrites in one timed pass, validated, the share in the JSON
    "$bin" bench io --path "$dir" --size 1M --bs 64k --qd 4 --mode mixed --read-share 0.25 --json \
      >"$dir/mx.out" 2>&1 || fail "bench io --mode mixed exited $?"
    for k in '"mode":"mixed"' '"bytes":1048576' '"read_share":0.25' '"gb_per_s":'; do
      grep -q "$k" "$dir/mx.out" || fail "bench io --mode mixed: no $k in its JSON"
    done
    "$bin" bench io --path "$dir" --mode mixed --read-share 1 >"$dir/bad.out" 2>&1
    [ $? -eq 2 ] || fail "bench io --read-share 1 should exit 2"
    "$bin" bench io --path "$dir" --outstanding 0 >"$dir/bad.out" 2>&1
    [ $? -eq 2 ] || fail "bench io --outstanding 0 should exit 2"
    # check threads: the default (1) and none, both in the JSON; submissions
    # are counted (requests_per_submit > 0); a bad count exits 2
    grep -q '"check_threads":1' "$dir/ck.out" || fail "bench io: check_threads is not 1 by default"
    grep -Eq '"requests_per_submit":([1-9]|0\.0*[1-9])' "$dir/ck.out" ||
      fail "bench io: requests_per_submit is not positive"
    "$bin" bench io --path "$dir" --size 1M --bs 64k --qd 4 --check-threads 0 --json >"$dir/ct.out" 2>&1 ||
      fail "bench io --check-threads 0 exited $?"
    grep -q '"check_threads":0' "$dir/ct.out" || fail "bench io --check-threads 0: not in its JSON"
    "$bin" bench io --path "$dir" --check-threads 65 >"$dir/bad.out" 2>&1
    [ $? -eq 2 ] || fail "bench io --check-threads 65 should exit 2"
  fi
  "$bin" bench $b --path "$dir" --mode read --overwrite >"$dir/bad.out" 2>&1
  [ $? -eq 2 ] || fail "bench $b --mode read --overwrite should exit 2"
  grep -q "needs --mode write" "$dir/bad.out" || fail "bench $b: --overwrite on a read does not say why"
done
ls "$dir" | grep -q '\.dat$\|\.swap$' && fail "a benchmark left its file behind: $(ls "$dir")"
if [ "$(cat /proc/sys/vm/nr_hugepages 2>/dev/null || echo 0)" = 0 ]; then
  "$bin" bench uring --path "$dir" --size 1M --bs 64k --qd 4 --hugetlb >"$dir/tlb.out" 2>&1 &&
    fail "--hugetlb with no hugetlb pages reserved succeeded"
  grep -q "nr_hugepages" "$dir/tlb.out" || fail "--hugetlb failure does not say how to reserve pages"
fi
rm -rf "$dir"
echo "nvme.bench_io: ok"
