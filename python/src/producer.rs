//! `rsc._rsc.Producer`: the Rust producer (routed, fenced, idempotent), its publishes as
//! awaitables or blocking calls.

use crate::options::{Conn, Opts, apply_conn};
use crate::runtime::{block_on, into_awaitable, runtime};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyDict, PyMemoryView};
use rsc_client::producer::{Producer as RustProducer, Published as RustPublished, Record};
use std::collections::BTreeMap;

/// Where a message was written.
#[pyclass(module = "rsc._rsc", frozen, eq)]
#[derive(PartialEq)]
pub(crate) struct Published {
    /// The shard index.
    #[pyo3(get)]
    shard: u32,
    /// The entry id Redis assigned.
    #[pyo3(get)]
    id: String,
}

#[pymethods]
impl Published {
    fn __repr__(&self) -> String {
        format!("Published(shard={}, id={:?})", self.shard, self.id)
    }
}

impl From<RustPublished> for Published {
    fn from(p: RustPublished) -> Self {
        Published {
            shard: p.shard,
            id: p.id,
        }
    }
}

/// The payload bytes of a Python value: bytes-like as they are, anything else as compact
/// JSON (`json.dumps`).
fn payload_bytes(payload: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = payload.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if payload.is_instance_of::<PyByteArray>() || payload.is_instance_of::<PyMemoryView>() {
        return payload
            .py()
            .import("builtins")?
            .getattr("bytes")?
            .call1((payload,))?
            .extract();
    }
    let py = payload.py();
    let kwargs = PyDict::new(py);
    kwargs.set_item("separators", (",", ":"))?;
    let text: String = py
        .import("json")?
        .call_method("dumps", (payload,), Some(&kwargs))?
        .extract()?;
    Ok(text.into_bytes())
}

/// One message to publish (for `publish_batch`).
#[pyclass(module = "rsc._rsc", frozen, name = "Record")]
#[derive(Clone)]
pub(crate) struct PyRecord {
    record: Record,
}

#[pymethods]
impl PyRecord {
    /// A record: `payload` (bytes as they are, anything else as JSON), an optional routing
    /// `key`, `headers` (str to str), extra entry `fields` (str to bytes or str), and a
    /// `content_type` to record.
    #[new]
    #[pyo3(signature = (payload, key = None, headers = None, fields = None, content_type = None))]
    fn new(
        payload: &Bound<'_, PyAny>,
        key: Option<String>,
        headers: Option<BTreeMap<String, String>>,
        fields: Option<BTreeMap<String, Bound<'_, PyAny>>>,
        content_type: Option<String>,
    ) -> PyResult<Self> {
        let mut record = Record::raw(payload_bytes(payload)?);
        if let Some(k) = key {
            record = record.key(k);
        }
        for (k, v) in headers.unwrap_or_default() {
            record = record.header(k, v);
        }
        for (k, v) in fields.unwrap_or_default() {
            let bytes: Vec<u8> = if let Ok(s) = v.extract::<String>() {
                s.into_bytes()
            } else if let Ok(b) = v.cast::<PyBytes>() {
                b.as_bytes().to_vec()
            } else {
                return Err(PyTypeError::new_err(format!(
                    "field {k}: expected str or bytes"
                )));
            };
            record = record.field(k, bytes);
        }
        if let Some(ct) = content_type {
            record = record.content_type(ct);
        }
        Ok(PyRecord { record })
    }
}

/// The records of a batch: `Record`s, or plain payloads (no key).
fn records(items: &Bound<'_, PyAny>) -> PyResult<Vec<Record>> {
    let mut out = Vec::new();
    for item in items.try_iter()? {
        let item = item?;
        match item.cast::<PyRecord>() {
            Ok(r) => out.push(r.get().record.clone()),
            Err(_) => out.push(Record::raw(payload_bytes(&item)?)),
        }
    }
    Ok(out)
}

/// Publishes messages to sharded streams through the Rust producer.
#[pyclass(module = "rsc._rsc", frozen)]
pub(crate) struct Producer {
    inner: RustProducer,
}

#[pymethods]
impl Producer {
    /// A producer; options unset keep the environment's values (`RSC_COORDINATOR_URL`,
    /// `RSC_REDIS_URL`, `RSC_TOKEN`, …).
    #[new]
    #[pyo3(signature = (**kwargs))]
    fn new(py: Python<'_>, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<Self> {
        let o = Opts::new(py, kwargs)?;
        let conn = Conn::take(&o)?;
        let idempotent: Option<bool> = o.take("idempotent")?;
        let idempotence_ttl = o.seconds("idempotence_ttl")?;
        let retry_budget = o.seconds("retry_budget")?;
        let delivery_timeout = o.seconds("delivery_timeout")?;
        let refresh_every = o.seconds("refresh_every")?;
        let stale_retry_budget = o.seconds("stale_retry_budget")?;
        let wait_replicas: Option<u32> = o.take("wait_replicas")?;
        let wait_timeout = o.seconds("wait_timeout")?;
        let max_in_flight: Option<usize> = o.take("max_in_flight")?;
        if max_in_flight == Some(0) {
            return Err(PyValueError::new_err(
                "max_in_flight 0: at least one publish must be able to run",
            ));
        }
        o.finish("Producer")?;
        let mut b = apply_conn!(RustProducer::builder(), &conn);
        if let Some(on) = idempotent {
            b = b.idempotent(on);
        }
        if let Some(d) = idempotence_ttl {
            b = b.idempotence_ttl(d);
        }
        if let Some(d) = retry_budget {
            b = b.retry_budget(d);
        }
        if let Some(d) = delivery_timeout {
            b = b.delivery_timeout(d);
        }
        if let Some(d) = refresh_every {
            b = b.refresh_every(d);
        }
        if let Some(d) = stale_retry_budget {
            b = b.stale_retry_budget(d);
        }
        if let Some(n) = max_in_flight {
            b = b.max_in_flight(n);
        }
        if let Some(n) = wait_replicas {
            let timeout = wait_timeout.unwrap_or(std::time::Duration::from_secs(1));
            b = b.wait_for_replicas(n, timeout);
        }
        let _rt = runtime().enter();
        let inner = b.build().map_err(crate::errors::to_py)?;
        Ok(Producer { inner })
    }

    /// Publishes one message (an awaitable of `Published`).
    // The arguments are the Python signature's keyword arguments.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (stream, payload, key = None, headers = None, fields = None, content_type = None))]
    fn publish<'py>(
        &self,
        py: Python<'py>,
        stream: String,
        payload: &Bound<'py, PyAny>,
        key: Option<String>,
        headers: Option<BTreeMap<String, String>>,
        fields: Option<BTreeMap<String, Bound<'py, PyAny>>>,
        content_type: Option<String>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let record = PyRecord::new(payload, key, headers, fields, content_type)?.record;
        // The publish's turn is taken here, at the call: publishes awaited together keep
        // their call order per key (PROTOCOL §21), whichever task the runtime polls first.
        let publish = rsc_client::foreign::publish_batch(&self.inner, &stream, vec![record]);
        into_awaitable(
            py,
            async move { Ok(Published::from(publish.await?.remove(0))) },
            true,
        )
    }

    /// Publishes one message, blocking (the GIL released).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (stream, payload, key = None, headers = None, fields = None, content_type = None))]
    fn publish_sync(
        &self,
        py: Python<'_>,
        stream: String,
        payload: &Bound<'_, PyAny>,
        key: Option<String>,
        headers: Option<BTreeMap<String, String>>,
        fields: Option<BTreeMap<String, Bound<'_, PyAny>>>,
        content_type: Option<String>,
    ) -> PyResult<Published> {
        let record = PyRecord::new(payload, key, headers, fields, content_type)?.record;
        let p = &self.inner;
        block_on(py, async move { p.publish_record(&stream, record).await }).map(Into::into)
    }

    /// Publishes records in one round trip (an awaitable of a list of `Published`, in order).
    fn publish_batch<'py>(
        &self,
        py: Python<'py>,
        stream: String,
        records: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let records = self::records(records)?;
        // The turn is taken at the call, as in `publish`.
        let publish = rsc_client::foreign::publish_batch(&self.inner, &stream, records);
        into_awaitable(
            py,
            async move {
                let out = publish.await?;
                Ok(out.into_iter().map(Published::from).collect::<Vec<_>>())
            },
            true,
        )
    }

    /// Publishes records in one round trip, blocking (the GIL released).
    fn publish_batch_sync(
        &self,
        py: Python<'_>,
        stream: String,
        records: &Bound<'_, PyAny>,
    ) -> PyResult<Vec<Published>> {
        let records = self::records(records)?;
        let p = &self.inner;
        let out = block_on(py, async move { p.publish_batch(&stream, records).await })?;
        Ok(out.into_iter().map(Published::from).collect())
    }

    /// Why the producer could not publish now (`None`: it could), blocking.
    fn not_ready(&self, py: Python<'_>) -> PyResult<Option<String>> {
        let p = &self.inner;
        block_on(py, async move { Ok(p.not_ready().await) })
    }
}
