//! Keeping secrets out of logs and `Debug` output, shared by the coordinator and the client:
//! bearer tokens and passwords in Redis URLs.

/// What a hidden secret prints as.
pub const REDACTED: &str = "<redacted>";

/// A Redis URL, or a comma-separated list of them, with any password hidden:
/// `redis://app:secret@host:6379` becomes `redis://app:<redacted>@host:6379`.
///
/// ```
/// use rsc_protocol::redact::redact_url;
/// assert_eq!(redact_url("redis://:pw@r1:6379,redis://r2"), "redis://<redacted>@r1:6379,redis://r2");
/// ```
pub fn redact_url(urls: &str) -> String {
    urls.split(',')
        .map(|u| match (u.find("://"), u.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme + 3 => {
                let creds = &u[scheme + 3..at];
                let user = match creds.split_once(':') {
                    Some((user, _)) if !user.is_empty() => format!("{user}:"),
                    _ => String::new(),
                };
                format!("{}{user}{REDACTED}{}", &u[..scheme + 3], &u[at..])
            }
            _ => u.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `Some("<redacted>")` for a present secret, `None` for an absent one (for `Debug` fields).
pub fn redact_opt<T>(secret: &Option<T>) -> Option<&'static str> {
    secret.as_ref().map(|_| REDACTED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_hidden_and_the_rest_kept() {
        assert_eq!(
            redact_url("redis://app:pa55@r1:6379,redis://:pa55@r2:6379,redis://r3:6379"),
            "redis://app:<redacted>@r1:6379,redis://<redacted>@r2:6379,redis://r3:6379"
        );
        assert_eq!(redact_url("rediss://user@h"), "rediss://<redacted>@h");
        assert_eq!(redact_url("not a url"), "not a url");
    }
}
