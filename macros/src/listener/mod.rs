//! `#[stream_listener(group = "…", stream = "…", …)]`.

mod output;
mod parser;

use proc_macro2::TokenStream;

/// Parses the attribute and the function, then writes the function back unchanged followed by
/// its registration. A misuse becomes a `compile_error!` that says what to write instead; the
/// function is still emitted so that the error is the only one the user sees.
pub(crate) fn stream_listener(args: TokenStream, item: TokenStream) -> TokenStream {
    let func: syn::ItemFn = match syn::parse2(item.clone()) {
        Ok(f) => f,
        Err(_) => {
            let mut out = syn::Error::new(
                proc_macro2::Span::call_site(),
                "#[stream_listener] goes on an `async fn` taking one `Message<T>`",
            )
            .to_compile_error();
            out.extend(item);
            return out;
        }
    };
    let parsed = parser::ListenerArgs::parse(args).and_then(|a| {
        let handler = parser::check_handler(&func, a.batch.is_some())?;
        Ok((a, handler))
    });
    match parsed {
        Ok((a, handler)) => output::expand(&func, &a, &handler),
        Err(e) => {
            let mut out = e.to_compile_error();
            out.extend(quote::quote!(#func));
            out
        }
    }
}
