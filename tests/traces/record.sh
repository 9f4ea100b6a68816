#!/usr/bin/env bash
# Re-record the trace corpus on this host (root, perf and a C compiler):
#   tests/traces/record.sh [USERMM]
# The C programs are built into /tmp/usermm-corpus (where the corpus test
# builds them again to replay them: a trace names the files it maps).
# Each program runs with a clean environment; its trace lands here as
# NAME.trace.gz, and a line per program gives the native run time, the
# recording's time and the replay's speed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
usermm="${1:-$root/target/release/usermm}"
build=/tmp/usermm-corpus
mkdir -p "$build"
for p in mm_mix threads allocator pft fork_large lookup; do
    cc -O1 -pthread -o "$build/$p" "$root/crates/usermm-cli/tests/programs/$p.c"
done
src="$build/hello.c"
printf '#include <stdio.h>\nint main(void) { puts("hello"); return 0; }\n' > "$src"
record() {
    local name="$1"; shift
    local t0 t1 t2
    t0=$(date +%s%N)
    (cd "$build" && env -i PATH=/usr/bin:/bin "$@" >/dev/null)
    t1=$(date +%s%N)
    (cd "$build" && "$usermm" trace record --clean-env -o "$here/$name.trace.gz" -- "$@" >/dev/null)
    t2=$(date +%s%N)
    local speed
    speed=$({ "$usermm" trace replay --json "$here/$name.trace.gz" || true; } \
        | sed -n 's/.*"events":\([0-9]*\),"seconds":\([0-9.e-]*\).*/\1 \2/p' \
        | awk '{ printf "%.2f", $1 / $2 / 1e6 }')
    printf '%-12s native %6.1f ms  recorded %7.1f ms  replay %s M events/s\n' \
        "$name" "$(( (t1 - t0) / 1000 ))e-3" "$(( (t2 - t1) / 1000 ))e-3" "$speed"
}
for p in mm_mix threads allocator pft fork_large lookup; do
    record "$p" "$build/$p"
done
# The fork of a large process again, with 64 KiB mTHPs (the host's knob
# set for the recording and put back; the trace carries the settings).
knob=/sys/kernel/mm/transparent_hugepage/hugepages-64kB/enabled
old=$(sed 's/.*\[\(.*\)\].*/\1/' "$knob")
echo always > "$knob"
trap 'echo "$old" > "$knob"' EXIT
record fork_mthp "$build/fork_large"
echo "$old" > "$knob"
trap - EXIT
record pipeline /bin/sh -c 'ls /usr | wc -l'
record python python3 -c 'x = [i * 2 for i in range(200000)]; y = sorted(x)'
record cc cc -c -o "$build/hello.o" "$src"
