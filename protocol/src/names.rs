//! Validation of group, stream and member ids (PROTOCOL §1).

/// The pattern every id matches (the OpenAPI document's `pattern`).
pub const NAME_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$";

/// The longest id allowed, in bytes.
pub const MAX_NAME_LEN: usize = 200;

/// Checks an id against `^[A-Za-z0-9][A-Za-z0-9._:-]{0,199}$`.
///
/// Returns a human explanation when the id is not valid.
///
/// ```
/// use rsc_protocol::names::validate_name;
/// assert!(validate_name("group", "billing-v2").is_ok());
/// assert!(validate_name("group", "-bad").is_err());
/// ```
pub fn validate_name(kind: &str, name: &str) -> Result<(), String> {
    let bytes = name.as_bytes();
    let Some(first) = bytes.first() else {
        return Err(format!("{kind} id must not be empty"));
    };
    if bytes.len() > MAX_NAME_LEN {
        return Err(format!(
            "{kind} id is {} bytes long; at most {MAX_NAME_LEN} are allowed",
            bytes.len()
        ));
    }
    if !first.is_ascii_alphanumeric() {
        return Err(format!(
            "{kind} id {name:?} must start with a letter or a digit"
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')))
    {
        return Err(format!(
            "{kind} id {name:?} contains {bad:?}; allowed are letters, digits and . _ : -"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_the_spec_alphabet() {
        for ok in [
            "a",
            "0",
            "orders",
            "127.0.0.11-billing-0",
            "a:b_c.d-e",
            &"x".repeat(200),
        ] {
            assert!(validate_name("group", ok).is_ok(), "{ok}");
        }
    }

    #[test]
    fn rejects_everything_else() {
        for bad in [
            "",
            "-a",
            ".a",
            "_a",
            ":a",
            "a b",
            "a/b",
            "a{b}",
            "ü",
            &"x".repeat(201),
        ] {
            assert!(validate_name("group", bad).is_err(), "{bad}");
        }
    }
}
