#!/usr/bin/env bash
# Plants each bug of tools/mutants/manifest in turn (a small patch, applied with `git apply`
# to files without uncommitted changes), runs the tests that must catch it, reverts it, and
# prints a markdown table: caught (a selected test failed) or SURVIVED (they all passed).
#
#   tools/mutants/run.sh                  every mutant
#   tools/mutants/run.sh slot_kept_on_pause attempt_skips
#
# Builds go to target/mutants (CARGO_TARGET_DIR overrides), so a mutant never lands in the
# build the rest of the work uses. Exits non-zero unless every run caught its mutant.
set -uo pipefail

root=$(git rev-parse --show-toplevel)
cd "$root"
dir=tools/mutants
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target/mutants}
logs=$CARGO_TARGET_DIR/mutant-logs
mkdir -p "$logs"

applied=""
revert() {
    if [ -n "$applied" ]; then
        git apply -R "$dir/$applied.patch" || echo "!! could not revert $applied: revert it by hand" >&2
        applied=""
    fi
}
trap revert EXIT
trap 'revert; exit 130' INT TERM

rows=()
failed=0
while IFS='|' read -r patch args filters; do
    patch=$(echo "$patch" | xargs)
    [ -z "$patch" ] && continue
    case "$patch" in \#*) continue ;; esac
    if [ $# -gt 0 ] && ! printf '%s\n' "$@" | grep -qx "$patch"; then
        continue
    fi
    args=$(echo "$args" | xargs)
    filters=$(echo "$filters" | xargs)
    file="$dir/$patch.patch"
    log="$logs/$patch.$(echo "$args" | tr -c 'a-z0-9' '_').log"
    started=$(date +%s)
    touched=$(git apply --numstat "$file" | cut -f3)
    if ! git diff --quiet HEAD -- $touched; then
        result="not run: $touched has uncommitted changes"
    elif ! git apply --check "$file" 2>"$log"; then
        result="not run: the patch no longer applies"
    else
        git apply "$file"
        applied=$patch
        echo "== $patch: cargo test $args -- $filters" >&2
        # shellcheck disable=SC2086
        if ! cargo test $args --no-run >"$log" 2>&1; then
            result="not run: does not build"
        else
            # shellcheck disable=SC2086
            cargo test $args -- $filters >>"$log" 2>&1
            code=$?
            ran=$(grep -Eo '^test result: [A-Za-z]+\. [0-9]+ passed; [0-9]+ failed' "$log" |
                awk '{ n += $4 + $6 } END { print n + 0 }')
            if [ "$ran" -eq 0 ]; then
                result="not run: no test matched"
            elif [ $code -ne 0 ]; then
                result="caught"
            else
                result="SURVIVED"
            fi
        fi
        revert
    fi
    [ "$result" = caught ] || failed=1
    took=$(($(date +%s) - started))
    rows+=("| \`$patch\` | \`$filters\` | $result | ${took}s |")
    echo "== $patch: $result (${took}s, log: $log)" >&2
done <"$dir/manifest"

echo
echo "| mutant | tests that must catch it | result | time |"
echo "|---|---|---|---|"
printf '%s\n' "${rows[@]}"
exit $failed
