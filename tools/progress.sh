# shellcheck shell=bash
# tools/progress.sh — progress lines for ferry.sh's long phases (sourced by
# ferry.sh, bash): a build's share done, with the elapsed time and an ETA,
# read from the build's own output.

# progress_clock SECONDS: m:ss
progress_clock() {
  printf '%d:%02d' $(($1 / 60)) $(($1 % 60))
}

# build_progress LABEL [STEP [QUIET]]: reads a build's output on stdin
# (cmake's make lines "[ 42%] Building C object ..." or ninja's
# "[46/110] Building ...") and prints "LABEL 42% done, 0:12 elapsed, eta
# 0:17" each time the share passes a multiple of STEP percent (default 10),
# and "LABEL 42% done, 1:12 elapsed, still compiling" after QUIET seconds
# (default 20) without a line (one large file on a busy machine); the other
# lines of the build (compiler warnings and errors, make's errors) pass
# through as they are, the per-file lines do not. The ETA assumes the rest
# goes as fast as what is done.
build_progress() {
  local label=$1 step=${2:-10} quiet=${3:-20} t0=$SECONDS line part="" pct=0 p el next rc
  next=$step
  while :; do
    if IFS= read -r -t "$quiet" line; then
      line=$part$line part=""
    else
      rc=$?
      if [ "$rc" -gt 128 ]; then # no line for QUIET seconds: the partial one is kept
        part=$part$line
        printf '%s %3d%% done, %s elapsed, still compiling\n' "$label" "$pct" \
          "$(progress_clock $((SECONDS - t0)))"
        continue
      fi
      line=$part$line
      [ -n "$line" ] || break
      part="" # a last line without its newline, then the end
    fi
    if [[ $line =~ ^\[\ *([0-9]+)%\]\  ]]; then
      p=${BASH_REMATCH[1]}
    elif [[ $line =~ ^\[([0-9]+)/([0-9]+)\]\  ]]; then
      p=$((100 * BASH_REMATCH[1] / BASH_REMATCH[2]))
    elif [[ $line =~ ^(Scanning\ dependencies|Consolidate\ compiler\ generated) ]]; then
      continue
    else
      printf '%s\n' "$line"
      continue
    fi
    pct=$p
    [ "$pct" -ge "$next" ] || continue
    el=$((SECONDS - t0))
    printf '%s %3d%% done, %s elapsed, eta %s\n' "$label" "$pct" "$(progress_clock $el)" \
      "$(progress_clock $((el * (100 - pct) / pct)))"
    next=$(((pct / step + 1) * step))
  done
}
