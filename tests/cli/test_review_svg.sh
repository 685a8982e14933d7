#!/usr/bin/env bash
# test_review_svg.sh FFPLAN — `ffplan svg` and `ffplan hostfile` as a specification, run from the
# source root:
#  * for every shipped plan, `svg` and `svg --timeline` exit 0 and write well-formed XML with one
#    GPU box per rank (labelled rN), one box per stage with its layer range and TP degree, every
#    device type in the legend and, with --timeline, one forward and one backward block per stage
#    and drawn micro-batch (at most 32 micro-batches of at most 16 pipelines); the same plan gives
#    the same bytes, `-o -` gives the file's bytes, and where rsvg-convert is installed (Debian
#    package librsvg2-bin) the drawing renders to a PNG as wide as the SVG says;
#  * `hostfile` writes one line per rank in rank order that places the rank on its node and GPU
#    (openmpi: `rank N=HOST slot=GPU`; slurm: the node name), with # comments;
#  * bad usage and bad plans exit 2 and write nothing, not even over an existing file.
#
# Golden files, compared byte for byte. Updating them is deliberate: look at the new drawing in a
# browser (or rsvg-convert it and look), then, from the source root:
#   ffplan svg profiles/plans/tiny-asym.json -o tests/data/golden/tiny-asym.svg
#   ffplan svg profiles/plans/tiny-asym.json --timeline -o tests/data/golden/tiny-asym-timeline.svg
#   ffplan hostfile profiles/plans/tiny-asym.json -o - >tests/data/golden/tiny-asym.rankfile
#   ffplan hostfile profiles/plans/tiny-asym.json --format slurm -o - >tests/data/golden/tiny-asym.slurm
# (ffplan is build/planner/ffplan; the plan path is written into the hostfiles' comments, so use
# exactly this relative path.)
set -u
ffplan=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
checks=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
run() { "$@" >"$tmp/out" 2>"$tmp/err"; echo $?; }
have_rsvg=0
command -v rsvg-convert >/dev/null && have_rsvg=1
[ "$have_rsvg" = 1 ] || echo "note: rsvg-convert not found (Debian: librsvg2-bin); SVGs are not rendered"

# What a drawing of PLAN must contain; prints one line per problem.
check_content() { # plan svg timeline(0|1)
  python3 - "$@" <<'EOF'
import json, re, sys
plan_file, svg_file, timeline = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
plan = json.load(open(plan_file))
svg = open(svg_file, encoding="utf-8").read()
def count(cls):
    return len(re.findall(r'class="%s"' % cls, svg))
ranks = [r for p in plan["pipelines"] for s in p["stages"] for r in s["ranks"]]
stages = [s for p in plan["pipelines"] for s in p["stages"]]
n = len(ranks)
if not re.search(r'>plan [^<]*, %d ranks?, %d pipelines?<' % (n, len(plan["pipelines"])), svg):
    print("the title does not give %d ranks and %d pipelines" % (n, len(plan["pipelines"])))
if count("gpu") != n:
    print("%d GPU boxes for %d ranks" % (count("gpu"), n))
for r in ranks:
    if ">r%d<" % r["rank"] not in svg:
        print("no label r%d" % r["rank"])
if count("stage") != len(stages):
    print("%d stage boxes for %d stages" % (count("stage"), len(stages)))
for i, p in enumerate(plan["pipelines"]):
    if ">pipeline %d<" % i not in svg:
        print("no label pipeline %d" % i)
    for j, s in enumerate(p["stages"]):
        want = ">stage %d  TP %d<" % (j, len(s["ranks"]))
        if want not in svg:
            print("no stage label %s" % want)
        if "layers [%d,%d)" % tuple(s["layers"]) not in svg:
            print("no layer range [%d,%d) for pipeline %d stage %d" % (*s["layers"], i, j))
for d in plan["inputs"]["cluster"]["device_types"]:
    if not re.search(r'>%s  ' % re.escape(d["name"]), svg):
        print("device type %s is not in the legend" % d["name"])
if not re.search(r'>predicted: iteration [0-9.]+ s \| [0-9]+ tokens/s \| MFU [0-9.]+ %', svg):
    print("no predicted iteration time, tokens/s and MFU in the title")
shown = plan["pipelines"][:16]
ops = sum(len(p["stages"]) * min(p["micro_batches"], 32) for p in shown) if timeline else 0
for kind in ("op f", "op b"):
    if count(kind) != ops:
        print("%d blocks of class %s, expected %d" % (count(kind), kind, ops))
if timeline and "simulated schedule" not in svg:
    print("no schedule heading")
if timeline and any(p["micro_batches"] > 32 for p in shown) and "drawn: the first 32" not in svg:
    print("no caption for the micro-batches left out")
EOF
}

# Width of a PNG (from its IHDR chunk) and the width an SVG declares.
png_width() { python3 -c 'import struct,sys; d=open(sys.argv[1],"rb").read(24); print(struct.unpack(">I", d[16:20])[0] if d[:8]==b"\x89PNG\r\n\x1a\n" else -1)' "$1"; }
svg_width() { sed -n 's/^<svg [^>]* width="\([0-9]*\)".*/\1/p' "$1" | head -1; }

check_svg() { # plan timeline(0|1)
  local plan=$1 tl=$2 name opt=""
  name=$(basename "$plan" .json)
  [ "$tl" = 1 ] && opt=--timeline && name=$name-timeline
  checks=$((checks + 1))
  [ "$(run "$ffplan" svg "$plan" $opt -o "$tmp/$name.svg")" = 0 ] || { fail "svg $opt $plan"; cat "$tmp/err"; return; }
  checks=$((checks + 1))
  python3 -c "import xml.dom.minidom,sys; xml.dom.minidom.parse(sys.argv[1])" "$tmp/$name.svg" ||
    fail "svg $opt $plan is not well-formed XML"
  checks=$((checks + 1))
  check_content "$plan" "$tmp/$name.svg" "$tl" >"$tmp/problems"
  [ -s "$tmp/problems" ] && { fail "svg $opt $plan:"; sed 's/^/  | /' "$tmp/problems" | head -10; }
  checks=$((checks + 1))
  "$ffplan" svg "$plan" $opt -o "$tmp/again.svg" 2>/dev/null
  cmp -s "$tmp/$name.svg" "$tmp/again.svg" || fail "svg $opt $plan: two runs differ"
  checks=$((checks + 1))
  "$ffplan" svg "$plan" $opt -o - >"$tmp/stdout.svg" 2>/dev/null
  cmp -s "$tmp/$name.svg" "$tmp/stdout.svg" || fail "svg $opt $plan: -o - differs from the file"
  if [ "$have_rsvg" = 1 ]; then
    checks=$((checks + 1))
    if rsvg-convert "$tmp/$name.svg" -o "$tmp/$name.png" 2>"$tmp/err" && [ -s "$tmp/$name.png" ]; then
      [ "$(png_width "$tmp/$name.png")" = "$(svg_width "$tmp/$name.svg")" ] ||
        fail "svg $opt $plan renders $(png_width "$tmp/$name.png") px wide, the SVG says $(svg_width "$tmp/$name.svg")"
    else
      fail "rsvg-convert cannot render svg $opt $plan:"; head -5 "$tmp/err"
    fi
  fi
}

# ---- svg ----
for plan in profiles/plans/*.json; do
  check_svg "$plan" 0
  check_svg "$plan" 1
done
for g in tiny-asym tiny-asym-timeline; do
  checks=$((checks + 1))
  cmp -s "$tmp/$g.svg" "tests/data/golden/$g.svg" ||
    { fail "$g.svg differs from tests/data/golden/$g.svg:"; diff "tests/data/golden/$g.svg" "$tmp/$g.svg" | head -10; }
done

# Bad usage and bad plans: status 2 and nothing written.
sed 's/"gpu": 2,/"gpu": 99,/' profiles/plans/tiny-asym.json >"$tmp/bad-plan.json"
for args in "" "profiles/plans/tiny-asym.json" "profiles/plans/tiny-asym.json -o" \
  "profiles/plans/tiny-asym.json --frobnicate -o $tmp/x.svg" "$tmp/bad-plan.json -o $tmp/x.svg" \
  "$tmp/none.json -o $tmp/x.svg" "$tmp/bad-plan.json --timeline -o $tmp/x.svg"; do
  checks=$((checks + 1))
  # shellcheck disable=SC2086
  [ "$(run "$ffplan" svg $args)" = 2 ] || fail "svg $args: expected status 2"
  checks=$((checks + 1))
  [ -e "$tmp/x.svg" ] && { fail "svg $args wrote $tmp/x.svg"; rm -f "$tmp/x.svg"; }
done
grep -q "bad-plan.json" "$tmp/err" || fail "the error for a bad plan does not name the file"
echo "precious" >"$tmp/keep.svg"
checks=$((checks + 1))
"$ffplan" svg "$tmp/bad-plan.json" -o "$tmp/keep.svg" 2>/dev/null
[ "$(cat "$tmp/keep.svg")" = "precious" ] || fail "svg of a bad plan changed an existing output"
checks=$((checks + 1))
ls "$tmp" | grep -q '\.tmp\.' && fail "a temporary file was left behind"

# ---- hostfile ----
# The lines a plan's ranks should get, in rank order: "NODE GPU".
placements() {
  python3 -c 'import json,sys
p = json.load(open(sys.argv[1]))
for r in sorted((r for q in p["pipelines"] for s in q["stages"] for r in s["ranks"]), key=lambda r: r["rank"]):
    print(r["rank"], r["node"], r["gpu"])' "$1"
}
for plan in profiles/plans/*.json; do
  placements "$plan" >"$tmp/want"
  checks=$((checks + 1))
  [ "$(run "$ffplan" hostfile "$plan" -o "$tmp/rankfile")" = 0 ] || { fail "hostfile $plan"; cat "$tmp/err"; continue; }
  grep -q "mpirun -np $(wc -l <"$tmp/want") --rankfile $tmp/rankfile ffrun $plan" "$tmp/err" ||
    fail "hostfile $plan: no mpirun hint on stderr"
  checks=$((checks + 1))
  grep -v '^#' "$tmp/rankfile" >"$tmp/lines"
  awk '{printf "rank %s=%s slot=%s\n", $1, $2, $3}' "$tmp/want" | cmp -s - "$tmp/lines" ||
    { fail "hostfile $plan: rank lines do not place each rank, in order:"; head -5 "$tmp/lines"; }
  checks=$((checks + 1))
  [ "$(run "$ffplan" hostfile "$plan" --format slurm -o "$tmp/slurm")" = 0 ] || { fail "hostfile --format slurm $plan"; continue; }
  checks=$((checks + 1))
  grep -v '^#' "$tmp/slurm" >"$tmp/lines"
  awk '{print $2}' "$tmp/want" | cmp -s - "$tmp/lines" ||
    { fail "hostfile --format slurm $plan: not one node name per rank, in order"; head -5 "$tmp/lines"; }
  checks=$((checks + 1))
  grep -q "^#   srun --ntasks=$(wc -l <"$tmp/want") --distribution=arbitrary" "$tmp/slurm" ||
    fail "hostfile --format slurm $plan: no srun line"
done
checks=$((checks + 1))
"$ffplan" hostfile profiles/plans/tiny-asym.json -o - >"$tmp/rankfile" 2>/dev/null
cmp -s "$tmp/rankfile" tests/data/golden/tiny-asym.rankfile ||
  { fail "the rankfile differs from tests/data/golden/tiny-asym.rankfile:"; diff tests/data/golden/tiny-asym.rankfile "$tmp/rankfile" | head; }
checks=$((checks + 1))
"$ffplan" hostfile profiles/plans/tiny-asym.json --format slurm -o - >"$tmp/slurm" 2>/dev/null
cmp -s "$tmp/slurm" tests/data/golden/tiny-asym.slurm ||
  { fail "the slurm hostfile differs from tests/data/golden/tiny-asym.slurm:"; diff tests/data/golden/tiny-asym.slurm "$tmp/slurm" | head; }
for args in "" "profiles/plans/tiny-asym.json --format bogus -o $tmp/x.hosts" \
  "profiles/plans/tiny-asym.json --format" "profiles/plans/tiny-asym.json --bogus -o $tmp/x.hosts" \
  "profiles/plans/tiny-asym.json profiles/plans/tiny-1rank.json -o $tmp/x.hosts" \
  "$tmp/bad-plan.json -o $tmp/x.hosts" "$tmp/bad-plan.json --format slurm -o $tmp/x.hosts"; do
  checks=$((checks + 1))
  # shellcheck disable=SC2086
  [ "$(run "$ffplan" hostfile $args)" = 2 ] || fail "hostfile $args: expected status 2"
  checks=$((checks + 1))
  [ -e "$tmp/x.hosts" ] && { fail "hostfile $args wrote $tmp/x.hosts"; rm -f "$tmp/x.hosts"; }
done
checks=$((checks + 1))
"$ffplan" hostfile profiles/plans/tiny-asym.json --format bogus 2>&1 | grep -q "expected openmpi or slurm" ||
  fail "--format bogus does not say which formats there are"

echo "review-svg: $checks checks, $failures failed"
[ "$failures" -eq 0 ]
