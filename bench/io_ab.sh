#!/bin/sh
# bench/io_ab.sh — two builds of ferry (or two benchmarks) against fio on
# one directory, for a change to the swap engine: fio, A and B back to
# back, the order rotated every repeat; prints each repeat and the medians
# of the per-repeat ratios A/fio and B/fio (the disk drifts between runs).
#
# usage: bench/io_ab.sh DIR A B [SIZE=2G] [REPEATS=6]
#        A, B: a ferry binary (runs `A bench io`), or a command prefix in
#        quotes that takes bench io's options and prints its JSON, e.g.
#        "build/bin/ferry bench uring" (the io_uring floor) or
#        "build/bin/ferry bench io --no-verify"
#        CASES="1M:32:write 1M:8:write 128k:32:write" (bs:qd:mode)
#        FIO_MEM=shmhuge: fio's buffers in hugetlb pages (reserve them first)
#        OVERWRITE=1: writes timed over an already written file (see io_vs_fio.sh)
set -eu
. "$(dirname "$0")/fio_lib.sh"
DIR=${1:?usage: io_ab.sh DIR A B [SIZE] [REPEATS]}
A=${2:?A: a ferry binary or a command prefix}; B=${3:?B: a ferry binary or a command prefix}
SIZE=${4:-2G}; REPEATS=${5:-6}
CASES=${CASES:-"1M:32:write 1M:8:write 128k:32:write"}
command -v fio >/dev/null || { echo "io_ab.sh: fio not found (apt-get install fio)" >&2; exit 2; }
command -v jq >/dev/null || { echo "io_ab.sh: jq not found (apt-get install jq)" >&2; exit 2; }
mkdir -p "$DIR"
F="$DIR/io-ab-fio.dat"
T=$(mktemp -d)
trap 'rm -f "$F"; rm -rf "$T"' EXIT
ferry_gbs() { # A-or-B bs qd mode
  if [ -f "$1" ] && [ -x "$1" ]; then cmd="$1 bench io"; else cmd=$1; fi
  # shellcheck disable=SC2086 # a command prefix: split on purpose
  # shellcheck disable=SC2046 # an empty flag must vanish
  $cmd --path "$DIR" --size "$SIZE" --bs "$2" --qd "$3" --mode "$4" --json $(overwrite_flag "$4") | jq -r .gb_per_s
}
for c in $CASES; do
  bs=$(echo "$c" | cut -d: -f1); qd=$(echo "$c" | cut -d: -f2); m=$(echo "$c" | cut -d: -f3)
  : >"$T/a"; : >"$T/b"
  i=0
  while [ $i -lt "$REPEATS" ]; do
    case $((i % 3)) in
    0) f=$(fio_gbs "$bs" "$qd" "$m"); a=$(ferry_gbs "$A" "$bs" "$qd" "$m"); b=$(ferry_gbs "$B" "$bs" "$qd" "$m") ;;
    1) a=$(ferry_gbs "$A" "$bs" "$qd" "$m"); b=$(ferry_gbs "$B" "$bs" "$qd" "$m"); f=$(fio_gbs "$bs" "$qd" "$m") ;;
    *) b=$(ferry_gbs "$B" "$bs" "$qd" "$m"); f=$(fio_gbs "$bs" "$qd" "$m"); a=$(ferry_gbs "$A" "$bs" "$qd" "$m") ;;
    esac
    echo "$a $f" | awk '{print $1/$2}' >>"$T/a"
    echo "$b $f" | awk '{print $1/$2}' >>"$T/b"
    echo "$c  fio $f  A $a  B $b"
    i=$((i + 1))
  done
  echo "$c  median A/fio $(median <"$T/a")  B/fio $(median <"$T/b")"
done
