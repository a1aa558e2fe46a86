#!/usr/bin/env bash
# rustdoc with its unstable options allowed (RUSTC_BOOTSTRAP), for tools/public_api.sh.
# Set for rustdoc alone, not for cargo: build scripts that look at RUSTC_BOOTSTRAP
# (proc-macro2's) would otherwise build differently, and with them nearly every dependency
# again, apart from the builds `cargo doc` and the tests already made.
RUSTC_BOOTSTRAP=1 exec rustdoc "$@"
