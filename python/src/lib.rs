//! The `rsc._rsc` extension module: Python bindings of `rsc-client`.
//!
//! The binding converts values and calls the client: consumer apps run the Rust member
//! runtime with handlers that are Python coroutines (`rsc_client::foreign`), producers are
//! the Rust producer. The `rsc` Python package (`python/rsc/`) adds the decorator, the
//! thread pool of plain `def` handlers and the signal handling on top. `docs/PYTHON.md`.
#![deny(missing_docs)]

mod app;
mod dispatch;
mod errors;
mod interpreter;
mod logging;
mod message;
mod options;
mod producer;
mod runtime;

use pyo3::prelude::*;

/// The extension module.
#[pymodule]
fn _rsc(m: &Bound<'_, PyModule>) -> PyResult<()> {
    rsc_client::install_crypto_provider();
    logging::init(m.py());
    errors::register(m)?;
    m.add_class::<app::ConsumerApp>()?;
    m.add_class::<message::Message>()?;
    m.add_class::<message::Rebalance>()?;
    m.add_class::<producer::Producer>()?;
    m.add_class::<producer::PyRecord>()?;
    m.add_class::<producer::Published>()?;
    m.add_class::<dispatch::Completion>()?;
    m.add_class::<dispatch::Drain>()?;
    m.add_class::<dispatch::Detach>()?;
    m.add_class::<runtime::Resolve>()?;
    m.add_class::<runtime::AbortOnCancel>()?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    let exiting = wrap_pyfunction!(interpreter::_interpreter_exiting, m)?;
    m.py()
        .import("atexit")?
        .call_method1("register", (exiting,))?;
    Ok(())
}
