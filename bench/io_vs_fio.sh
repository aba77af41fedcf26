#!/bin/sh
# bench/io_vs_fio.sh — ferry's swap engine against Debian's fio on the same
# directory: fio (direct=1, ioengine=io_uring, registered files and buffers)
# and `ferry bench io` alternate, same file size, bs and qd, CRC on; then the
# CRC's cost (verify vs --no-verify). Prints medians, the ratio of the
# medians and the median of the per-pair ratios.
#
# usage: bench/io_vs_fio.sh DIR [SIZE=1G] [REPEATS=3]
#        FERRY=path/to/ferry (default: build/bin/ferry), CASES="1M:8 1M:32 128k:32"
#        FIO_MEM=shmhuge: fio's buffers in hugetlb pages (as root: reserve them
#        first, e.g. echo 128 > /proc/sys/vm/nr_hugepages), the fair match for
#        ferry's huge-page buffers; default: fio's malloc'd 4 KiB pages.
#        OVERWRITE=1: writes are timed over a file already written once (fio:
#        a second run on the same file; ferry: --overwrite), as a swap file
#        is rewritten every step. Without it a write pass lays out a fresh
#        file, and on a file system mounted with -o discard that also times
#        the device refilling the blocks the previous file freed.
set -eu
. "$(dirname "$0")/fio_lib.sh"
DIR=${1:?usage: io_vs_fio.sh DIR [SIZE] [REPEATS]}
SIZE=${2:-1G}
REPEATS=${3:-3}
FERRY=${FERRY:-build/bin/ferry}
CASES=${CASES:-"1M:8 1M:32 128k:32"}
MODES=${MODES:-"read write"}
command -v fio >/dev/null || { echo "io_vs_fio.sh: fio not found (apt-get install fio)" >&2; exit 2; }
command -v jq >/dev/null || { echo "io_vs_fio.sh: jq not found (apt-get install jq)" >&2; exit 2; }
[ -x "$FERRY" ] || { echo "io_vs_fio.sh: $FERRY not built (set FERRY=...)" >&2; exit 2; }
mkdir -p "$DIR"
F="$DIR/fio-vs-ferry.dat"
trap 'rm -f "$F"' EXIT

ferry_json() { # bs qd mode [extra] -> one JSON line
  # shellcheck disable=SC2046,SC2086 # empty flags must vanish
  "$FERRY" bench io --path "$DIR" --size "$SIZE" --bs "$1" --qd "$2" --mode "$3" --json ${4:-} $(overwrite_flag "$3")
}

# Each repeat runs fio, ferry (huge-page buffers, as the engine's pinned
# pool) and ferry --no-hugepages (4 KiB pages, like fio's malloc'd
# buffers) back to back, the order rotated every repeat so a drift of the
# disk favours none; "pair" is the median of the per-repeat ratios
# ferry/fio, the figure to quote on a disk whose speed wanders.
printf '%-6s %-4s %-4s %9s %10s %7s %7s %10s %7s %9s\n' mode bs qd fio_GB/s ferry_GB/s ratio pair 4k_GB/s 4k_pair cpu_s/GB
for c in $CASES; do
  bs=${c%%:*}; qd=${c##*:}
  for mode in $MODES; do
    : >/tmp/io_vs_fio.f; : >/tmp/io_vs_fio.g; : >/tmp/io_vs_fio.c; : >/tmp/io_vs_fio.p
    : >/tmp/io_vs_fio.k; : >/tmp/io_vs_fio.kp
    i=0
    while [ $i -lt "$REPEATS" ]; do
      case $((i % 3)) in
      0) f1=$(fio_gbs "$bs" "$qd" "$mode"); j=$(ferry_json "$bs" "$qd" "$mode")
         k=$(ferry_json "$bs" "$qd" "$mode" --no-hugepages) ;;
      1) j=$(ferry_json "$bs" "$qd" "$mode"); k=$(ferry_json "$bs" "$qd" "$mode" --no-hugepages)
         f1=$(fio_gbs "$bs" "$qd" "$mode") ;;
      *) k=$(ferry_json "$bs" "$qd" "$mode" --no-hugepages); f1=$(fio_gbs "$bs" "$qd" "$mode")
         j=$(ferry_json "$bs" "$qd" "$mode") ;;
      esac
      g1=$(echo "$j" | jq -r .gb_per_s); k1=$(echo "$k" | jq -r .gb_per_s)
      echo "$f1" >>/tmp/io_vs_fio.f
      echo "$g1" >>/tmp/io_vs_fio.g
      echo "$k1" >>/tmp/io_vs_fio.k
      echo "$j" | jq -r .cpu_s_per_gb >>/tmp/io_vs_fio.c
      echo "$g1 $f1" | awk '{print $1/$2}' >>/tmp/io_vs_fio.p
      echo "$k1 $f1" | awk '{print $1/$2}' >>/tmp/io_vs_fio.kp
      i=$((i + 1))
    done
    f=$(median </tmp/io_vs_fio.f); g=$(median </tmp/io_vs_fio.g); cpu=$(median </tmp/io_vs_fio.c)
    pr=$(median </tmp/io_vs_fio.p); kk=$(median </tmp/io_vs_fio.k); kp=$(median </tmp/io_vs_fio.kp)
    printf '%-6s %-4s %-4s %9.3f %10.3f %7.3f %7.3f %10.3f %7.3f %9.3f\n' "$mode" "$bs" "$qd" \
      "$f" "$g" "$(echo "$g $f" | awk '{print $1/$2}')" "$pr" "$kk" "$kp" "$cpu"
    echo "    fio: $(tr '\n' ' ' </tmp/io_vs_fio.f)"
    echo "    ferry: $(tr '\n' ' ' </tmp/io_vs_fio.g)"
    echo "    ferry 4k: $(tr '\n' ' ' </tmp/io_vs_fio.k)"
  done
done

echo
echo "CRC32C cost on reads (bs=1M qd=32, pairs verify on/off, order swapped every other pair):"
: >/tmp/io_vs_fio.on; : >/tmp/io_vs_fio.off; : >/tmp/io_vs_fio.con; : >/tmp/io_vs_fio.coff; : >/tmp/io_vs_fio.p
i=0
while [ $i -lt "$REPEATS" ]; do
  if [ $((i % 2)) -eq 0 ]; then
    jon=$(ferry_json 1M 32 read); joff=$(ferry_json 1M 32 read --no-verify)
  else
    joff=$(ferry_json 1M 32 read --no-verify); jon=$(ferry_json 1M 32 read)
  fi
  on1=$(echo "$jon" | jq -r .gb_per_s); off1=$(echo "$joff" | jq -r .gb_per_s)
  echo "$on1" >>/tmp/io_vs_fio.on; echo "$jon" | jq -r .cpu_s_per_gb >>/tmp/io_vs_fio.con
  echo "$off1" >>/tmp/io_vs_fio.off; echo "$joff" | jq -r .cpu_s_per_gb >>/tmp/io_vs_fio.coff
  echo "$on1 $off1" | awk '{print 1 - $1/$2}' >>/tmp/io_vs_fio.p
  i=$((i + 1))
done
on=$(median </tmp/io_vs_fio.on); off=$(median </tmp/io_vs_fio.off)
con=$(median </tmp/io_vs_fio.con); coff=$(median </tmp/io_vs_fio.coff); pc=$(median </tmp/io_vs_fio.p)
printf 'crc on %.3f GB/s (%.3f CPU s/GB), off %.3f GB/s (%.3f CPU s/GB): throughput cost %.1f%% (medians), %.1f%% (median of pairs)\n' \
  "$on" "$con" "$off" "$coff" "$(echo "$on $off" | awk '{print 100*(1-$1/$2)}')" "$(echo "$pc" | awk '{print 100*$1}')"
echo "  (on: $(tr '\n' ' ' </tmp/io_vs_fio.on); off: $(tr '\n' ' ' </tmp/io_vs_fio.off))"
rm -f /tmp/io_vs_fio.*
