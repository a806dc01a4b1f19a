//! The bridge between the Rust runtime (tokio) and Python's asyncio: Rust futures as Python
//! awaitables and blocking calls that release the GIL (handlers' coroutines go the other way
//! through `dispatch`).
//! A panic never unwinds into Python: it becomes a `PanickedError`.

use crate::errors;
use crate::interpreter::with_python;
use futures::FutureExt;
use pyo3::prelude::*;
use rsc_client::ClientError;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Mutex;

/// The process's tokio runtime (multi-threaded, started on first use): every consumer app
/// and producer of the process runs on it.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .thread_name("rsc-runtime")
            .build()
            .expect("the tokio runtime starts (threads could not be created)")
    })
}

/// `fut` run to completion with its error converted and any panic caught.
async fn guarded<T>(fut: impl Future<Output = Result<T, ClientError>>) -> PyResult<T> {
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(errors::to_py(e)),
        Err(panic) => Err(errors::panicked(panic.as_ref())),
    }
}

/// A Python awaitable (an asyncio future of the running loop) of a Rust future run on the
/// tokio runtime; call it on the loop's thread. With `abort_on_cancel`, cancelling the
/// awaitable drops the Rust future.
pub(crate) fn into_awaitable<'py, T, F>(
    py: Python<'py>,
    fut: F,
    abort_on_cancel: bool,
) -> PyResult<Bound<'py, PyAny>>
where
    F: Future<Output = Result<T, ClientError>> + Send + 'static,
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let event_loop = py.import("asyncio")?.call_method0("get_running_loop")?;
    let awaitable = event_loop.call_method0("create_future")?;
    let (target, event_loop) = (awaitable.clone().unbind(), event_loop.unbind());
    let task = runtime().spawn(async move {
        let result = guarded(fut).await;
        with_python(move |py| {
            let value = result.and_then(|v| pyo3::IntoPyObjectExt::into_py_any(v, py));
            let resolve = Resolve(Mutex::new(Some(value)));
            // A closed loop refuses: nobody waits any more.
            let _ = event_loop.call_method1(py, "call_soon_threadsafe", (resolve, target));
        });
    });
    if abort_on_cancel {
        let abort = AbortOnCancel(task.abort_handle());
        awaitable.call_method1("add_done_callback", (abort,))?;
    }
    Ok(awaitable)
}

/// Sets an asyncio future's result or exception, on its loop (unless it was cancelled).
#[pyclass(module = "rsc._rsc", frozen)]
pub(crate) struct Resolve(Mutex<Option<PyResult<Py<PyAny>>>>);

#[pymethods]
impl Resolve {
    fn __call__(&self, fut: &Bound<'_, PyAny>) -> PyResult<()> {
        if fut.call_method0("done")?.is_truthy()? {
            return Ok(());
        }
        match self.0.lock().ok().and_then(|mut v| v.take()) {
            Some(Ok(v)) => fut.call_method1("set_result", (v,)).map(drop),
            Some(Err(e)) => fut
                .call_method1("set_exception", (e.into_value(fut.py()),))
                .map(drop),
            None => Ok(()),
        }
    }
}

/// Drops the Rust future when its awaitable was cancelled.
#[pyclass(module = "rsc._rsc", frozen)]
pub(crate) struct AbortOnCancel(tokio::task::AbortHandle);

#[pymethods]
impl AbortOnCancel {
    fn __call__(&self, fut: &Bound<'_, PyAny>) -> PyResult<()> {
        if fut.call_method0("cancelled")?.is_truthy()? {
            self.0.abort();
        }
        Ok(())
    }
}

/// Runs a Rust future to completion on the tokio runtime, the GIL released meanwhile.
pub(crate) fn block_on<T: Send, F>(py: Python<'_>, fut: F) -> PyResult<T>
where
    F: Future<Output = Result<T, ClientError>> + Send,
{
    py.detach(|| {
        std::panic::catch_unwind(AssertUnwindSafe(|| runtime().block_on(guarded(fut))))
            .unwrap_or_else(|panic| Err(errors::panicked(panic.as_ref())))
    })
}
