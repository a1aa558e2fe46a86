//! `cfg(cairn_test_pg)` when `CAIRN_TEST_PG_URL` names a PostgreSQL server at build time:
//! the tests that need one are built only then, and otherwise a test named for them shows
//! as ignored in the summary, with the reason (a skip must never be counted as a pass).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(cairn_test_pg)");
    println!("cargo::rerun-if-env-changed=CAIRN_TEST_PG_URL");
    if std::env::var("CAIRN_TEST_PG_URL").is_ok_and(|url| !url.is_empty()) {
        println!("cargo::rustc-cfg=cairn_test_pg");
    }
}
