//! Shared state for handlers: [`Data<T>`] arguments, filled from what
//! [`crate::ConsumerAppBuilder::data`] provided.

use std::any::{Any, TypeId};
use std::collections::HashMap;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

/// A value shared by every handler that asks for it: a database pool, a configuration, a
/// client. Provide it once with [`crate::ConsumerAppBuilder::data`]; a handler receives it as
/// an extra argument after the message (as axum's `State<S>` or apalis's `Data<T>`).
///
/// A handler that asks for a type the app was never given is refused by
/// [`crate::ConsumerAppBuilder::build`], which names the listener and the type.
///
/// ```
/// use rsc_client::prelude::*;
///
/// struct Prices { vat_percent: u64 }
///
/// async fn on_order(msg: Message<u64>, prices: Data<Prices>) -> Result<(), HandlerError> {
///     let gross = msg.payload() * (100 + prices.vat_percent) / 100;
///     assert_eq!(gross, 120);
///     Ok(())
/// }
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// // In a unit test, hand the state over yourself:
/// on_order(Message::test(100), Data::new(Prices { vat_percent: 20 })).await.unwrap();
///
/// // In the app, provide it once:
/// let app = ConsumerApp::builder()
///     .coordinator("http://127.0.0.1:7070")
///     .redis_url("redis://127.0.0.1:6379")
///     .instance_id("10.0.0.7")
///     .data(Prices { vat_percent: 20 })
///     .listener(Listener::new("billing", "orders", on_order))
///     .build()
///     .unwrap();
/// # }
/// ```
pub struct Data<T: ?Sized>(Arc<T>);

impl<T> Data<T> {
    /// Wraps a value.
    pub fn new(value: T) -> Self {
        Data(Arc::new(value))
    }
}

impl<T: ?Sized> Data<T> {
    /// Wraps a value already behind an `Arc` (shared with code outside the app).
    pub fn from_arc(value: Arc<T>) -> Self {
        Data(value)
    }

    /// The `Arc` inside.
    pub fn into_inner(self) -> Arc<T> {
        self.0
    }
}

impl<T: ?Sized> Clone for Data<T> {
    fn clone(&self) -> Self {
        Data(self.0.clone())
    }
}

impl<T: ?Sized> Deref for Data<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: ?Sized + fmt::Debug> fmt::Debug for Data<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Data").field(&&*self.0).finish()
    }
}

/// A type a handler asks for: its id, and its name for error messages (not nameable outside
/// the crate).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DataKey {
    pub(crate) id: TypeId,
    pub(crate) name: &'static str,
}

impl DataKey {
    pub(crate) fn of<T: 'static>() -> Self {
        DataKey {
            id: TypeId::of::<T>(),
            name: std::any::type_name::<T>(),
        }
    }
}

/// The app's state, by type (not nameable outside the crate).
#[derive(Default, Clone)]
pub struct DataMap {
    values: HashMap<TypeId, Arc<dyn Any + Send + Sync>>,
}

impl fmt::Debug for DataMap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DataMap")
            .field("types", &self.values.len())
            .finish()
    }
}

impl DataMap {
    pub(crate) fn insert<T: Send + Sync + 'static>(&mut self, value: Arc<T>) {
        self.values.insert(TypeId::of::<T>(), value);
    }

    pub(crate) fn contains(&self, key: &DataKey) -> bool {
        self.values.contains_key(&key.id)
    }

    /// The value of type `T`; `None` if it was never provided.
    pub(crate) fn get<T: Send + Sync + 'static>(&self) -> Option<Data<T>> {
        self.values
            .get(&TypeId::of::<T>())
            .and_then(|v| v.clone().downcast::<T>().ok())
            .map(Data)
    }
}
