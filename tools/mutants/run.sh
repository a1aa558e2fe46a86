#!/usr/bin/env bash
# Plants each bug of tools/mutants/manifest in turn (a small patch, applied with `git apply`),
# runs the tests that must catch it, reverts it, and prints a markdown table: caught (a
# selected test failed) or SURVIVED (they all passed).
#
#   tools/mutants/run.sh                  every mutant
#   tools/mutants/run.sh slot_kept_on_pause attempt_skips
#
# The patches are applied in a worktree of its own (target/mutants/tree, a clean checkout of
# the commit checked out here, HEAD), never in this checkout: whoever builds here meanwhile
# never builds a planted bug. Commit what you want tested. Builds go to
# target/mutants/target. Exits non-zero unless every run caught its mutant.
set -uo pipefail

root=$(git rev-parse --show-toplevel)
cd "$root"
manifest=$root/tools/mutants/manifest
patches=$root/tools/mutants
work=$root/target/mutants
tree=$work/tree
logs=$work/logs
export CARGO_TARGET_DIR=$work/target
mkdir -p "$logs"

# A clean checkout of HEAD to plant the bugs in.
head=$(git rev-parse HEAD)
if [ ! -d "$tree" ]; then
    git worktree add --detach "$tree" "$head" >/dev/null 2>&1 ||
        { echo "cannot create the worktree $tree" >&2; exit 2; }
fi
git -C "$tree" checkout --quiet --detach --force "$head"
git -C "$tree" reset --quiet --hard "$head"
git -C "$tree" clean --quiet -fd
# Patches and manifest as they are here (they may be newer than HEAD).

applied=""
revert() {
    if [ -n "$applied" ]; then
        git -C "$tree" apply -R "$patches/$applied.patch" ||
            git -C "$tree" checkout --quiet --force "$head"
        applied=""
    fi
}
trap revert EXIT
trap 'revert; exit 130' INT TERM

trim() { sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//' <<<"$1"; }

rows=()
failed=0
while IFS='|' read -r patch args filters; do
    patch=$(trim "$patch")
    case "$patch" in '' | \#*) continue ;; esac
    if [ $# -gt 0 ] && ! printf '%s\n' "$@" | grep -qx "$patch"; then
        continue
    fi
    args=$(trim "$args")
    filters=$(trim "$filters")
    file="$patches/$patch.patch"
    log="$logs/$patch.$(tr -c 'a-z0-9' '_' <<<"$args").log"
    started=$(date +%s)
    if [ ! -f "$file" ]; then
        result="not run: no $patch.patch"
    elif ! git -C "$tree" apply --check "$file" 2>"$log"; then
        result="not run: the patch no longer applies"
    else
        git -C "$tree" apply "$file"
        applied=$patch
        echo "== $patch: cargo test $args -- $filters" >&2
        # shellcheck disable=SC2086
        if ! (cd "$tree" && cargo test $args --no-run) >"$log" 2>&1; then
            result="not run: does not build"
        else
            # shellcheck disable=SC2086
            (cd "$tree" && cargo test $args -- $filters) >>"$log" 2>&1
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
done <"$manifest"

echo
echo "| mutant | tests that must catch it | result | time |"
echo "|---|---|---|---|"
printf '%s\n' "${rows[@]}"
exit $failed
