//! The values handlers receive: `Message` and `Rebalance`.

use crate::runtime::{block_on, into_awaitable};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use rsc_client::Acker;
use rsc_client::foreign::ForeignMessage;

/// A message handed to a listener: the payload bytes and the entry's metadata.
#[pyclass(module = "rsc._rsc", frozen)]
pub(crate) struct Message {
    /// The Redis Stream entry id.
    #[pyo3(get)]
    id: String,
    /// The stream's base name.
    #[pyo3(get)]
    stream: String,
    /// The consumer group.
    #[pyo3(get)]
    group: String,
    /// The member handling it.
    #[pyo3(get)]
    member_id: String,
    /// The shard index.
    #[pyo3(get)]
    shard: u32,
    /// The shard's Redis key.
    #[pyo3(get)]
    shard_key: String,
    /// The routing key, if any.
    #[pyo3(get)]
    key: Option<String>,
    /// Redis's delivery count in this group.
    #[pyo3(get)]
    delivery_count: u64,
    /// This attempt's number in this process, from 1.
    #[pyo3(get)]
    attempt: u32,
    /// The payload's content type.
    #[pyo3(get)]
    content_type: String,
    /// The payload bytes.
    #[pyo3(get)]
    payload: Py<PyBytes>,
    /// The headers.
    #[pyo3(get)]
    headers: Py<PyDict>,
    /// The entry's other fields (name to bytes).
    #[pyo3(get)]
    fields: Py<PyDict>,
    acker: Acker,
}

impl Message {
    /// The Python message of a foreign message (with the GIL).
    pub(crate) fn new(py: Python<'_>, m: ForeignMessage) -> PyResult<Self> {
        let headers = PyDict::new(py);
        for (k, v) in &m.headers {
            headers.set_item(k, v)?;
        }
        let fields = PyDict::new(py);
        for (k, v) in &m.fields {
            fields.set_item(k, PyBytes::new(py, v))?;
        }
        Ok(Message {
            payload: PyBytes::new(py, &m.payload).unbind(),
            headers: headers.unbind(),
            fields: fields.unbind(),
            id: m.id,
            stream: m.stream,
            group: m.group,
            member_id: m.member_id,
            shard: m.shard,
            shard_key: m.shard_key,
            key: m.key,
            delivery_count: m.delivery_count,
            attempt: m.attempt,
            content_type: m.content_type,
            acker: m.acker,
        })
    }
}

#[pymethods]
impl Message {
    /// The payload decoded as JSON (`json.loads`).
    fn json<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        py.import("json")?
            .call_method1("loads", (self.payload.bind(py),))
    }

    /// The payload decoded as UTF-8 text.
    fn text(&self, py: Python<'_>) -> PyResult<String> {
        let bytes = self.payload.bind(py).as_bytes();
        String::from_utf8(bytes.to_vec())
            .map_err(|e| pyo3::exceptions::PyUnicodeDecodeError::new_err(e.to_string()))
    }

    /// Acknowledges the entry now (`XACK`): an awaitable. Only needed with `ack="manual"`.
    fn ack<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let acker = self.acker.clone();
        into_awaitable(py, async move { acker.ack().await }, true)
    }

    /// Acknowledges the entry now, blocking (for plain `def` handlers).
    fn ack_sync(&self, py: Python<'_>) -> PyResult<()> {
        let acker = self.acker.clone();
        block_on(py, async move { acker.ack().await })
    }

    fn __repr__(&self) -> String {
        format!(
            "Message(id={:?}, stream={:?}, shard={}, key={}, delivery_count={})",
            self.id,
            self.stream,
            self.shard,
            self.key
                .as_deref()
                .map_or("None".into(), |k| format!("{k:?}")),
            self.delivery_count
        )
    }
}

/// Which shards a member was given or gave up (`on_assigned` / `on_revoked`).
#[pyclass(module = "rsc._rsc", frozen)]
pub(crate) struct Rebalance {
    /// The consumer group.
    #[pyo3(get)]
    group: String,
    /// The member.
    #[pyo3(get)]
    member_id: String,
    /// The stream.
    #[pyo3(get)]
    stream: String,
    /// The shard indexes.
    #[pyo3(get)]
    shards: Vec<u32>,
}

impl Rebalance {
    /// The Python value of a rebalance.
    pub(crate) fn of(r: &rsc_client::Rebalance) -> Self {
        Rebalance {
            group: r.group.clone(),
            member_id: r.member_id.clone(),
            stream: r.stream.clone(),
            shards: r.shards.clone(),
        }
    }
}

#[pymethods]
impl Rebalance {
    fn __repr__(&self) -> String {
        format!(
            "Rebalance(group={:?}, member_id={:?}, stream={:?}, shards={:?})",
            self.group, self.member_id, self.stream, self.shards
        )
    }
}
