//! When threads of the Rust runtime may call into Python: not once the interpreter exits.

use pyo3::prelude::*;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

/// Whether threads of the Rust runtime may still call into Python: cleared when the
/// interpreter starts to exit (`atexit`). A tokio thread inside Python while the main thread
/// finalizes the interpreter would crash the process, so the exit also waits for those
/// inside ([`INSIDE`]) to leave.
static PYTHON_ALIVE: AtomicBool = AtomicBool::new(true);

/// Threads of the Rust runtime inside [`with_python`] now.
static INSIDE: AtomicUsize = AtomicUsize::new(0);

/// Runs `f` with the GIL from a thread of the Rust runtime, unless the interpreter is
/// exiting (`None` then).
pub(crate) fn with_python<R>(f: impl for<'py> FnOnce(Python<'py>) -> R) -> Option<R> {
    if !PYTHON_ALIVE.load(Ordering::Acquire) {
        return None;
    }
    INSIDE.fetch_add(1, Ordering::AcqRel);
    let out = if PYTHON_ALIVE.load(Ordering::Acquire) {
        Python::try_attach(f)
    } else {
        None
    };
    INSIDE.fetch_sub(1, Ordering::AcqRel);
    out
}

/// Whether the interpreter is still running (not exiting).
pub(crate) fn python_alive() -> bool {
    PYTHON_ALIVE.load(Ordering::Acquire)
}

/// Registered with `atexit`: from now on the Rust runtime's threads leave Python alone; waits
/// (the GIL released, at most 5 s) for those inside to leave.
#[pyfunction]
pub(crate) fn _interpreter_exiting(py: Python<'_>) {
    PYTHON_ALIVE.store(false, Ordering::Release);
    py.detach(|| {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while INSIDE.load(Ordering::Acquire) > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    });
}
