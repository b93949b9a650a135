# How scripts/gpu_check.sh splits its time: one budget for the whole script (a lent GPU
# machine runs one call for at most 600 s, and a session has 15 minutes of device time), the
# steps after the build sharing what the build leaves. Sourced; the caller sets STEPS (the
# steps that run) and DEADLINE (in bash's $SECONDS).

wants() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
share() {  # share STEP: the seconds of the budget left that STEP may use
  local rest=$(( DEADLINE - SECONDS - 15 ))  # the summary's own few seconds kept back
  [ "$rest" -lt 1 ] && rest=1
  case "$1" in
    tests) if wants bench || wants largest; then rest=$(( rest / 2 < 240 ? rest / 2 : 240 )); fi ;;
    bench) if wants largest; then rest=$(( rest / 2 )); fi; rest=${BENCH_BUDGET:-$rest} ;;
    largest) rest=${LARGEST_BUDGET:-$rest} ;;
  esac
  echo "$rest"
}
