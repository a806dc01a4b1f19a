//! The bridge between the Rust runtime (tokio) and Python's asyncio: Rust futures as Python
//! awaitables, Python coroutines as Rust futures, and blocking calls that release the GIL.
//! A panic never unwinds into Python: it becomes a `PanickedError`.

use crate::dispatch::Stage;
use crate::errors;
use crate::interpreter::with_python;
use futures::FutureExt;
use pyo3::prelude::*;
use rsc_client::ClientError;
use rsc_client::foreign::{BatchVerdict, Verdict};
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;

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

/// What a handler's coroutine answered.
pub(crate) enum Answer {
    /// A single-message handler's verdict.
    Single(Verdict),
    /// A batch handler's verdicts.
    Batch(BatchVerdict),
}

/// Called by asyncio when a handler's task finished: reads its answer and sends it to the
/// waiting Rust future.
#[pyclass(module = "rsc._rsc", frozen)]
pub(crate) struct Completion {
    batch: bool,
    tx: Mutex<Option<oneshot::Sender<Answer>>>,
    /// The call's stage, set to finished (the task released) once answered.
    stage: Option<Arc<Mutex<Stage>>>,
}

impl Answer {
    /// A failure before the handler answered: retried as a handler's exception would be.
    pub(crate) fn failed(batch: bool, why: String) -> Self {
        if batch {
            Answer::Batch(BatchVerdict {
                all: Verdict::Retry(why),
                each: Vec::new(),
            })
        } else {
            Answer::Single(Verdict::Retry(why))
        }
    }
}

impl Completion {
    /// The completion of a call answering on `tx`.
    pub(crate) fn new(
        batch: bool,
        tx: oneshot::Sender<Answer>,
        stage: Option<Arc<Mutex<Stage>>>,
    ) -> Self {
        Completion {
            batch,
            tx: Mutex::new(Some(tx)),
            stage,
        }
    }

    /// Answers the call with a failure (the handler could not be called).
    pub(crate) fn fail(&self, why: String) {
        self.send(Answer::failed(self.batch, why));
    }

    fn send(&self, answer: Answer) {
        if let Some(tx) = self.tx.lock().ok().and_then(|mut t| t.take()) {
            let _ = tx.send(answer);
        }
        if let Some(stage) = &self.stage
            && let Ok(mut s) = stage.lock()
            && matches!(*s, Stage::Running(_))
        {
            *s = Stage::Finished;
        }
    }
}

#[pymethods]
impl Completion {
    fn __call__(&self, fut: &Bound<'_, PyAny>) {
        let answer = match fut.call_method0("result") {
            Ok(v) if self.batch => batch_verdict(&v).map(Answer::Batch),
            Ok(v) => verdict(&v).map(Answer::Single),
            Err(e) => Err(e),
        };
        self.send(answer.unwrap_or_else(|e| {
            Answer::failed(
                self.batch,
                format!("the handler's answer could not be read: {e}"),
            )
        }));
    }
}

/// A verdict as the Python wrapper returns it: `None` (handled) or
/// `(kind, seconds, message)` with kind `retry`, `retry_after` or `dead_letter`.
fn verdict(v: &Bound<'_, PyAny>) -> PyResult<Verdict> {
    if v.is_none() {
        return Ok(Verdict::Done);
    }
    let (kind, seconds, why): (String, f64, String) = v.extract()?;
    Ok(match kind.as_str() {
        "retry_after" if seconds.is_finite() && seconds >= 0.0 => {
            Verdict::RetryAfter(Duration::from_secs_f64(seconds), why)
        }
        "dead_letter" => Verdict::DeadLetter(why),
        _ => Verdict::Retry(why),
    })
}

/// A batch's verdicts as the Python wrapper returns them: `(all, [(entry_id, verdict)…])`.
fn batch_verdict(v: &Bound<'_, PyAny>) -> PyResult<BatchVerdict> {
    let (all, each): (Bound<'_, PyAny>, Vec<(String, Bound<'_, PyAny>)>) = v.extract()?;
    Ok(BatchVerdict {
        all: verdict(&all)?,
        each: each
            .into_iter()
            .map(|(id, v)| Ok((id, verdict(&v)?)))
            .collect::<PyResult<_>>()?,
    })
}
