//! Writing the expansion: the function unchanged, then a registration that builds its
//! `rsc_client::Listener` when `ConsumerApp::from_env()` collects the listeners.

use super::parser::{Ack, Handler, ListenerArgs};
use proc_macro2::TokenStream;
use quote::quote;

pub(crate) fn expand(func: &syn::ItemFn, args: &ListenerArgs, handler: &Handler) -> TokenStream {
    let ident = &handler.ident;
    // The payload and `Data` types named, so that the compiler picks the one handler impl
    // that fits and reports what the function lacks (a `Send` future, a `Deserialize`
    // payload) rather than "not a listener handler".
    let payload = &handler.payload;
    let data = &handler.data;
    let group = &args.group;
    let stream = &args.stream;
    let mut chain = TokenStream::new();
    if let Some(name) = &args.name {
        chain.extend(quote!(.name(#name)));
    }
    if let Some(n) = args.concurrency {
        chain.extend(quote!(.concurrency(#n)));
    }
    if let Some(n) = args.key_concurrency {
        let n = n as usize;
        chain.extend(quote!(.key_concurrency(#n)));
    }
    if let Some(n) = args.max_retries {
        chain.extend(quote!(.max_retries(#n)));
    }
    if let Some(stages) = &args.retry_stages {
        chain.extend(quote!(.retry_stages(&[#(::std::time::Duration::from_millis(#stages)),*])));
    }
    match args.ack {
        Some(Ack::Manual) => chain.extend(quote!(.ack_mode(::rsc_client::AckMode::Manual))),
        Some(Ack::Auto) => chain.extend(quote!(.ack_mode(::rsc_client::AckMode::Auto))),
        None => {}
    }
    let ctor_kind = if args.batch.is_some() {
        quote!(batch)
    } else {
        quote!(new)
    };
    // Spanned at the function's name: what the compiler says of the handler points there.
    let ctor = quote::quote_spanned! {ident.span()=>
        ::rsc_client::Listener::#ctor_kind::<#payload, (#(#data,)*), _>(#group, #stream, #ident)
    };
    if let Some(n) = args.batch {
        let n = n as usize;
        chain.extend(quote!(.max_batch(#n)));
        if let Some(ms) = args.linger_ms {
            let ms = u64::from(ms);
            chain.extend(quote!(.linger(::std::time::Duration::from_millis(#ms))));
        }
    }
    quote! {
        #func

        #[doc(hidden)]
        const _: () = {
            fn __rsc_build_listener() -> ::rsc_client::Listener {
                #ctor #chain
            }
            ::rsc_client::__private::inventory::submit! {
                ::rsc_client::__private::Registration::new(__rsc_build_listener)
            }
        };
    }
}
