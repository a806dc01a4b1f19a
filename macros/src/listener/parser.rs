//! Reading `#[stream_listener(…)]`: the attribute's keys and the shape of the function.

use proc_macro2::{Span, TokenStream};
use rsc_protocol::names::{NAME_PATTERN, validate_name};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, FnArg, Lit, MetaNameValue, Token};

/// The keys the attribute accepts, for error messages.
const KEYS: &str = "group, stream, concurrency, key_concurrency, name, ack, max_retries, retry_stages, batch, linger_ms";

/// The error for an unknown key: with the known key it most likely misspells (at most two
/// edits away), then every key.
fn unknown_key(key: &str) -> String {
    let closest = KEYS
        .split(", ")
        .map(|k| (strsim::levenshtein(key, k), k))
        .min()
        .filter(|&(distance, _)| distance <= 2);
    match closest {
        Some((_, k)) => format!("unknown key `{key}`: did you mean `{k}`? The keys are: {KEYS}"),
        None => format!("unknown key `{key}`; the keys are: {KEYS}"),
    }
}

/// How the runtime acknowledges entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ack {
    Auto,
    Manual,
}

/// The attribute's arguments, checked.
#[derive(Debug)]
pub(crate) struct ListenerArgs {
    pub(crate) group: String,
    pub(crate) stream: String,
    pub(crate) concurrency: Option<u32>,
    /// Handler calls of one shard in flight at once, never two of one key.
    pub(crate) key_concurrency: Option<u32>,
    pub(crate) name: Option<String>,
    pub(crate) ack: Option<Ack>,
    pub(crate) max_retries: Option<u32>,
    /// Non-blocking retries: each stage's delay in milliseconds (checked at compile time).
    pub(crate) retry_stages: Option<Vec<u64>>,
    /// A batch listener: the most messages per call.
    pub(crate) batch: Option<u32>,
    /// A batch listener's linger, in milliseconds.
    pub(crate) linger_ms: Option<u32>,
}

/// What the expansion needs to know about the function.
pub(crate) struct Handler {
    pub(crate) ident: syn::Ident,
    /// The payload type `T` of the `Message<T>` (or `Batch<T>`) argument.
    pub(crate) payload: syn::Type,
    /// The types of the `Data<A>` arguments, in order.
    pub(crate) data: Vec<syn::Type>,
}

impl ListenerArgs {
    pub(crate) fn parse(args: TokenStream) -> syn::Result<Self> {
        let pairs = Punctuated::<MetaNameValue, Token![,]>::parse_terminated
            .parse2(args.clone())
            .map_err(|e| {
                syn::Error::new(
                    e.span(),
                    format!(
                        "expected `key = value` pairs, e.g. \
                         #[stream_listener(group = \"billing\", stream = \"orders\")]; keys: {KEYS}"
                    ),
                )
            })?;
        let mut given = Given::default();
        for pair in &pairs {
            given.set(pair)?;
        }
        given.finish(&args)
    }
}

impl std::fmt::Debug for Handler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handler")
            .field("ident", &self.ident)
            .field("data", &self.data.len())
            .finish_non_exhaustive()
    }
}

/// The keys as given, before the required ones are checked.
#[derive(Default)]
struct Given {
    group: Option<String>,
    stream: Option<String>,
    concurrency: Option<u32>,
    key_concurrency: Option<u32>,
    name: Option<String>,
    ack: Option<Ack>,
    max_retries: Option<u32>,
    retry_stages: Option<Vec<u64>>,
    batch: Option<u32>,
    linger_ms: Option<u32>,
}

impl Given {
    /// Takes one `key = value` pair: each key once, its value checked.
    fn set(&mut self, pair: &MetaNameValue) -> syn::Result<()> {
        let key = pair
            .path
            .get_ident()
            .map(ToString::to_string)
            .unwrap_or_default();
        match key.as_str() {
            "group" => once(&mut self.group, pair, |v| name_value(v, "group")),
            "stream" => once(&mut self.stream, pair, |v| name_value(v, "stream")),
            "name" => once(&mut self.name, pair, |v| name_value(v, "name")),
            "concurrency" => once(&mut self.concurrency, pair, |v| {
                at_least_one(v, "concurrency", "`concurrency` must be at least 1")
            }),
            "key_concurrency" => once(&mut self.key_concurrency, pair, |v| {
                at_least_one(
                    v,
                    "key_concurrency",
                    "`key_concurrency` (handler calls of one shard at once) must be at least 1",
                )
            }),
            "max_retries" => once(&mut self.max_retries, pair, |v| int_value(v, "max_retries")),
            "retry_stages" => once(&mut self.retry_stages, pair, stages_value),
            "batch" => once(&mut self.batch, pair, |v| {
                at_least_one(
                    v,
                    "batch",
                    "`batch` (the most messages per call) must be at least 1",
                )
            }),
            "linger_ms" => once(&mut self.linger_ms, pair, |v| int_value(v, "linger_ms")),
            "ack" => once(&mut self.ack, pair, ack_value),
            _ => Err(syn::Error::new(pair.path.span(), unknown_key(&key))),
        }
    }

    /// The arguments, once the required keys are there and the keys fit together.
    fn finish(self, args: &TokenStream) -> syn::Result<ListenerArgs> {
        if self.linger_ms.is_some() && self.batch.is_none() {
            return Err(syn::Error::new(
                args.span(),
                "`linger_ms` only applies to a batch listener: add `batch = N`",
            ));
        }
        Ok(ListenerArgs {
            group: self.group.ok_or_else(|| missing("group", args))?,
            stream: self.stream.ok_or_else(|| missing("stream", args))?,
            concurrency: self.concurrency,
            key_concurrency: self.key_concurrency,
            name: self.name,
            ack: self.ack,
            max_retries: self.max_retries,
            retry_stages: self.retry_stages,
            batch: self.batch,
            linger_ms: self.linger_ms,
        })
    }
}

/// Sets `slot` from the pair's value, unless the key was given already.
fn once<T>(
    slot: &mut Option<T>,
    pair: &MetaNameValue,
    value: impl FnOnce(&Expr) -> syn::Result<T>,
) -> syn::Result<()> {
    if slot.is_some() {
        let key = pair
            .path
            .get_ident()
            .map(ToString::to_string)
            .unwrap_or_default();
        return Err(syn::Error::new(
            pair.path.span(),
            format!("`{key}` is given twice"),
        ));
    }
    *slot = Some(value(&pair.value)?);
    Ok(())
}

/// An integer literal of at least 1 (else `message`).
fn at_least_one(value: &Expr, key: &str, message: &str) -> syn::Result<u32> {
    let n = int_value(value, key)?;
    if n == 0 {
        return Err(syn::Error::new(value.span(), message));
    }
    Ok(n)
}

fn ack_value(value: &Expr) -> syn::Result<Ack> {
    match str_value(value, "ack")?.as_str() {
        "auto" => Ok(Ack::Auto),
        "manual" => Ok(Ack::Manual),
        _ => Err(syn::Error::new(
            value.span(),
            "`ack` is \"auto\" (after the handler succeeds) or \"manual\"",
        )),
    }
}

/// `retry_stages = "10s,1m"`: each stage's delay in milliseconds
/// ([`rsc_protocol::retry::parse_stages`]).
fn stages_value(value: &Expr) -> syn::Result<Vec<u64>> {
    let text = str_value(value, "retry_stages")?;
    let stages = rsc_protocol::retry::parse_stages(&text).map_err(|why| {
        syn::Error::new(
            value.span(),
            format!("`retry_stages` takes delays separated by commas, e.g. \"10s,1m\": {why}"),
        )
    })?;
    Ok(stages.iter().map(|d| d.as_millis() as u64).collect())
}

fn missing(key: &str, args: &TokenStream) -> syn::Error {
    let span = if args.is_empty() {
        Span::call_site()
    } else {
        args.span()
    };
    syn::Error::new(
        span,
        format!(
            "missing `{key}`: a listener needs both a consumer group and a stream, e.g. \
             #[stream_listener(group = \"billing\", stream = \"orders\")]"
        ),
    )
}

fn str_value(value: &Expr, key: &str) -> syn::Result<String> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Ok(s.value()),
        _ => Err(syn::Error::new(
            value.span(),
            format!("`{key}` takes a string literal"),
        )),
    }
}

fn int_value(value: &Expr, key: &str) -> syn::Result<u32> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(i), ..
        }) => i.base10_parse(),
        _ => Err(syn::Error::new(
            value.span(),
            format!("`{key}` takes an integer literal"),
        )),
    }
}

/// A group, stream or listener name: the protocol's name rule
/// ([`rsc_protocol::names::NAME_PATTERN`], PROTOCOL §1), checked at compile time.
fn name_value(value: &Expr, key: &str) -> syn::Result<String> {
    let s = str_value(value, key)?;
    match validate_name(key, &s) {
        Ok(()) => Ok(s),
        Err(_) => Err(syn::Error::new(
            value.span(),
            format!("`{key}` must match {NAME_PATTERN} (got {s:?})"),
        )),
    }
}

/// Checks that the function is `async fn NAME(arg: Message<T>, state: Data<A>…) -> R` (with
/// `batch`: `Batch<T>` first) with no generics and no receiver. The return type itself is
/// checked by the compiler against `HandlerError`.
pub(crate) fn check_handler(func: &syn::ItemFn, batch: bool) -> syn::Result<Handler> {
    let sig = &func.sig;
    let expected = Expected::new(batch);
    check_signature(sig, &expected)?;
    for (i, input) in sig.inputs.iter().enumerate() {
        check_input(i, input, &expected)?;
    }
    if let syn::ReturnType::Default = sig.output {
        return Err(syn::Error::new(
            sig.paren_token.span.close(),
            if batch {
                "a batch listener returns `Result<(), BatchError>` or `Result<(), HandlerError>`"
            } else {
                "a listener returns `Result<(), HandlerError>`"
            },
        ));
    }
    let types: Vec<&syn::Type> = (sig.inputs.iter())
        .filter_map(|input| match input {
            FnArg::Typed(t) => Some(&*t.ty),
            FnArg::Receiver(_) => None,
        })
        .collect();
    Ok(Handler {
        ident: sig.ident.clone(),
        payload: types
            .first()
            .and_then(|t| type_argument(t))
            .cloned()
            .ok_or_else(|| {
                syn::Error::new(
                    sig.ident.span(),
                    format!("a listener takes `{}`", expected.shape),
                )
            })?,
        data: types.iter().skip(1).map(|t| (*t).clone()).collect(),
    })
}

/// The one type argument of `Message<T>`, `Batch<T>` (the last path segment's).
fn type_argument(ty: &syn::Type) -> Option<&syn::Type> {
    let syn::Type::Path(p) = ty else {
        return None;
    };
    let syn::PathArguments::AngleBracketed(a) = &p.path.segments.last()?.arguments else {
        return None;
    };
    match a.args.first()? {
        syn::GenericArgument::Type(t) => Some(t),
        _ => None,
    }
}

/// What a listener's signature looks like: a message or a batch listener.
struct Expected {
    batch: bool,
    /// The first argument's type (`Message` or `Batch`).
    first: &'static str,
    /// The whole signature, for error messages.
    shape: &'static str,
}

impl Expected {
    fn new(batch: bool) -> Self {
        if batch {
            Expected {
                batch,
                first: "Batch",
                shape: "async fn on_batch(batch: Batch<T>) -> Result<(), BatchError>",
            }
        } else {
            Expected {
                batch,
                first: "Message",
                shape: "async fn on_message(msg: Message<T>) -> Result<(), HandlerError>",
            }
        }
    }
}

/// `async`, not generic, one to five arguments.
fn check_signature(sig: &syn::Signature, expected: &Expected) -> syn::Result<()> {
    let Expected { first, shape, .. } = expected;
    if sig.asyncness.is_none() {
        return Err(syn::Error::new(
            sig.fn_token.span(),
            format!("#[stream_listener] requires an `async fn`: write `{shape}`"),
        ));
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        return Err(syn::Error::new(
            sig.generics.span(),
            format!("a listener cannot be generic: name the payload type, e.g. `{first}<Order>`"),
        ));
    }
    if sig.inputs.is_empty() {
        return Err(syn::Error::new(
            sig.paren_token.span.join(),
            format!(
                "a listener takes a `{first}<T>` argument, then optionally `Data<A>` arguments: \
                 `{shape}`"
            ),
        ));
    }
    if sig.inputs.len() > 5 {
        return Err(syn::Error::new(
            sig.inputs.span(),
            "a listener takes at most four `Data<A>` arguments after the message: group state \
             in a struct",
        ));
    }
    Ok(())
}

/// Argument `i`: the message (or batch) first, then `Data<A>` ones; no receiver.
fn check_input(i: usize, input: &FnArg, expected: &Expected) -> syn::Result<()> {
    let Expected {
        batch,
        first,
        shape,
    } = *expected;
    let arg = match input {
        FnArg::Receiver(r) => {
            return Err(syn::Error::new(
                r.span(),
                format!("a listener is a free function, not a method: `{shape}`"),
            ));
        }
        FnArg::Typed(t) => t,
    };
    if i > 0 {
        if is_generic_type(&arg.ty, "Data") {
            return Ok(());
        }
        return Err(syn::Error::new(
            arg.ty.span(),
            format!(
                "after the `{first}<T>` a listener only takes `Data<A>` arguments (state \
                 given to the app with `.data(value)`)"
            ),
        ));
    }
    if is_generic_type(&arg.ty, first) {
        return Ok(());
    }
    let hint = if batch {
        "with `batch = N` the listener's first argument must be `Batch<T>`, where T is the \
         payload type"
    } else if is_generic_type(&arg.ty, "Batch") {
        "a `Batch<T>` argument needs a batch listener: add `batch = N` (the most messages per \
         call)"
    } else {
        "the listener's argument must be `Message<T>`, where T is a `serde::Deserialize` \
         payload type or `Raw` for the bytes as sent"
    };
    Err(syn::Error::new(arg.ty.span(), hint))
}

fn is_generic_type(ty: &syn::Type, name: &str) -> bool {
    let syn::Type::Path(p) = ty else {
        return false;
    };
    if p.qself.is_some() {
        return false;
    }
    let Some(last) = p.path.segments.last() else {
        return false;
    };
    last.ident == name
        && matches!(&last.arguments, syn::PathArguments::AngleBracketed(a) if a.args.len() == 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use quote::quote;

    #[test]
    fn reads_every_key() {
        let a = ListenerArgs::parse(quote!(
            group = "g",
            stream = "s",
            concurrency = 4,
            key_concurrency = 16,
            name = "n",
            ack = "manual",
            max_retries = 7,
            retry_stages = "10s, 1m",
            batch = 100,
            linger_ms = 20
        ))
        .unwrap();
        assert_eq!(a.retry_stages, Some(vec![10_000, 60_000]));
        assert_eq!((a.batch, a.linger_ms), (Some(100), Some(20)));
        assert_eq!((a.group.as_str(), a.stream.as_str()), ("g", "s"));
        assert_eq!(a.concurrency, Some(4));
        assert_eq!(a.key_concurrency, Some(16));
        assert_eq!(a.name.as_deref(), Some("n"));
        assert_eq!(a.ack, Some(Ack::Manual));
        assert_eq!(a.max_retries, Some(7));
    }

    #[test]
    fn rejects_bad_input() {
        for (args, needle) in [
            (quote!(stream = "s"), "missing `group`"),
            (quote!(group = "g"), "missing `stream`"),
            (
                quote!(group = "g", stream = "s", colour = "red"),
                "unknown key `colour`; the keys are",
            ),
            (
                quote!(group = "g", stream = "s", concurency = 2),
                "unknown key `concurency`: did you mean `concurrency`?",
            ),
            (
                quote!(group = "g", group = "h", stream = "s"),
                "given twice",
            ),
            (quote!(group = "bad name", stream = "s"), "must match"),
            (
                quote!(group = "g", stream = "s", concurrency = 0),
                "at least 1",
            ),
            (
                quote!(group = "g", stream = "s", key_concurrency = 0),
                "`key_concurrency` (handler calls of one shard at once) must be at least 1",
            ),
            (quote!(group = "g", stream = "s", ack = "later"), "`ack` is"),
            (quote!(group, stream = "s"), "key = value"),
            (quote!(group = "g", stream = "s", batch = 0), "at least 1"),
            (
                quote!(group = "g", stream = "s", retry_stages = "10s,1w"),
                "`retry_stages` takes delays separated by commas",
            ),
            (
                quote!(group = "g", stream = "s", retry_stages = 10),
                "`retry_stages` takes a string literal",
            ),
            (
                quote!(group = "g", stream = "s", linger_ms = 5),
                "only applies to a batch",
            ),
        ] {
            let err = ListenerArgs::parse(args).unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        }
    }

    #[test]
    fn checks_the_function() {
        let ok: syn::ItemFn = syn::parse_quote!(
            async fn f(m: rsc_client::Message<Order>) -> Result<(), HandlerError> {
                Ok(())
            }
        );
        assert_eq!(check_handler(&ok, false).unwrap().ident, "f");
        let with_data: syn::ItemFn = syn::parse_quote!(
            async fn f(m: Message<Order>, db: Data<Pool>) -> Result<(), HandlerError> {
                Ok(())
            }
        );
        assert!(check_handler(&with_data, false).is_ok());
        let batch: syn::ItemFn = syn::parse_quote!(
            async fn f(b: Batch<Order>, db: Data<Pool>) -> Result<(), BatchError> {
                Ok(())
            }
        );
        assert!(check_handler(&batch, true).is_ok());
        let err = check_handler(&batch, false).unwrap_err().to_string();
        assert!(err.contains("add `batch = N`"), "{err}");
        let err = check_handler(&ok, true).unwrap_err().to_string();
        assert!(err.contains("must be `Batch<T>`"), "{err}");
        for (f, needle) in [
            (
                syn::parse_quote!(
                    fn f(m: Message<X>) -> R {}
                ),
                "async fn",
            ),
            (
                syn::parse_quote!(
                    async fn f(m: String) -> R {}
                ),
                "must be `Message<T>`",
            ),
            (
                syn::parse_quote!(
                    async fn f() -> R {}
                ),
                "takes a `Message<T>` argument",
            ),
            (
                syn::parse_quote!(
                    async fn f(m: Message<X>, n: u32) -> R {}
                ),
                "only takes `Data<A>`",
            ),
            (
                syn::parse_quote!(
                    async fn f<T>(m: Message<T>) -> R {}
                ),
                "generic",
            ),
            (
                syn::parse_quote!(
                    async fn f(m: Message<X>) {}
                ),
                "returns",
            ),
        ] {
            let f: syn::ItemFn = f;
            let err = check_handler(&f, false).unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        }
    }
}
