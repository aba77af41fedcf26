# shellcheck shell=bash
# tools/progress.sh — progress lines for ferry.sh's long phases (sourced by
# ferry.sh, bash): a build's share done, with the elapsed time and an ETA,
# read from the build's own output.

# progress_clock SECONDS: m:ss
progress_clock() {
  printf '%d:%02d' $(($1 / 60)) $(($1 % 60))
}

# build_progress LABEL [STEP]: reads a build's output on stdin (cmake's make
# lines "[ 42%] Building C object ..." or ninja's "[46/110] Building ...")
# and prints "LABEL 42% done, 0:12 elapsed, eta 0:17" each time the share
# passes a multiple of STEP percent (default 10); the other lines of the
# build (compiler warnings and errors, make's errors) pass through as they
# are, the per-file lines do not. The ETA assumes the rest goes as fast as
# what is done.
build_progress() {
  local label=$1 step=${2:-10} t0=$SECONDS line pct el next
  next=$step
  while IFS= read -r line; do
    pct=""
    if [[ $line =~ ^\[\ *([0-9]+)%\]\  ]]; then
      pct=${BASH_REMATCH[1]}
    elif [[ $line =~ ^\[([0-9]+)/([0-9]+)\]\  ]]; then
      pct=$((100 * BASH_REMATCH[1] / BASH_REMATCH[2]))
    elif [[ $line =~ ^(Scanning\ dependencies|Consolidate\ compiler\ generated) ]]; then
      continue
    else
      printf '%s\n' "$line"
      continue
    fi
    [ "$pct" -ge "$next" ] || continue
    el=$((SECONDS - t0))
    printf '%s %3d%% done, %s elapsed, eta %s\n' "$label" "$pct" "$(progress_clock $el)" \
      "$(progress_clock $((el * (100 - pct) / pct)))"
    next=$(((pct / step + 1) * step))
  done
}
