//! Compile-time checks of `#[stream_listener]`: every misuse is a clear error (snapshots in
//! `ui/fail/*.stderr`; regenerate with `TRYBUILD=overwrite`), and correct uses compile.
//!
//! The correct uses (`ui/pass/*.rs`) are compiled into this test binary as modules rather than
//! by trybuild: trybuild builds (not just checks) a project with a pass case, which compiles
//! every dependency of the client a second time with code generation; with compile-fail cases
//! only it runs `cargo check`.

// The cases only show that the handlers compile and stay callable; their futures are dropped.
#[allow(clippy::let_underscore_future)]
#[path = "ui/pass/ergonomics.rs"]
mod ergonomics;
#[allow(clippy::let_underscore_future)]
#[path = "ui/pass/listeners.rs"]
mod listeners;

#[test]
fn correct_uses_compile_and_stay_plain_functions() {
    ergonomics::main();
    listeners::main();
}

#[test]
fn stream_listener_misuse_is_a_clear_compile_error() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/fail/*.rs");
}
