# shellcheck shell=sh
# bench/fio_lib.sh — sourced by io_vs_fio.sh and io_ab.sh: the median of
# numbers on stdin, and one fio run on the file $F (removed before and
# after) with the settings ferry is compared against: direct=1,
# ioengine=io_uring, registered files and buffers, one job, $SIZE bytes,
# FIO_MEM (e.g. shmhuge) for its buffers when set; OVERWRITE=1: a write is
# timed on a second run over the file an untimed first run wrote (ferry's
# --overwrite; see overwrite_flag); LAYOUT=direct: a read is timed on a
# file an untimed O_DIRECT write run of the same bs and qd just wrote, as
# ferry bench io's is (default: fio lays the file out itself, with
# buffered writes). Needs fio and jq.
median() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

fio_run() { # bs qd mode -> fio's JSON
  fio --name=ferry-cmp --filename="$F" --size="$SIZE" --bs="$1" --iodepth="$2" --rw="$3" \
      --direct=1 --ioengine=io_uring --fixedbufs=1 --registerfiles=1 --numjobs=1 ${FIO_MEM:+--mem=$FIO_MEM} \
      --output-format=json 2>/dev/null
}

fio_gbs() { # bs qd mode -> GB/s (1e9 bytes)
  rm -f "$F"
  if [ "${OVERWRITE:-0}" = 1 ] && [ "$3" = write ]; then fio_run "$@" >/dev/null; fi
  if [ "${LAYOUT:-fio}" = direct ] && [ "$3" != write ]; then fio_run "$1" "$2" write >/dev/null; fi
  fio_run "$@" | jq -r ".jobs[0].$3.bw_bytes / 1e9"
  rm -f "$F"
}

overwrite_flag() { # mode -> ferry's flag for OVERWRITE=1 (write only)
  if [ "${OVERWRITE:-0}" = 1 ] && [ "$1" = write ]; then echo --overwrite; fi
}
