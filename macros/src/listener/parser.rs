//! Reading `#[stream_listener(…)]`: the attribute's keys and the shape of the function.

use proc_macro2::{Span, TokenStream};
use syn::parse::Parser;
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, FnArg, Lit, MetaNameValue, Token};

/// The keys the attribute accepts, for error messages.
const KEYS: &str = "group, stream, concurrency, name, ack, max_retries";

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
    pub(crate) name: Option<String>,
    pub(crate) ack: Option<Ack>,
    pub(crate) max_retries: Option<u32>,
}

/// What the expansion needs to know about the function.
#[derive(Debug)]
pub(crate) struct Handler {
    pub(crate) ident: syn::Ident,
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
        let mut group = None;
        let mut stream = None;
        let mut out = ListenerArgs {
            group: String::new(),
            stream: String::new(),
            concurrency: None,
            name: None,
            ack: None,
            max_retries: None,
        };
        for pair in &pairs {
            let key = pair
                .path
                .get_ident()
                .map(ToString::to_string)
                .unwrap_or_default();
            let dup = |seen: bool| {
                if seen {
                    Err(syn::Error::new(
                        pair.path.span(),
                        format!("`{key}` is given twice"),
                    ))
                } else {
                    Ok(())
                }
            };
            match key.as_str() {
                "group" => {
                    dup(group.is_some())?;
                    group = Some(name_value(&pair.value, "group")?);
                }
                "stream" => {
                    dup(stream.is_some())?;
                    stream = Some(name_value(&pair.value, "stream")?);
                }
                "name" => {
                    dup(out.name.is_some())?;
                    out.name = Some(name_value(&pair.value, "name")?);
                }
                "concurrency" => {
                    dup(out.concurrency.is_some())?;
                    let n = int_value(&pair.value, "concurrency")?;
                    if n == 0 {
                        return Err(syn::Error::new(
                            pair.value.span(),
                            "`concurrency` must be at least 1",
                        ));
                    }
                    out.concurrency = Some(n);
                }
                "max_retries" => {
                    dup(out.max_retries.is_some())?;
                    out.max_retries = Some(int_value(&pair.value, "max_retries")?);
                }
                "ack" => {
                    dup(out.ack.is_some())?;
                    out.ack = Some(match str_value(&pair.value, "ack")?.as_str() {
                        "auto" => Ack::Auto,
                        "manual" => Ack::Manual,
                        _ => {
                            return Err(syn::Error::new(
                                pair.value.span(),
                                "`ack` is \"auto\" (after the handler succeeds) or \"manual\"",
                            ));
                        }
                    });
                }
                _ => {
                    return Err(syn::Error::new(
                        pair.path.span(),
                        format!("unknown key `{key}`; the keys are: {KEYS}"),
                    ));
                }
            }
        }
        out.group = group.ok_or_else(|| missing("group", &args))?;
        out.stream = stream.ok_or_else(|| missing("stream", &args))?;
        Ok(out)
    }
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

/// A group, stream or listener name: `^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$` (SPEC §1).
fn name_value(value: &Expr, key: &str) -> syn::Result<String> {
    let s = str_value(value, key)?;
    let mut chars = s.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'));
    if first_ok && rest_ok && s.len() <= 200 {
        Ok(s)
    } else {
        Err(syn::Error::new(
            value.span(),
            format!("`{key}` must match ^[A-Za-z0-9][A-Za-z0-9._:-]{{0,199}}$ (got {s:?})"),
        ))
    }
}

/// Checks that the function is `async fn NAME(arg: Message<T>) -> R` with no generics and no
/// receiver. The return type itself is checked by the compiler against `HandlerError`.
pub(crate) fn check_handler(func: &syn::ItemFn) -> syn::Result<Handler> {
    let sig = &func.sig;
    if sig.asyncness.is_none() {
        return Err(syn::Error::new(
            sig.fn_token.span(),
            "#[stream_listener] requires an `async fn`: \
             write `async fn on_message(msg: Message<T>) -> Result<(), HandlerError>`",
        ));
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        return Err(syn::Error::new(
            sig.generics.span(),
            "a listener cannot be generic: name the payload type, e.g. `Message<Order>`",
        ));
    }
    if sig.inputs.len() != 1 {
        return Err(syn::Error::new(
            sig.inputs
                .span()
                .join(sig.ident.span())
                .unwrap_or(sig.ident.span()),
            "a listener takes exactly one argument, `msg: Message<T>`",
        ));
    }
    let arg = match &sig.inputs[0] {
        FnArg::Receiver(r) => {
            return Err(syn::Error::new(
                r.span(),
                "a listener is a free function, not a method: it takes `msg: Message<T>`",
            ));
        }
        FnArg::Typed(t) => t,
    };
    if !is_message_type(&arg.ty) {
        return Err(syn::Error::new(
            arg.ty.span(),
            "the listener's argument must be `Message<T>`, where T is a `serde::Deserialize` \
             payload type or `Raw` for the bytes as sent",
        ));
    }
    if let syn::ReturnType::Default = sig.output {
        return Err(syn::Error::new(
            sig.paren_token.span.close(),
            "a listener returns `Result<(), HandlerError>`",
        ));
    }
    Ok(Handler {
        ident: sig.ident.clone(),
    })
}

fn is_message_type(ty: &syn::Type) -> bool {
    let syn::Type::Path(p) = ty else {
        return false;
    };
    if p.qself.is_some() {
        return false;
    }
    let Some(last) = p.path.segments.last() else {
        return false;
    };
    last.ident == "Message"
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
            name = "n",
            ack = "manual",
            max_retries = 7
        ))
        .unwrap();
        assert_eq!((a.group.as_str(), a.stream.as_str()), ("g", "s"));
        assert_eq!(a.concurrency, Some(4));
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
                "unknown key `colour`",
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
            (quote!(group = "g", stream = "s", ack = "later"), "`ack` is"),
            (quote!(group, stream = "s"), "key = value"),
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
        assert_eq!(check_handler(&ok).unwrap().ident, "f");
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
                "exactly one argument",
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
            let err = check_handler(&f).unwrap_err().to_string();
            assert!(err.contains(needle), "{err}");
        }
    }
}
