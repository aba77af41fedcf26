# bench/fio_lib.sh — sourced by io_vs_fio.sh and io_ab.sh: the median of
# numbers on stdin, and one fio run on the file $F (removed before and
# after) with the settings ferry is compared against: direct=1,
# ioengine=io_uring, registered files and buffers, one job, $SIZE bytes,
# FIO_MEM (e.g. shmhuge) for its buffers when set. Needs fio and jq.
median() { sort -g | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

fio_gbs() { # bs qd mode -> GB/s (1e9 bytes)
  rm -f "$F"
  fio --name=ferry-cmp --filename="$F" --size="$SIZE" --bs="$1" --iodepth="$2" --rw="$3" \
      --direct=1 --ioengine=io_uring --fixedbufs=1 --registerfiles=1 --numjobs=1 ${FIO_MEM:+--mem=$FIO_MEM} \
      --output-format=json 2>/dev/null | jq -r ".jobs[0].$3.bw_bytes / 1e9"
  rm -f "$F"
}
