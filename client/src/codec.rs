//! Payload formats: how a producer encodes a value and a listener decodes it, and the content
//! type an entry records in its `content_type` field.
//!
//! JSON is the default and needs nothing: `Message<T>` for any `serde::Deserialize` type,
//! [`crate::producer::Producer::publish`] for any `serde::Serialize` one, and no
//! `content_type` field (an entry without one is JSON). [`crate::Raw`] takes the bytes as
//! sent, whatever their format. Another format is chosen per listener
//! ([`crate::Listener::codec`]) and per producer
//! ([`crate::producer::ProducerBuilder::codec`]) or per record
//! ([`crate::producer::Record::encode`]); such entries carry their content type, and a
//! listener refuses an entry of another type with a dead letter that says so.
//!
//! ```
//! use rsc_client::codec::{Codec, Json};
//!
//! let bytes = Json::encode(&vec![1, 2, 3]).unwrap();
//! let back: Vec<u32> = Json::decode(&bytes).unwrap();
//! assert_eq!(back, [1, 2, 3]);
//! assert_eq!(Json::CONTENT_TYPE, "application/json");
//! ```

use crate::error::BoxError;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The entry field that names a payload's format (absent: JSON); the same as
/// [`rsc_protocol::entry::CONTENT_TYPE`].
pub const CONTENT_TYPE_FIELD: &str = rsc_protocol::entry::CONTENT_TYPE;

/// A payload format. Implement it for a format of your own; [`Json`] and (feature
/// `msgpack`) `MsgPack` come with the crate.
pub trait Codec: Send + Sync + 'static {
    /// The content type recorded in the entry's `content_type` field (e.g.
    /// `application/msgpack`).
    const CONTENT_TYPE: &'static str;

    /// Encodes a value.
    fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, BoxError>;

    /// Decodes a value.
    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, BoxError>;
}

/// JSON (`application/json`), the default: what entries without a `content_type` field hold.
#[derive(Debug, Clone, Copy, Default)]
pub struct Json;

impl Codec for Json {
    const CONTENT_TYPE: &'static str = "application/json";

    fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, BoxError> {
        serde_json::to_vec(value).map_err(Into::into)
    }

    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, BoxError> {
        serde_json::from_slice(bytes).map_err(Into::into)
    }
}

/// MessagePack (`application/msgpack`, via rmp-serde; structs as maps, so that fields may be
/// added and reordered as with JSON). Feature `msgpack`.
#[cfg(feature = "msgpack")]
#[derive(Debug, Clone, Copy, Default)]
pub struct MsgPack;

#[cfg(feature = "msgpack")]
impl Codec for MsgPack {
    const CONTENT_TYPE: &'static str = "application/msgpack";

    fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, BoxError> {
        rmp_serde::to_vec_named(value).map_err(Into::into)
    }

    fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, BoxError> {
        rmp_serde::from_slice(bytes).map_err(Into::into)
    }
}

type ToValue = fn(&[u8]) -> Result<serde_json::Value, BoxError>;
type FromValue = fn(&serde_json::Value) -> Result<Vec<u8>, BoxError>;

/// A codec chosen at run time (per listener or producer), with the payload type erased:
/// JSON decodes straight into the payload type; another codec goes through a
/// `serde_json::Value` (one extra step, so that any codec works with any listener). Not
/// nameable outside the crate.
#[derive(Clone, Copy)]
pub struct CodecSpec {
    pub(crate) content_type: &'static str,
    /// `None` for JSON.
    pub(crate) to_value: Option<ToValue>,
    pub(crate) from_value: Option<FromValue>,
}

impl std::fmt::Debug for CodecSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.content_type)
    }
}

impl Default for CodecSpec {
    fn default() -> Self {
        CodecSpec::JSON
    }
}

impl CodecSpec {
    pub(crate) const JSON: CodecSpec = CodecSpec {
        content_type: Json::CONTENT_TYPE,
        to_value: None,
        from_value: None,
    };

    pub(crate) fn of<C: Codec>() -> Self {
        if C::CONTENT_TYPE == Json::CONTENT_TYPE {
            return CodecSpec::JSON;
        }
        CodecSpec {
            content_type: C::CONTENT_TYPE,
            to_value: Some(C::decode::<serde_json::Value>),
            from_value: Some(C::encode::<serde_json::Value>),
        }
    }

    pub(crate) fn is_json(&self) -> bool {
        self.to_value.is_none()
    }

    pub(crate) fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, BoxError> {
        match self.to_value {
            None => serde_json::from_slice(bytes).map_err(Into::into),
            Some(to_value) => serde_json::from_value(to_value(bytes)?).map_err(Into::into),
        }
    }

    pub(crate) fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<Vec<u8>, BoxError> {
        match self.from_value {
            None => serde_json::to_vec(value).map_err(Into::into),
            Some(from_value) => from_value(&serde_json::to_value(value)?),
        }
    }
}
