//! `cfg(cairn_test_wrangler)` and `cfg(cairn_test_cf_python)` when `CAIRN_TEST_WRANGLER` and
//! `CAIRN_TEST_CF_PYTHON` are set at build time: the compatibility tests that drive Cairn
//! with those tools are ignored otherwise, so the summary shows them as not run, with the
//! reason (a skip must never be counted as a pass).

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
}
