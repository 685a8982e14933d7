# tests/metrics.sh — sourced by the test and benchmark scripts: they read a run's metrics through
# `ffplan metrics` (the strict reader: a bad line stops them, naming FILE:LINE), never as raw
# JSON. Set $ffplan to the ffplan binary before calling these.

# losses_compare A B TOL: the per-step losses of two runs agree to relative TOL, as many steps, at
# least one, each finite. Prints "N steps, worst rel loss difference W (tolerance TOL), final X vs
# Y"; exit status 0 when they agree, 1 otherwise.
losses_compare() {
  local f a b
  for f in "$1" "$2"; do
    [ -s "$f" ] ||
      { echo "no metrics: $f was not written (see the .err/.log beside it)"; return 1; }
  done
  a=$("$ffplan" metrics "$1" --get loss 2>&1) || { echo "$a"; return 1; }
  b=$("$ffplan" metrics "$2" --get loss 2>&1) || { echo "$b"; return 1; }
  paste <(echo "$a") <(echo "$b") | awk -F '\t' -v tol="$3" '
    NF != 2 || $1 == "" || $2 == "" || $1 == "null" || $2 == "null" { bad = 1 }
    {
      d = $1 - $2; d = d < 0 ? -d : d; m = $1 < 0 ? -$1 : $1
      w = m > 0 ? d / m : (d > 0 ? 1e300 : 0)
      if (w > worst) worst = w
      x = $1; y = $2; n++
    }
    END {
      printf "%d steps, worst rel loss difference %.2e (tolerance %g), final %.4f vs %.4f\n",
             n, worst, tol, x, y
      exit bad || !n || worst > tol + 0
    }'
}

# metrics_last FILE KEY: the key's value at the run's last step.
metrics_last() {
  "$ffplan" metrics "$1" --get "$2" | tail -1
}
