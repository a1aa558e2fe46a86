//! `cfg(cairn_test_wrangler)` and `cfg(cairn_test_cf_python)` when `CAIRN_TEST_WRANGLER` and
//! `CAIRN_TEST_CF_PYTHON` are set at build time, and `cfg(cairn_test_chromium)` when
//! `CAIRN_TEST_CHROMEDRIVER` is set or a `chromedriver` is on the `PATH`: the tests that
//! drive Cairn with those tools are ignored otherwise, so the summary shows them as not
//! run, with the reason (a skip must never be counted as a pass).

use std::path::Path;

fn main() {
    for (var, cfg) in [
        ("CAIRN_TEST_WRANGLER", "cairn_test_wrangler"),
        ("CAIRN_TEST_CF_PYTHON", "cairn_test_cf_python"),
    ] {
        println!("cargo::rustc-check-cfg=cfg({cfg})");
        println!("cargo::rerun-if-env-changed={var}");
        if std::env::var_os(var).is_some_and(|v| !v.is_empty()) {
            println!("cargo::rustc-cfg={cfg}");
        }
    }
    println!("cargo::rustc-check-cfg=cfg(cairn_test_chromium)");
    println!("cargo::rerun-if-env-changed=CAIRN_TEST_CHROMEDRIVER");
    println!("cargo::rerun-if-env-changed=PATH");
    let named = std::env::var_os("CAIRN_TEST_CHROMEDRIVER").is_some_and(|v| !v.is_empty());
    let on_path = std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| Path::new(&dir).join("chromedriver").is_file())
    });
    if named || on_path {
        println!("cargo::rustc-cfg=cairn_test_chromium");
    }
}
