#!/bin/sh
# bench/io_vs_fio.sh — ferry's swap engine against Debian's fio on the same
# directory: fio (direct=1, ioengine=io_uring, registered files and buffers)
# and `ferry bench io` alternate, same file size, bs and qd, CRC on; then the
# CRC's cost (verify vs --no-verify). Prints medians and ferry/fio ratios.
#
# usage: bench/io_vs_fio.sh DIR [SIZE=1G] [REPEATS=3]
#        FERRY=path/to/ferry (default: build/bin/ferry), CASES="1M:8 1M:32 128k:32"
set -eu
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

median() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

fio_gbs() { # bs qd mode -> GB/s (1e9 bytes)
  rm -f "$F"
  fio --name=fio-vs-ferry --filename="$F" --size="$SIZE" --bs="$1" --iodepth="$2" --rw="$3" \
      --direct=1 --ioengine=io_uring --fixedbufs=1 --registerfiles=1 --numjobs=1 \
      --output-format=json 2>/dev/null | jq -r ".jobs[0].$3.bw_bytes / 1e9"
  rm -f "$F"
}

ferry_json() { # bs qd mode [extra] -> one JSON line
  "$FERRY" bench io --path "$DIR" --size "$SIZE" --bs "$1" --qd "$2" --mode "$3" --json ${4:-}
}

printf '%-6s %-4s %-6s %10s %10s %7s %10s\n' mode bs qd fio_GB/s ferry_GB/s ratio cpu_s/GB
for c in $CASES; do
  bs=${c%%:*}; qd=${c##*:}
  for mode in $MODES; do
    : >/tmp/io_vs_fio.f; : >/tmp/io_vs_fio.g; : >/tmp/io_vs_fio.c
    i=0
    while [ $i -lt "$REPEATS" ]; do
      fio_gbs "$bs" "$qd" "$mode" >>/tmp/io_vs_fio.f
      j=$(ferry_json "$bs" "$qd" "$mode")
      echo "$j" | jq -r .gb_per_s >>/tmp/io_vs_fio.g
      echo "$j" | jq -r .cpu_s_per_gb >>/tmp/io_vs_fio.c
      i=$((i + 1))
    done
    f=$(median </tmp/io_vs_fio.f); g=$(median </tmp/io_vs_fio.g); cpu=$(median </tmp/io_vs_fio.c)
    printf '%-6s %-4s %-6s %10.3f %10.3f %7.3f %10.3f   (fio: %s; ferry: %s)\n' "$mode" "$bs" "$qd" \
      "$f" "$g" "$(echo "$g $f" | awk '{print $1/$2}')" "$cpu" \
      "$(tr '\n' ' ' </tmp/io_vs_fio.f)" "$(tr '\n' ' ' </tmp/io_vs_fio.g)"
  done
done

echo
echo "CRC32C cost on reads (bs=1M qd=32, alternating verify on/off):"
: >/tmp/io_vs_fio.on; : >/tmp/io_vs_fio.off; : >/tmp/io_vs_fio.con; : >/tmp/io_vs_fio.coff
i=0
while [ $i -lt "$REPEATS" ]; do
  j=$(ferry_json 1M 32 read); echo "$j" | jq -r .gb_per_s >>/tmp/io_vs_fio.on; echo "$j" | jq -r .cpu_s_per_gb >>/tmp/io_vs_fio.con
  j=$(ferry_json 1M 32 read --no-verify); echo "$j" | jq -r .gb_per_s >>/tmp/io_vs_fio.off; echo "$j" | jq -r .cpu_s_per_gb >>/tmp/io_vs_fio.coff
  i=$((i + 1))
done
on=$(median </tmp/io_vs_fio.on); off=$(median </tmp/io_vs_fio.off)
con=$(median </tmp/io_vs_fio.con); coff=$(median </tmp/io_vs_fio.coff)
printf 'crc on %.3f GB/s (%.3f CPU s/GB), off %.3f GB/s (%.3f CPU s/GB): throughput cost %.1f%%\n' \
  "$on" "$con" "$off" "$coff" "$(echo "$on $off" | awk '{print 100*(1-$1/$2)}')"
rm -f /tmp/io_vs_fio.*
