//! The listeners `#[stream_listener]` registers, collected without a central list
//! (`inventory`); [`crate::ConsumerAppBuilder`] adds them to the app it builds.

/// One `#[stream_listener]` function, registered without a central list.
pub struct Registration {
    build: fn() -> crate::Listener,
}

impl Registration {
    /// Wraps the function that builds the listener.
    pub const fn new(build: fn() -> crate::Listener) -> Self {
        Registration { build }
    }
}

inventory::collect!(Registration);

/// Every registered listener.
pub(crate) fn registered() -> Vec<crate::Listener> {
    inventory::iter::<Registration>
        .into_iter()
        .map(|r| (r.build)())
        .collect()
}
