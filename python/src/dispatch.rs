//! Handler calls from the tokio threads to the asyncio loop's thread, in bulk.
//!
//! A message for a Python handler is queued as Rust data; the loop's thread converts it,
//! calls the handler and runs its coroutine as a task of the loop. The tokio threads take
//! neither the GIL nor a Python object for a message: when the queue was empty they wake the
//! loop with one byte on a socket the loop watches (`add_reader`), so a burst of messages
//! costs one wake-up and one pass of the loop, and the GIL stays with the loop's thread
//! instead of going back and forth (docs/BENCHMARKS.md, PY4). A loop without `add_reader`
//! is woken by `call_soon_threadsafe` instead.

use crate::interpreter::with_python;
use crate::message::Message;
use futures::future::BoxFuture;
use pyo3::prelude::*;
use pyo3::types::PyList;
use rsc_client::foreign::{BatchVerdict, ForeignMessage, Verdict};
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;

/// What a handler is called with.
pub(crate) enum Input {
    /// One message (a single-message handler).
    One(Box<ForeignMessage>),
    /// A batch of messages (a batch handler).
    Many(Vec<ForeignMessage>),
}

/// Where a call's coroutine is.
pub(crate) enum Stage {
    /// Queued, not called yet.
    Queued,
    /// Running as this asyncio task.
    Running(Py<PyAny>),
    /// Given up by the Rust side before it started: never called.
    Dropped,
    /// Answered.
    Finished,
}

/// One queued handler call.
struct Call {
    handler: Arc<Py<PyAny>>,
    input: Input,
    tx: oneshot::Sender<Answer>,
    stage: Arc<Mutex<Stage>>,
}

/// What the tokio threads and the loop's thread share.
struct Shared {
    /// Calls not started yet.
    queue: Mutex<Vec<Call>>,
    /// A wake-up is on its way to the loop (set by the first call queued after a drain).
    armed: AtomicBool,
    /// The loop watches `read` (else wake-ups go through `call_soon_threadsafe`).
    by_fd: AtomicBool,
    read: UnixStream,
    write: UnixStream,
    /// The asyncio loop handlers run on (`None`: an app built only to be checked).
    event_loop: Option<Py<PyAny>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Queues handler calls for one asyncio loop.
#[derive(Clone)]
pub(crate) struct Dispatcher(Arc<Shared>);

impl Dispatcher {
    /// A dispatcher to `event_loop`, watched by it from now on; call on the loop's thread.
    /// With `None`, calls are never made (an app built to read its member ids).
    pub(crate) fn new(py: Python<'_>, event_loop: Option<Py<PyAny>>) -> PyResult<Self> {
        let (read, write) = UnixStream::pair()?;
        read.set_nonblocking(true)?;
        write.set_nonblocking(true)?;
        let d = Dispatcher(Arc::new(Shared {
            queue: Mutex::new(Vec::new()),
            armed: AtomicBool::new(false),
            by_fd: AtomicBool::new(false),
            read,
            write,
            event_loop,
        }));
        if let Some(l) = &d.0.event_loop {
            let drain = Py::new(py, Drain(d.0.clone()))?;
            // A loop without `add_reader` (e.g. Windows' proactor) gets call_soon_threadsafe.
            if l.call_method1(py, "add_reader", (d.0.read.as_raw_fd(), drain))
                .is_ok()
            {
                d.0.by_fd.store(true, Ordering::Release);
            }
        }
        Ok(d)
    }

    /// A callable for the app's awaitable's `add_done_callback`: closes the dispatcher.
    pub(crate) fn detach(&self, py: Python<'_>) -> PyResult<Py<Detach>> {
        Py::new(py, Detach(self.0.clone()))
    }

    /// The loop stops watching the dispatcher's socket (the app ended); queued calls are
    /// dropped. Call on the loop's thread.
    pub(crate) fn close(&self, py: Python<'_>) {
        close(py, &self.0);
    }

    /// Queues a call of `handler` with `input` (from any thread, without the GIL) and returns
    /// the future of its answer; dropping the future cancels the call (its task, once
    /// started).
    pub(crate) fn submit(
        &self,
        handler: Arc<Py<PyAny>>,
        input: Input,
        batch: bool,
    ) -> BoxFuture<'static, Answer> {
        let (tx, rx) = oneshot::channel();
        let stage = Arc::new(Mutex::new(Stage::Queued));
        lock(&self.0.queue).push(Call {
            handler,
            input,
            tx,
            stage: stage.clone(),
        });
        wake(&self.0);
        let shared = self.0.clone();
        Box::pin(async move {
            let mut guard = Abandon(Some((shared, stage)));
            let answer = rx.await;
            guard.0 = None;
            answer.unwrap_or_else(|_| {
                Answer::failed(
                    batch,
                    "the handler's task ended without an answer (its event loop stopped?)".into(),
                )
            })
        })
    }
}

/// Tells the loop that calls are queued, unless a wake-up is already on its way.
fn wake(s: &Arc<Shared>) {
    if s.armed.swap(true, Ordering::AcqRel) {
        return;
    }
    if s.by_fd.load(Ordering::Acquire) {
        // A full socket already holds a wake-up.
        match (&s.write).write(&[1]) {
            Ok(_) => return,
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(_) => {}
        }
    }
    let Some(event_loop) = &s.event_loop else {
        return;
    };
    let _ = with_python(|py| -> PyResult<()> {
        let drain = Py::new(py, Drain(s.clone()))?;
        event_loop.call_method1(py, "call_soon_threadsafe", (drain,))?;
        Ok(())
    });
}

/// The loop's side: starts every queued call (`add_reader`'s callback).
#[pyclass(module = "rsc._rsc", frozen)]
pub(crate) struct Drain(Arc<Shared>);

#[pymethods]
impl Drain {
    fn __call__(&self, py: Python<'_>) {
        let s = &self.0;
        let mut buf = [0u8; 64];
        while let Ok(n) = (&s.read).read(&mut buf) {
            if n < buf.len() {
                break;
            }
        }
        // Cleared before the queue is taken: a call queued after this point wakes us again.
        s.armed.store(false, Ordering::Release);
        let calls = std::mem::take(&mut *lock(&s.queue));
        let Some(event_loop) = &s.event_loop else {
            return;
        };
        for call in calls {
            start(py, event_loop.bind(py), call);
        }
    }
}

/// Converts a call's input, calls the handler and runs the coroutine as a task.
fn start(py: Python<'_>, event_loop: &Bound<'_, PyAny>, call: Call) {
    if matches!(*lock(&call.stage), Stage::Dropped) {
        return;
    }
    let batch = matches!(call.input, Input::Many(_));
    let done = Completion::new(batch, call.tx, Some(call.stage.clone()));
    let started = (|| -> PyResult<Bound<'_, PyAny>> {
        let arg = match call.input {
            Input::One(m) => Py::new(py, Message::new(py, *m)?)?.into_any(),
            Input::Many(ms) => {
                let msgs = ms
                    .into_iter()
                    .map(|m| Py::new(py, Message::new(py, m)?))
                    .collect::<PyResult<Vec<_>>>()?;
                PyList::new(py, msgs)?.into_any().unbind()
            }
        };
        let coro = call.handler.bind(py).call1((arg,))?;
        event_loop.call_method1("create_task", (coro,))
    })();
    let task = match started {
        Ok(task) => task,
        Err(e) => {
            done.fail(format!("the handler could not be called: {e}"));
            return;
        }
    };
    let mut stage = lock(&call.stage);
    if matches!(*stage, Stage::Dropped) {
        // Given up while the handler was being called.
        let _ = task.call_method0("cancel");
        return;
    }
    if matches!(*stage, Stage::Queued) {
        *stage = Stage::Running(task.clone().unbind());
    }
    drop(stage);
    if let Err(e) = task.call_method1("add_done_callback", (done,)) {
        log::warn!(target: "rsc", "a handler's task could not be watched: {e}");
    }
}

/// The loop stops watching the dispatcher's socket (the app ended); queued calls are dropped.
#[pyclass(module = "rsc._rsc", frozen)]
pub(crate) struct Detach(Arc<Shared>);

#[pymethods]
impl Detach {
    fn __call__(&self, py: Python<'_>, _fut: &Bound<'_, PyAny>) {
        close(py, &self.0);
    }
}

fn close(py: Python<'_>, s: &Shared) {
    if let Some(l) = &s.event_loop
        && s.by_fd.swap(false, Ordering::AcqRel)
    {
        let _ = l.call_method1(py, "remove_reader", (s.read.as_raw_fd(),));
    }
    lock(&s.queue).clear();
}

/// Cancels a call whose Rust future was dropped before it answered (a revocation's deadline,
/// a shutdown): never started if still queued, else its task is cancelled on its loop.
struct Abandon(Option<(Arc<Shared>, Arc<Mutex<Stage>>)>);

impl Drop for Abandon {
    fn drop(&mut self) {
        let Some((shared, stage)) = self.0.take() else {
            return;
        };
        let task = match std::mem::replace(&mut *lock(&stage), Stage::Dropped) {
            Stage::Running(task) => task,
            _ => return,
        };
        if let Some(event_loop) = &shared.event_loop {
            let _ = with_python(|py| {
                let cancel = task.getattr(py, "cancel")?;
                event_loop.call_method1(py, "call_soon_threadsafe", (cancel,))
            });
        }
    }
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
