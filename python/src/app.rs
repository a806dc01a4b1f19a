//! `rsc._rsc.ConsumerApp`: the Rust consumer app, with handlers that are Python coroutines
//! awaited on the caller's asyncio loop (the `rsc` package wraps plain functions in a thread
//! pool). Every protocol rule stays in `rsc-client`; this module converts and calls.

use crate::dispatch::{Answer, Dispatcher, Input};
use crate::interpreter::with_python;
use crate::message::Rebalance;
use crate::options::{Conn, Opts, apply_conn};
use crate::runtime::{block_on, into_awaitable, runtime};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use rsc_client::foreign::{
    BatchVerdict, ForeignBatchHandler, ForeignCallback, ForeignHandler, ForeignMessage,
    ListenerSpec,
};
use rsc_client::{AppHandle, ConsumerAppBuilder};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The app's own options (beside the connection's); unset keeps the environment's value.
#[derive(Default)]
struct AppOpts {
    conn: Conn,
    instance_id: Option<String>,
    static_instance_id: Option<String>,
    shutdown_timeout: Option<Duration>,
    data_redis_grace: Option<Duration>,
    heartbeat_batching: Option<bool>,
    shared_reader: Option<bool>,
    wake_channel: Option<bool>,
    health_listen: Option<std::net::SocketAddr>,
}

impl AppOpts {
    fn take(o: &Opts<'_>) -> PyResult<Self> {
        let health_listen = match o.take::<String>("health_listen")? {
            Some(a) => Some(a.parse().map_err(|e| {
                PyValueError::new_err(format!("health_listen {a:?}: {e} (expected HOST:PORT)"))
            })?),
            None => None,
        };
        Ok(AppOpts {
            conn: Conn::take(o)?,
            instance_id: o.take("instance_id")?,
            static_instance_id: o.take("static_instance_id")?,
            shutdown_timeout: o.seconds("shutdown_timeout")?,
            data_redis_grace: o.seconds("data_redis_grace")?,
            heartbeat_batching: o.take("heartbeat_batching")?,
            shared_reader: o.take("shared_reader")?,
            wake_channel: o.take("wake_channel")?,
            health_listen,
        })
    }

    /// A builder from the environment, with these options over it.
    fn builder(&self) -> PyResult<ConsumerAppBuilder> {
        let mut b = apply_conn!(ConsumerAppBuilder::from_env(), &self.conn);
        if let Some(id) = &self.instance_id {
            b = b.instance_id(id);
        }
        if let Some(id) = &self.static_instance_id {
            b = b.static_instance_id(id);
        }
        if let Some(d) = self.shutdown_timeout {
            b = b.shutdown_timeout(d);
        }
        if let Some(d) = self.data_redis_grace {
            b = b.data_redis_grace(d);
        }
        if let Some(on) = self.heartbeat_batching {
            b = b.heartbeat_batching(on);
        }
        if let Some(on) = self.shared_reader {
            b = b.shared_reader(on);
        }
        if let Some(on) = self.wake_channel {
            b = b.wake_channel(on);
        }
        if let Some(addr) = self.health_listen {
            b = b.ops(addr);
        }
        Ok(b)
    }
}

/// One listener as registered: its settings and its Python handler.
struct Registered {
    spec: ListenerSpec,
    handler: Py<PyAny>,
    batch: bool,
}

/// The app: options, listeners, and once running, the handle that stops it.
#[pyclass(module = "rsc._rsc", frozen)]
pub(crate) struct ConsumerApp {
    opts: AppOpts,
    listeners: Mutex<Vec<Registered>>,
    handle: Mutex<Option<AppHandle>>,
    /// A shutdown asked for before the app ran.
    stopped_early: std::sync::atomic::AtomicBool,
}

/// A listener's settings from keyword arguments.
fn listener_spec(group: String, stream: String, o: &Opts<'_>) -> PyResult<ListenerSpec> {
    let mut spec = ListenerSpec::new(group, stream);
    spec.name = o.take("name")?;
    spec.concurrency = o.take("concurrency")?;
    spec.key_concurrency = o.take("key_concurrency")?;
    spec.max_retries = o.take("max_retries")?;
    if let Some((min, max)) = o.take::<(f64, f64)>("retry_backoff")? {
        let ok = |s: f64| s.is_finite() && s >= 0.0;
        if !ok(min) || !ok(max) {
            return Err(PyValueError::new_err(
                "retry_backoff: (first delay, cap) in seconds, finite and >= 0",
            ));
        }
        spec.retry_backoff = Some((Duration::from_secs_f64(min), Duration::from_secs_f64(max)));
    }
    spec.manual_ack = match o.take::<String>("ack")?.as_deref() {
        None | Some("auto") => false,
        Some("manual") => true,
        Some(other) => {
            return Err(PyValueError::new_err(format!(
                "ack={other:?}: expected \"auto\" or \"manual\""
            )));
        }
    };
    spec.max_batch = o.take("max_batch")?;
    spec.linger = o.seconds("linger")?;
    spec.batch_size = o.take("batch_size")?;
    spec.block_timeout = o.seconds("block_timeout")?;
    spec.drain_grace = o.seconds("drain_grace")?;
    spec.on_assigned = o.take::<Py<PyAny>>("on_assigned")?.map(callback);
    spec.on_revoked = o.take::<Py<PyAny>>("on_revoked")?.map(callback);
    Ok(spec)
}

/// A rebalance callback calling a Python function (its exception is logged, not raised).
fn callback(f: Py<PyAny>) -> ForeignCallback {
    Arc::new(move |r: &rsc_client::Rebalance| {
        let called = with_python(|py| f.call1(py, (Rebalance::of(r),)).map(drop));
        if let Some(Err(e)) = called {
            log::warn!(target: "rsc", "rebalance callback of group {} failed: {e}", r.group);
        }
    })
}

/// The foreign handler of a Python single-message handler: calls go through `dispatcher`.
fn single(handler: Py<PyAny>, dispatcher: Dispatcher) -> ForeignHandler {
    let handler = Arc::new(handler);
    Arc::new(move |m: ForeignMessage| {
        let answer = dispatcher.submit(handler.clone(), Input::One(Box::new(m)), false);
        Box::pin(async move {
            match answer.await {
                Answer::Single(v) => v,
                Answer::Batch(b) => b.all,
            }
        })
    })
}

/// The foreign handler of a Python batch handler: calls go through `dispatcher`.
fn batch(handler: Py<PyAny>, dispatcher: Dispatcher) -> ForeignBatchHandler {
    let handler = Arc::new(handler);
    Arc::new(move |ms: Vec<ForeignMessage>| {
        let answer = dispatcher.submit(handler.clone(), Input::Many(ms), true);
        Box::pin(async move {
            match answer.await {
                Answer::Batch(b) => b,
                Answer::Single(v) => BatchVerdict {
                    all: v,
                    each: Vec::new(),
                },
            }
        })
    })
}

impl ConsumerApp {
    /// The Rust app, its handlers called through `dispatcher`.
    fn build(&self, py: Python<'_>, dispatcher: &Dispatcher) -> PyResult<rsc_client::ConsumerApp> {
        let mut b = self.opts.builder()?;
        let listeners = self.listeners.lock().map_err(poisoned)?;
        for l in listeners.iter() {
            let handler = l.handler.clone_ref(py);
            b = b.listener(if l.batch {
                rsc_client::foreign::batch_listener(&l.spec, batch(handler, dispatcher.clone()))
            } else {
                rsc_client::foreign::listener(&l.spec, single(handler, dispatcher.clone()))
            });
        }
        let _rt = runtime().enter();
        b.build().map_err(crate::errors::to_py)
    }
}

fn poisoned<T>(_: T) -> PyErr {
    PyRuntimeError::new_err("a lock of the app was poisoned by an earlier panic")
}

#[pymethods]
impl ConsumerApp {
    #[new]
    #[pyo3(signature = (**kwargs))]
    fn new(py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let o = Opts::new(py, kwargs)?;
        let opts = AppOpts::take(&o)?;
        o.finish("ConsumerApp")?;
        Ok(ConsumerApp {
            opts,
            listeners: Mutex::new(Vec::new()),
            handle: Mutex::new(None),
            stopped_early: Default::default(),
        })
    }

    /// Adds a listener: `handler` is an async function of a message (with `batch`, of a
    /// list of messages) returning the verdict tuple the `rsc` package's wrapper makes.
    #[pyo3(signature = (handler, group, stream, batch = false, **kwargs))]
    fn add_listener(
        &self,
        py: Python<'_>,
        handler: Py<PyAny>,
        group: String,
        stream: String,
        batch: bool,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<()> {
        let o = Opts::new(py, kwargs)?;
        let spec = listener_spec(group, stream, &o)?;
        o.finish("listener")?;
        self.listeners.lock().map_err(poisoned)?.push(Registered {
            spec,
            handler,
            batch,
        });
        Ok(())
    }

    /// The member ids the app runs (`<instance>-<listener>-<index>`); checks the
    /// configuration as running it would.
    fn member_ids(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        Ok(self.build(py, &Dispatcher::new(py, None)?)?.member_ids())
    }

    /// Runs the app until `shutdown()`: an awaitable; handlers are awaited on `event_loop`.
    fn run<'py>(&self, py: Python<'py>, event_loop: Py<PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let dispatcher = Dispatcher::new(py, Some(event_loop))?;
        let app = match self.build(py, &dispatcher) {
            Ok(app) => app,
            Err(e) => {
                dispatcher.close(py);
                return Err(e);
            }
        };
        let handle = app.handle();
        if self.stopped_early.load(std::sync::atomic::Ordering::SeqCst) {
            handle.shutdown();
        }
        *self.handle.lock().map_err(poisoned)? = Some(handle);
        let ran = into_awaitable(py, app.run_until(std::future::pending()), false)?;
        ran.call_method1("add_done_callback", (dispatcher.detach(py)?,))?;
        Ok(ran)
    }

    /// Starts a graceful shutdown: in-flight handlers finish and are acknowledged, then the
    /// members leave their groups.
    fn shutdown(&self) -> PyResult<()> {
        self.stopped_early
            .store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(h) = self.handle.lock().map_err(poisoned)?.as_ref() {
            h.shutdown();
        }
        Ok(())
    }

    /// Stops handling new messages of a listener (by name) in this process.
    fn pause(&self, listener: &str) -> PyResult<bool> {
        Ok(self.running()?.pause(listener))
    }

    /// Resumes a paused listener.
    fn resume(&self, listener: &str) -> PyResult<bool> {
        Ok(self.running()?.resume(listener))
    }

    /// Why the app is not ready (`None`: it is).
    fn not_ready(&self) -> PyResult<Option<String>> {
        Ok(match self.handle.lock().map_err(poisoned)?.as_ref() {
            Some(h) => h.not_ready(),
            None => Some("not running".into()),
        })
    }

    /// Waits (blocking, the GIL released) until the app is ready or `timeout` seconds
    /// passed; returns whether it is.
    fn wait_ready(&self, py: Python<'_>, timeout: f64) -> PyResult<bool> {
        let handle = self.running()?;
        let deadline = Duration::from_secs_f64(timeout.max(0.0));
        block_on(py, async move {
            let started = tokio::time::Instant::now();
            while handle.not_ready().is_some() {
                if started.elapsed() >= deadline {
                    return Ok(false);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Ok(true)
        })
    }
}

impl ConsumerApp {
    fn running(&self) -> PyResult<AppHandle> {
        self.handle
            .lock()
            .map_err(poisoned)?
            .clone()
            .ok_or_else(|| PyRuntimeError::new_err("the app is not running"))
    }
}
