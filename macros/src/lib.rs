//! Procedural macros of Redis Stream Coordinator's client framework.
//!
//! Do not depend on this crate directly: use [`rsc_client::stream_listener`], which re-exports
//! the attribute and whose documentation describes it. This crate only dispatches each
//! attribute to its module (`listener::parser` reads the input, `listener::output` writes the
//! expansion).
//!
//! [`rsc_client::stream_listener`]: https://docs.rs/rsc-client/latest/rsc_client/attr.stream_listener.html
#![deny(missing_docs)]

use proc_macro::TokenStream;

mod listener;

/// Registers an `async fn(Message<T>) -> Result<(), HandlerError>` as a stream listener.
///
/// See `rsc_client::stream_listener` for the attribute's keys and the code it expands to.
#[proc_macro_attribute]
pub fn stream_listener(args: TokenStream, item: TokenStream) -> TokenStream {
    listener::stream_listener(args.into(), item.into()).into()
}
