# Shared by the set-up scripts (source it after setting STEP_NAME, LOGS and LOG_PREFIX):
#   say <text>                        "<STEP_NAME>: <text>"
#   fail <what went wrong> <fix>      says both, exits 1
#   run_step <name> <fix> <command>   runs the command with its output in
#                                     $LOGS/<LOG_PREFIX><name>.log; on failure prints the
#                                     command, the log's last lines and the fix, exits 1
mkdir -p "$LOGS"

say() { echo "$STEP_NAME: $*"; }

fail() {
  say "FAILED: $1"
  say "fix: $2"
  exit 1
}

run_step() {
  local name="$1" hint="$2"
  shift 2
  local log="$LOGS/${LOG_PREFIX:-}$name.log"
  if ! "$@" > "$log" 2>&1; then
    say "FAILED: step '$name': $*"
    say "last lines of $log:"
    tail -n 40 "$log" | sed 's/^/    /'
    fail "step '$name' exited non-zero" "$hint"
  fi
}
