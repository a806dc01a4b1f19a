//! Python exception classes, one per `ClientError` kind, under `RscError`.

use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::{PyErr, Python, create_exception};
use rsc_client::ClientError;

create_exception!(
    rsc,
    RscError,
    PyException,
    "Base class of every error of the rsc client."
);
create_exception!(
    rsc,
    ConfigError,
    RscError,
    "The configuration is incomplete or invalid."
);
create_exception!(rsc, RedisError, RscError, "A Redis command failed.");
create_exception!(
    rsc,
    DataRedisUnreachableError,
    RscError,
    "The data Redis does not answer."
);
create_exception!(
    rsc,
    FencedError,
    RscError,
    "The shard belongs to another member now."
);
create_exception!(
    rsc,
    StaleRoutingError,
    RscError,
    "A write was refused for a stale routing epoch."
);
create_exception!(
    rsc,
    DeliveryTimeoutError,
    RscError,
    "A publish was not delivered in time."
);
create_exception!(
    rsc,
    NotReplicatedError,
    RscError,
    "Fewer replicas than asked confirmed a write."
);
create_exception!(
    rsc,
    CoordinatorError,
    RscError,
    "A call to the coordinator failed."
);
create_exception!(
    rsc,
    EncodeError,
    RscError,
    "A payload could not be encoded."
);
create_exception!(
    rsc,
    PanickedError,
    RscError,
    "A task of the client panicked."
);
create_exception!(
    rsc,
    ShutdownTimedOutError,
    RscError,
    "The graceful shutdown timed out."
);
create_exception!(
    rsc,
    OpsListenError,
    RscError,
    "The health and metrics endpoints cannot listen."
);
create_exception!(
    rsc,
    MemberRejectedError,
    RscError,
    "The coordinator refused a member for good."
);

create_exception!(
    rsc,
    EarlierPublishFailedError,
    RscError,
    "A publish called before this one failed on a shard this one writes to."
);

/// Registers the exception classes in the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("RscError", py.get_type::<RscError>())?;
    m.add("ConfigError", py.get_type::<ConfigError>())?;
    m.add("RedisError", py.get_type::<RedisError>())?;
    m.add(
        "DataRedisUnreachableError",
        py.get_type::<DataRedisUnreachableError>(),
    )?;
    m.add("FencedError", py.get_type::<FencedError>())?;
    m.add("StaleRoutingError", py.get_type::<StaleRoutingError>())?;
    m.add(
        "DeliveryTimeoutError",
        py.get_type::<DeliveryTimeoutError>(),
    )?;
    m.add("NotReplicatedError", py.get_type::<NotReplicatedError>())?;
    m.add("CoordinatorError", py.get_type::<CoordinatorError>())?;
    m.add("EncodeError", py.get_type::<EncodeError>())?;
    m.add("PanickedError", py.get_type::<PanickedError>())?;
    m.add(
        "ShutdownTimedOutError",
        py.get_type::<ShutdownTimedOutError>(),
    )?;
    m.add("OpsListenError", py.get_type::<OpsListenError>())?;
    m.add("MemberRejectedError", py.get_type::<MemberRejectedError>())?;
    m.add(
        "EarlierPublishFailedError",
        py.get_type::<EarlierPublishFailedError>(),
    )?;
    Ok(())
}

/// The exception of a client error: its class by kind, its message, `is_retriable` and
/// `is_timeout` attributes, and its cause (the error's source, converted the same way) as
/// `__cause__`.
pub(crate) fn to_py(e: ClientError) -> PyErr {
    crate::interpreter::with_python(|py| with_cause(py, &e)).unwrap_or_else(|| new_err(&e))
}

/// The exception of a client error, and its causes below it.
fn with_cause(py: Python<'_>, e: &ClientError) -> PyErr {
    let err = new_err(e);
    let value = err.value(py);
    let _ = value.setattr("is_retriable", e.is_retriable());
    let _ = value.setattr("is_timeout", e.is_timeout());
    if let Some(cause) = std::error::Error::source(e) {
        err.set_cause(py, Some(cause_to_py(py, cause)));
    }
    err
}

/// The class of a client error's kind, with its message.
fn new_err(e: &ClientError) -> PyErr {
    let text = e.to_string();
    match e {
        ClientError::Config(_) => ConfigError::new_err(text),
        ClientError::Redis(_) => RedisError::new_err(text),
        ClientError::DataRedisUnreachable { .. } => DataRedisUnreachableError::new_err(text),
        ClientError::Fenced { .. } => FencedError::new_err(text),
        ClientError::StaleRouting { .. } => StaleRoutingError::new_err(text),
        ClientError::DeliveryTimeout { .. } => DeliveryTimeoutError::new_err(text),
        ClientError::NotReplicated { .. } => NotReplicatedError::new_err(text),
        ClientError::Coordinator(_) => CoordinatorError::new_err(text),
        ClientError::Encode(_) | ClientError::Codec { .. } => EncodeError::new_err(text),
        ClientError::Panicked { .. } => PanickedError::new_err(text),
        ClientError::ShutdownTimedOut { .. } => ShutdownTimedOutError::new_err(text),
        ClientError::OpsListen { .. } => OpsListenError::new_err(text),
        ClientError::MemberRejected { .. } => MemberRejectedError::new_err(text),
        ClientError::EarlierPublishFailed { .. } => EarlierPublishFailedError::new_err(text),
        _ => RscError::new_err(text),
    }
}

/// The exception of an error below a client error (its cause, and theirs).
fn cause_to_py(py: Python<'_>, e: &(dyn std::error::Error + 'static)) -> PyErr {
    if let Some(c) = e.downcast_ref::<ClientError>() {
        return with_cause(py, c);
    }
    let err = if e.downcast_ref::<rsc_client::CoordinatorError>().is_some() {
        CoordinatorError::new_err(e.to_string())
    } else if e.downcast_ref::<std::io::Error>().is_some() {
        pyo3::exceptions::PyOSError::new_err(e.to_string())
    } else {
        RscError::new_err(e.to_string())
    };
    if let Some(below) = e.source() {
        err.set_cause(py, Some(cause_to_py(py, below)));
    }
    err
}

/// A panic caught at the boundary, as an exception (never an unwinding into Python).
pub(crate) fn panicked(payload: &(dyn std::any::Any + Send)) -> PyErr {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".into());
    PanickedError::new_err(format!("the rsc client panicked: {text}"))
}
