#!/usr/bin/env bash
# Compares the public API of `cairn` (the package cairn-engine, all features) with the list
# kept in api/cairn.txt; `--update` rewrites the list instead. A change of the public API
# is deliberate when the same commit updates the list: review its diff like code.
#
# rustdoc's JSON output is unstable: RUSTC_BOOTSTRAP lets the pinned stable toolchain
# write it, and the list is made by tools/public_api.py with that same toolchain. It is
# given to rustdoc alone (tools/rustdoc-json.sh), so the dependencies' builds are the ones
# in target/ already: with it set for cargo, a cold CI built them all again (207 s).
# The whole workspace with its examples, as .ci/run's docs and clippy steps, resolves the
# dependencies' features as they did (`-p cairn-engine` alone checked 33 of them again);
# there cairn has all its features: postgres from cairn-bench, testing from its own tests.
set -euo pipefail
cd "$(dirname "$0")/.."
RUSTDOC="$PWD/tools/rustdoc-json.sh" RUSTDOCFLAGS="-Z unstable-options --output-format json" \
    cargo doc -q --workspace --no-deps --examples
now=$(mktemp)
trap 'rm -f "$now"' EXIT
python3 tools/public_api.py target/doc/cairn.json >"$now"
if [ "${1:-}" = "--update" ]; then
    cp "$now" api/cairn.txt
    echo "api/cairn.txt: $(wc -l <api/cairn.txt) public items"
    exit 0
fi
if ! diff -u api/cairn.txt "$now"; then
    echo "The public API of cairn changed (above: - removed, + added). If that is meant," >&2
    echo "run tools/public_api.sh --update and commit api/cairn.txt with the change." >&2
    exit 1
fi
echo "the public API of cairn matches api/cairn.txt ($(wc -l <"$now") items)"
