# expect.sh — sourced by command-line tests: counts checks and failures. Needs $tmp (a scratch
# directory) set first.
#   fail MESSAGE...                      a failed check, printed
#   expect STATUS SUBSTRING COMMAND...   runs COMMAND; fails unless it exits STATUS and, when
#                                        SUBSTRING is not empty, prints it (standard error or out)
failures=0
checks=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
expect() {
  local want=$1 msg=$2
  shift 2
  checks=$((checks + 1))
  "$@" >"$tmp/out" 2>"$tmp/err"
  local got=$?
  [ "$got" = "$want" ] || {
    fail "$*: status $got, expected $want"
    sed 's/^/  | /' "$tmp/err" "$tmp/out" | tail -5
    return
  }
  [ -z "$msg" ] || cat "$tmp/err" "$tmp/out" | grep -qF -- "$msg" ||
    { fail "$*: no '$msg' in:"; sed 's/^/  | /' "$tmp/err" "$tmp/out" | tail -5; }
}
