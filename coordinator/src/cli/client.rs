//! The CLI's side of the shared coordinator client ([`rsc_api`]): its timeouts and user
//! agent, which answers are refusals, and the one-line error messages it prints.
//!
//! Every answer is kept twice ([`Fetched`]): as the typed view (to render tables) and as the
//! JSON the coordinator sent (printed unchanged by `--output json`, so that fields added by a
//! newer coordinator reach scripts).

pub(super) use rsc_api::{CoordinatorClient as Client, CoordinatorError as ClientError, Fetched};
use std::time::Duration;

/// How long one request may take before the CLI gives up on it.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A client for the coordinator at `base` (e.g. `http://127.0.0.1:7070`), sending
/// `Authorization: Bearer TOKEN` when a token (or token file) is given, with `tls` for an
/// `https://` base.
pub(super) fn connect(
    base: &str,
    token: Option<rsc_protocol::redact::SecretString>,
    token_file: Option<std::path::PathBuf>,
    tls: rsc_api::ClientTls,
) -> Result<Client, ClientError> {
    Client::builder([base])
        .token(token)
        .token_file(token_file)
        .tls(tls)
        .timeout(REQUEST_TIMEOUT)
        .connect_timeout(CONNECT_TIMEOUT)
        .user_agent(concat!("rsc-coordinator-cli/", env!("CARGO_PKG_VERSION")))
        .build()
}

/// Whether the coordinator refused the request itself (a 4xx answer): the request, the
/// token or the target is wrong, and repeating it unchanged will not help.
pub(super) fn is_refusal(e: &ClientError) -> bool {
    matches!(e, ClientError::Api { status, .. } if (400..500).contains(status))
}

/// Where the CLI looks for the coordinator, printed under a transport error.
const WHERE_HINT: &str = "hint: point the CLI at the coordinator with --coordinator URL or RSC_COORDINATOR_URL \
     (default http://127.0.0.1:7070)";

/// The message printed after `error: `: `CODE: message` for a refusal; the URL requested
/// (or, for an answer that is not the API's, the coordinator's) and what went wrong
/// otherwise.
pub(super) fn message(e: &ClientError) -> String {
    match e {
        ClientError::Api { code, message, .. } => format!("{code}: {message}"),
        ClientError::Transport { url, source } if e.is_timeout() => {
            let url = source.url().map_or(url.as_str(), reqwest::Url::as_str);
            format!(
                "cannot reach the coordinator at {url}: no answer within {REQUEST_TIMEOUT:?}\n\
                 {WHERE_HINT}"
            )
        }
        ClientError::Transport { .. } => format!("{e}\n{WHERE_HINT}"),
        ClientError::Unexpected { url, status, body } => {
            let status = reqwest::StatusCode::from_u16(*status)
                .map_or_else(|_| status.to_string(), |s| s.to_string());
            format!("unexpected answer from {url} (HTTP {status}): {body}")
        }
        _ => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rsc_protocol::ErrorCode;

    #[test]
    fn refusals_print_their_code_and_message() {
        let e = ClientError::Api {
            url: "http://h:1/v1/groups/nope".into(),
            status: 404,
            code: ErrorCode::GroupNotFound,
            message: "group nope does not exist".into(),
            retry_after_ms: None,
        };
        assert!(is_refusal(&e));
        assert_eq!(message(&e), "GROUP_NOT_FOUND: group nope does not exist");
    }

    #[test]
    fn unexpected_answers_name_the_url_and_status() {
        let e = ClientError::Unexpected {
            url: "http://h:1".into(),
            status: 502,
            body: "bad gateway".into(),
        };
        assert!(!is_refusal(&e));
        assert_eq!(
            message(&e),
            "unexpected answer from http://h:1 (HTTP 502 Bad Gateway): bad gateway"
        );
    }

    #[test]
    fn bad_base_urls_are_refused() {
        let e = connect("127.0.0.1:7070", None, None, rsc_api::ClientTls::default()).unwrap_err();
        assert!(matches!(e, ClientError::InvalidUrl(_)));
        assert_eq!(
            message(&e),
            "invalid coordinator URL \"127.0.0.1:7070\": expected e.g. http://127.0.0.1:7070"
        );
    }
}
