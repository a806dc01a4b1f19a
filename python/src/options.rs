//! Keyword arguments into the Rust builders' settings: each name once, an unknown name a
//! `TypeError`, a value of the wrong type a `TypeError` naming the option.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::time::Duration;

/// Keyword arguments being consumed.
pub(crate) struct Opts<'py> {
    kwargs: Bound<'py, PyDict>,
}

impl<'py> Opts<'py> {
    /// The keyword arguments (a copy: taking them does not change the caller's dict).
    pub(crate) fn new(py: Python<'py>, kwargs: Option<&Bound<'py, PyDict>>) -> PyResult<Self> {
        let kwargs = match kwargs {
            Some(k) => k.copy()?,
            None => PyDict::new(py),
        };
        Ok(Opts { kwargs })
    }

    /// Takes option `name` (`None` when absent or `None`).
    pub(crate) fn take<T: pyo3::conversion::FromPyObjectOwned<'py>>(
        &self,
        name: &str,
    ) -> PyResult<Option<T>> {
        let Some(v) = self.kwargs.get_item(name)? else {
            return Ok(None);
        };
        self.kwargs.del_item(name)?;
        if v.is_none() {
            return Ok(None);
        }
        v.extract::<T>().map(Some).map_err(|e| {
            let e: PyErr = e.into();
            PyTypeError::new_err(format!("option {name}: {e}"))
        })
    }

    /// Takes a duration in seconds (a float or an int).
    pub(crate) fn seconds(&self, name: &str) -> PyResult<Option<Duration>> {
        match self.take::<f64>(name)? {
            Some(s) if s.is_finite() && s >= 0.0 => Ok(Some(Duration::from_secs_f64(s))),
            Some(s) => Err(PyValueError::new_err(format!(
                "option {name}: {s} is not a duration in seconds (a finite number >= 0)"
            ))),
            None => Ok(None),
        }
    }

    /// Fails with a `TypeError` naming any option left.
    pub(crate) fn finish(self, what: &str) -> PyResult<()> {
        let left: Vec<String> = self.kwargs.keys().iter().map(|k| k.to_string()).collect();
        if left.is_empty() {
            return Ok(());
        }
        Err(PyTypeError::new_err(format!(
            "{what}: unknown option(s) {}",
            left.join(", ")
        )))
    }
}

/// Connection settings shared by the consumer app and the producer; each one unset keeps
/// the environment's value (`RSC_*`, as the Rust builders read it).
#[derive(Default)]
pub(crate) struct Conn {
    pub(crate) coordinator: Option<String>,
    pub(crate) redis_url: Option<String>,
    pub(crate) redis_cluster: Option<bool>,
    pub(crate) redis_sentinel: Option<String>,
    pub(crate) redis_sentinel_master: Option<String>,
    pub(crate) redis_sentinel_tls: Option<bool>,
    pub(crate) redis_tls_ca: Option<String>,
    pub(crate) redis_tls_cert: Option<String>,
    pub(crate) redis_tls_key: Option<String>,
    pub(crate) token: Option<String>,
    pub(crate) token_file: Option<String>,
    pub(crate) coordinator_ca: Option<String>,
    pub(crate) coordinator_cert: Option<String>,
    pub(crate) coordinator_key: Option<String>,
}

impl Conn {
    /// Takes the connection options out of `o`.
    pub(crate) fn take(o: &Opts<'_>) -> PyResult<Self> {
        Ok(Conn {
            coordinator: o.take("coordinator")?,
            redis_url: o.take("redis_url")?,
            redis_cluster: o.take("redis_cluster")?,
            redis_sentinel: o.take("redis_sentinel")?,
            redis_sentinel_master: o.take("redis_sentinel_master")?,
            redis_sentinel_tls: o.take("redis_sentinel_tls")?,
            redis_tls_ca: o.take("redis_tls_ca")?,
            redis_tls_cert: o.take("redis_tls_cert")?,
            redis_tls_key: o.take("redis_tls_key")?,
            token: o.take("token")?,
            token_file: o.take("token_file")?,
            coordinator_ca: o.take("coordinator_ca")?,
            coordinator_cert: o.take("coordinator_cert")?,
            coordinator_key: o.take("coordinator_key")?,
        })
    }
}

/// Applies [`Conn`] to a builder with the client's connection setters (the consumer app's
/// or the producer's builder).
macro_rules! apply_conn {
    ($b:expr, $c:expr) => {{
        let mut b = $b;
        let c = $c;
        if let Some(v) = &c.coordinator {
            b = b.coordinator(v);
        }
        if let Some(v) = &c.redis_url {
            b = b.redis_url(v.as_str());
        }
        if let Some(v) = c.redis_cluster {
            b = b.redis_cluster(v);
        }
        match (&c.redis_sentinel, &c.redis_sentinel_master) {
            (Some(s), Some(m)) => b = b.redis_sentinel(s.as_str(), m.as_str()),
            (None, None) => {}
            _ => {
                return Err(pyo3::exceptions::PyValueError::new_err(
                    "redis_sentinel and redis_sentinel_master go together",
                ));
            }
        }
        if let Some(v) = c.redis_sentinel_tls {
            b = b.redis_sentinel_tls(v);
        }
        if let Some(v) = &c.redis_tls_ca {
            b = b.redis_tls_ca(v.as_str());
        }
        match (&c.redis_tls_cert, &c.redis_tls_key) {
            (Some(cert), Some(key)) => b = b.redis_tls_client_cert(cert.as_str(), key.as_str()),
            (None, None) => {}
            _ => {
                return Err(pyo3::exceptions::PyValueError::new_err(
                    "redis_tls_cert and redis_tls_key go together",
                ));
            }
        }
        if let Some(v) = &c.token {
            b = b.token(v.as_str());
        }
        if let Some(v) = &c.token_file {
            b = b.token_file(v.as_str());
        }
        if c.coordinator_ca.is_some() || c.coordinator_cert.is_some() || c.coordinator_key.is_some()
        {
            let mut tls = rsc_client::CoordinatorTls::default();
            tls.ca = c.coordinator_ca.clone().map(Into::into);
            tls.cert = c.coordinator_cert.clone().map(Into::into);
            tls.key = c.coordinator_key.clone().map(Into::into);
            b = b.coordinator_tls(tls);
        }
        b
    }};
}
pub(crate) use apply_conn;
