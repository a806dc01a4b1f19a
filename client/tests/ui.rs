//! Compile-time checks of `#[stream_listener]`: every misuse is a clear error (snapshots in
//! `ui/fail/*.stderr`; regenerate with `TRYBUILD=overwrite`), and correct uses compile.

#[test]
fn stream_listener_misuse_is_a_clear_compile_error() {
    let t = trybuild::TestCases::new();
    t.pass("tests/ui/pass/*.rs");
    t.compile_fail("tests/ui/fail/*.rs");
}
