//! Workload-identity tokens (PROTOCOL §20, "JWT"): signed JWTs checked against the JWKS
//! files of the ACL's `[[jwt]]` entries, e.g. Kubernetes projected service-account tokens.
//!
//! The checks, in order, each with its own `401` message: the token decodes (`malformed`);
//! its `alg` is RS256, ES256 or EdDSA (`algorithm`: never `none` or a shared secret); an
//! entry names its `iss` (`issuer`); that issuer's JWKS holds its `kid` (`kid`); the
//! signature verifies (`signature`); `exp` (required) and `nbf` are whole seconds from 0 to
//! the end of year 9999 (`time_claim`); `exp` is not past, `nbf` not ahead, both with the
//! ACL's leeway (`expired`, `not_yet_valid`); an entry of the issuer names one of its `aud`
//! (`audience`); one of those matches its `sub` (`subject`); and, for an entry with
//! `max_token_age`, the token has an `iat` not ahead of now (with the leeway) and lives
//! `exp - iat` seconds at most that long (`lifetime`). Claims are read from the verified
//! token only; the issuer and `kid` are looked at before, to find the key.
//!
//! The time arithmetic cannot overflow: claims are bounded before any sum, and the sums
//! that take `now` saturate.

use super::glob::Glob;
use super::refusal::{Refusal, rfc3339};
use crate::watch::{Stamp, stamp};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The latest NumericDate accepted in `exp`, `nbf` and `iat`: 9999-12-31T23:59:59Z.
pub(crate) const MAX_NUMERIC_DATE: i64 = 253_402_300_799;

/// The signature algorithms accepted (asymmetric only).
const ALGORITHMS: [Algorithm; 3] = [Algorithm::RS256, Algorithm::ES256, Algorithm::EdDSA];

/// One public key of a JWKS file.
struct Key {
    kid: Option<String>,
    alg: Algorithm,
    key: DecodingKey,
}

/// The usable public keys of one JWKS file, as read.
pub(crate) struct Jwks {
    path: PathBuf,
    keys: Vec<Key>,
    stamp: Stamp,
}

impl std::fmt::Debug for Jwks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Jwks")
            .field("path", &self.path)
            .field("keys", &self.keys.len())
            .finish()
    }
}

/// The algorithm a JWK is used with: its `alg`, else the one its key type and curve allow;
/// `None` for keys that cannot verify RS256, ES256 or EdDSA (encryption keys, shared
/// secrets, other curves), which are left out.
fn key_algorithm(jwk: &Jwk) -> Option<Algorithm> {
    if jwk.common.public_key_use == Some(PublicKeyUse::Encryption) {
        return None;
    }
    let by_type = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => Algorithm::RS256,
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Algorithm::ES256,
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
            Algorithm::EdDSA
        }
        _ => return None,
    };
    match jwk.common.key_algorithm.map(Algorithm::try_from) {
        None => Some(by_type),
        Some(Ok(alg)) if alg == by_type => Some(alg),
        Some(_) => None,
    }
}

impl Jwks {
    /// Reads a JWKS file (`{"keys": [...]}`); an error names the file. Keys it cannot use
    /// are skipped; a file without one usable key is an error.
    pub(crate) fn load(path: &Path) -> Result<Self, String> {
        let stamp = stamp(path);
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read JWKS file {}: {e}", path.display()))?;
        let bad = |why: String| format!("JWKS file {}: {why}", path.display());
        let doc: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let Some(list) = doc.get("keys").and_then(Value::as_array) else {
            return Err(bad("no \"keys\" array".into()));
        };
        let keys: Vec<Key> = list
            .iter()
            .filter_map(|v| serde_json::from_value::<Jwk>(v.clone()).ok())
            .filter_map(|jwk| {
                let alg = key_algorithm(&jwk)?;
                let key = DecodingKey::from_jwk(&jwk).ok()?;
                // An Ed25519 public key is 32 bytes (RFC 8037); the verifier expects that.
                if alg == Algorithm::EdDSA && key.try_get_as_bytes().map_or(true, |b| b.len() != 32)
                {
                    return None;
                }
                Some(Key {
                    kid: jwk.common.key_id.clone(),
                    alg,
                    key,
                })
            })
            .collect();
        if keys.is_empty() {
            return Err(bad(
                "holds no usable public key (RSA, EC P-256 or Ed25519 signing keys)".into(),
            ));
        }
        Ok(Jwks {
            path: path.to_owned(),
            keys,
            stamp,
        })
    }

    /// The file and its stamp before it was read (a change after that is seen).
    pub(crate) fn file(&self) -> (&Path, Stamp) {
        (&self.path, self.stamp)
    }
}

/// What a `[[jwt]]` entry accepts: the issuer, one audience, a subject glob, and the keys.
#[derive(Debug)]
pub(crate) struct JwtRule {
    /// `iss`, exactly.
    pub(crate) issuer: String,
    /// One of `aud`, exactly.
    pub(crate) audience: String,
    /// `sub`, as a glob.
    pub(crate) subject: Glob,
    /// The keys of its `jwks_file` (shared by the entries naming the same file).
    pub(crate) jwks: Arc<Jwks>,
    /// `max_token_age`: the longest lifetime (`exp - iat`, seconds) accepted; `None`: any
    /// (and `iat` is not needed).
    pub(crate) max_token_age: Option<i64>,
}

/// Whether a bearer token has a JWT's shape: three non-empty base64url parts joined by dots.
pub(crate) fn looks_like_jwt(token: &str) -> bool {
    let parts: Vec<&str> = token.split('.').collect();
    parts.len() == 3
        && parts.iter().all(|p| {
            !p.is_empty()
                && p.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        })
}

fn refuse(check: &'static str, message: impl Into<String>) -> Refusal {
    Refusal::new(check, message)
}

/// Verifies `token` against `rules` at `now` (Unix seconds) with `leeway` seconds on `exp`,
/// `nbf` (and `iat` for `max_token_age`). Returns the verified `sub` and the indices of the
/// rules it satisfies (issuer, audience, subject and lifetime), in order; or which check
/// failed (for the lifetime, the first entry's refusal).
pub(crate) fn verify(
    token: &str,
    rules: &[&JwtRule],
    leeway: i64,
    now: i64,
) -> Result<(String, Vec<usize>), Refusal> {
    let header = jsonwebtoken::decode_header(token)
        .map_err(|e| refuse("jwt_malformed", format!("malformed JWT: its header: {e}")))?;
    if !ALGORITHMS.contains(&header.alg) {
        return Err(refuse(
            "jwt_algorithm",
            format!(
                "JWT algorithm {:?} is not accepted (RS256, ES256 or EdDSA)",
                header.alg
            ),
        ));
    }
    let unverified: Value = jsonwebtoken::dangerous::insecure_decode_claims(token)
        .map_err(|e| refuse("jwt_malformed", format!("malformed JWT: its claims: {e}")))?;
    let issuer = unverified.get("iss").and_then(Value::as_str).unwrap_or("");
    let of_issuer: Vec<usize> = (0..rules.len())
        .filter(|&i| rules[i].issuer == issuer)
        .collect();
    if of_issuer.is_empty() {
        return Err(refuse(
            "jwt_issuer",
            format!("JWT issuer {issuer:?} is not accepted: no [[jwt]] entry names it"),
        ));
    }
    let key = find_key(rules, &of_issuer, header.kid.as_deref())?;
    if key.alg != header.alg {
        return Err(refuse(
            "jwt_algorithm",
            format!(
                "JWT algorithm {:?} does not match the key of its kid",
                header.alg
            ),
        ));
    }
    let claims = verified_claims(token, key)?;
    check_times(&claims, leeway, now)?;
    let matching = check_audience_and_subject(rules, of_issuer, &claims)?;
    let mut refused = None;
    let matching: Vec<usize> = matching
        .into_iter()
        .filter(
            |&i| match check_lifetime(rules[i].max_token_age, &claims, leeway, now) {
                Ok(()) => true,
                Err(r) => {
                    refused.get_or_insert(r);
                    false
                }
            },
        )
        .collect();
    if let (true, Some(r)) = (matching.is_empty(), refused) {
        return Err(r);
    }
    let sub = claims["sub"].as_str().unwrap_or_default().to_owned();
    Ok((sub, matching))
}

/// The key of `kid` in the JWKS of the issuer's entries; without a `kid`, the one key
/// they hold.
fn find_key<'a>(
    rules: &[&'a JwtRule],
    of_issuer: &[usize],
    kid: Option<&str>,
) -> Result<&'a Key, Refusal> {
    // Each JWKS file once, though several entries of the issuer may name it.
    let mut files: Vec<&Jwks> = Vec::new();
    for &i in of_issuer {
        if !files.iter().any(|f| f.path == rules[i].jwks.path) {
            files.push(&rules[i].jwks);
        }
    }
    let mut keys = files.into_iter().flat_map(|f| f.keys.iter());
    match kid {
        Some(kid) => keys.find(|k| k.kid.as_deref() == Some(kid)).ok_or_else(|| {
            refuse(
                "jwt_kid",
                format!("JWT key id (kid) {kid:?} is unknown to its issuer's JWKS"),
            )
        }),
        None => {
            let all: Vec<&Key> = keys.collect();
            match all.as_slice() {
                [one] => Ok(one),
                _ => Err(refuse(
                    "jwt_kid",
                    "JWT header has no key id (kid), and its issuer's JWKS holds several keys",
                )),
            }
        }
    }
}

/// The claims of `token` once its signature verified with `key` (no claim checked yet).
fn verified_claims(token: &str, key: &Key) -> Result<Value, Refusal> {
    let mut validation = Validation::new(key.alg);
    validation.required_spec_claims.clear();
    validation.validate_exp = false;
    validation.validate_nbf = false;
    validation.validate_aud = false;
    match jsonwebtoken::decode::<Value>(token, &key.key, &validation) {
        Ok(data) => Ok(data.claims),
        Err(e) => {
            use jsonwebtoken::errors::ErrorKind;
            Err(match e.kind() {
                ErrorKind::InvalidSignature
                | ErrorKind::InvalidEcdsaKey
                | ErrorKind::InvalidEddsaKey
                | ErrorKind::InvalidRsaKey(_) => {
                    refuse("jwt_signature", "JWT signature is invalid")
                }
                _ => refuse("jwt_malformed", format!("malformed JWT: {e}")),
            })
        }
    }
}

/// The NumericDate claim `name`, when present: a whole number of seconds from 0 to
/// [`MAX_NUMERIC_DATE`]. A float, a number out of that range (`i64::MAX`, a negative one, a
/// 30-digit one) or another JSON type is refused (`jwt_time_claim`).
fn numeric_date(claims: &Value, name: &str) -> Result<Option<i64>, Refusal> {
    let Some(v) = claims.get(name) else {
        return Ok(None);
    };
    match v.as_i64() {
        Some(t) if (0..=MAX_NUMERIC_DATE).contains(&t) => Ok(Some(t)),
        _ => {
            let mut shown = v.to_string();
            if shown.len() > 40 {
                let cut = (0..=40)
                    .rev()
                    .find(|&i| shown.is_char_boundary(i))
                    .unwrap_or(0);
                shown.truncate(cut);
                shown.push('…');
            }
            Err(refuse(
                "jwt_time_claim",
                format!(
                    "JWT {name} must be a whole number of seconds from 0 to {MAX_NUMERIC_DATE} \
                     (9999-12-31T23:59:59Z), not {shown}"
                ),
            ))
        }
    }
}

/// `exp` (required) and `nbf` (when present) against `now`, with `leeway` seconds: expired
/// when `exp < now - leeway`, not yet valid when `nbf > now + leeway`.
fn check_times(claims: &Value, leeway: i64, now: i64) -> Result<(), Refusal> {
    let Some(exp) = numeric_date(claims, "exp")? else {
        return Err(refuse(
            "jwt_malformed",
            "malformed JWT: it has no numeric exp claim",
        ));
    };
    if exp < now.saturating_sub(leeway) {
        return Err(refuse(
            "jwt_expired",
            format!("JWT expired at {} (leeway {leeway} s)", rfc3339(exp)),
        ));
    }
    if let Some(nbf) = numeric_date(claims, "nbf")?
        && nbf > now.saturating_add(leeway)
    {
        return Err(refuse(
            "jwt_not_yet_valid",
            format!(
                "JWT is not valid before {} (leeway {leeway} s)",
                rfc3339(nbf)
            ),
        ));
    }
    Ok(())
}

/// An entry's `max_token_age` (`None`: no check): the token needs an `iat` not ahead of
/// `now + leeway`, and `exp - iat` at most `max` seconds — so it is never accepted later
/// than `max + leeway` seconds from now. Runs after [`check_times`] (`exp` is valid).
fn check_lifetime(max: Option<i64>, claims: &Value, leeway: i64, now: i64) -> Result<(), Refusal> {
    let Some(max) = max else {
        return Ok(());
    };
    let Some(iat) = numeric_date(claims, "iat")? else {
        return Err(refuse(
            "jwt_lifetime",
            format!("JWT has no iat claim, and its [[jwt]] entry sets max_token_age {max} s"),
        ));
    };
    if iat > now.saturating_add(leeway) {
        return Err(refuse(
            "jwt_lifetime",
            format!(
                "JWT is issued in the future (iat {}, leeway {leeway} s)",
                rfc3339(iat)
            ),
        ));
    }
    let exp = numeric_date(claims, "exp")?.unwrap_or(MAX_NUMERIC_DATE);
    let lifetime = exp.saturating_sub(iat);
    if lifetime > max {
        return Err(refuse(
            "jwt_lifetime",
            format!(
                "JWT lifetime {lifetime} s (exp - iat) exceeds the max_token_age {max} s of \
                 its [[jwt]] entry"
            ),
        ));
    }
    Ok(())
}

/// The entries of the issuer that name one of the token's audiences and match its subject.
fn check_audience_and_subject(
    rules: &[&JwtRule],
    of_issuer: Vec<usize>,
    claims: &Value,
) -> Result<Vec<usize>, Refusal> {
    let audiences: Vec<&str> = match claims.get("aud") {
        Some(Value::String(a)) => vec![a.as_str()],
        Some(Value::Array(list)) => list.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let of_audience: Vec<usize> = of_issuer
        .into_iter()
        .filter(|&i| audiences.contains(&rules[i].audience.as_str()))
        .collect();
    if of_audience.is_empty() {
        return Err(refuse(
            "jwt_audience",
            format!("JWT audience {audiences:?} is not accepted for its issuer"),
        ));
    }
    let Some(sub) = claims.get("sub").and_then(Value::as_str) else {
        return Err(refuse(
            "jwt_malformed",
            "malformed JWT: it has no sub claim",
        ));
    };
    let matching: Vec<usize> = of_audience
        .into_iter()
        .filter(|&i| rules[i].subject.matches(sub))
        .collect();
    if matching.is_empty() {
        return Err(refuse(
            "jwt_subject",
            format!("JWT subject {sub:?} is not accepted by the [[jwt]] entries of its issuer"),
        ));
    }
    Ok(matching)
}

/// The Ed25519 key pair of the unit tests, and a signer.
#[cfg(test)]
pub(crate) mod test_keys {
    use jsonwebtoken::{Algorithm, EncodingKey, Header};

    /// A key made for these tests (PKCS#8 DER, hex).
    pub(crate) const KEY: &str = "302e020100300506032b6570042204206dcb4d98ff609b3e2696ba85dec4ee0a631f07631429791256d221d22f75f9f3";
    /// Its public key, as a JWK's `x`.
    pub(crate) const KEY_X: &str = "4zhzilxqk7TbTTSPFypfaGZXRQ4x5PFnSy3RcTHZcMo";
    /// Another key, in no JWKS.
    pub(crate) const OTHER: &str = "302e020100300506032b6570042204201bdb96f485b9fdcb6ddb81de078386bc7890f53aa3f5fc34a43170d12449f82f";

    fn der(hex: &str) -> Vec<u8> {
        (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
            .collect()
    }

    /// `claims` signed with `key` (hex DER), `alg` and `kid` in the header.
    pub(crate) fn sign(
        key: &str,
        kid: Option<&str>,
        alg: Algorithm,
        claims: serde_json::Value,
    ) -> String {
        let mut header = Header::new(alg);
        header.kid = kid.map(str::to_owned);
        jsonwebtoken::encode(&header, &claims, &EncodingKey::from_ed_der(&der(key))).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::test_keys::{KEY, KEY_X, OTHER, sign};
    use super::*;
    use jsonwebtoken::{EncodingKey, Header};
    use serde_json::json;

    const NOW: i64 = 1_796_283_000;

    fn claims() -> Value {
        json!({"iss": "https://k8s", "aud": ["rsc", "other"], "exp": NOW + 600, "nbf": NOW - 5,
            "sub": "system:serviceaccount:billing:consumer"})
    }

    fn rule(subject: &str) -> JwtRule {
        let jwks = Jwks {
            path: PathBuf::from("jwks.json"),
            keys: vec![Key {
                kid: Some("k1".into()),
                alg: Algorithm::EdDSA,
                key: DecodingKey::from_ed_components(KEY_X).unwrap(),
            }],
            stamp: None,
        };
        JwtRule {
            issuer: "https://k8s".into(),
            audience: "rsc".into(),
            subject: Glob::new(subject),
            jwks: Arc::new(jwks),
            max_token_age: None,
        }
    }

    fn check(token: &str) -> Result<(String, Vec<usize>), Refusal> {
        let (a, b) = (rule("system:serviceaccount:shop:*"), rule("*:billing:*"));
        verify(token, &[&a, &b], 30, NOW)
    }

    fn with(f: impl FnOnce(&mut Value)) -> Value {
        let mut c = claims();
        f(&mut c);
        c
    }

    #[test]
    fn a_valid_token_gives_its_subject_and_the_entries_that_accept_it() {
        let t = sign(KEY, Some("k1"), Algorithm::EdDSA, claims());
        assert!(looks_like_jwt(&t));
        let (sub, matching) = check(&t).unwrap();
        assert_eq!(sub, "system:serviceaccount:billing:consumer");
        assert_eq!(matching, vec![1]);
        // A single audience string, and exp within the leeway.
        let c = with(|c| {
            c["aud"] = json!("rsc");
            c["exp"] = json!(NOW - 20);
        });
        assert!(check(&sign(KEY, Some("k1"), Algorithm::EdDSA, c)).is_ok());
        // Without a kid, the one key of the issuer.
        assert!(check(&sign(KEY, None, Algorithm::EdDSA, claims())).is_ok());
    }

    #[test]
    fn each_failed_check_is_named() {
        let ed = |c: Value| sign(KEY, Some("k1"), Algorithm::EdDSA, c);
        let cases: Vec<(String, &str, &str)> = vec![
            ("a.b.c".into(), "jwt_malformed", "malformed JWT"),
            (
                ed(with(|c| c["iss"] = json!("https://evil"))),
                "jwt_issuer",
                "issuer \"https://evil\" is not accepted",
            ),
            (
                sign(KEY, Some("k9"), Algorithm::EdDSA, claims()),
                "jwt_kid",
                "kid) \"k9\" is unknown",
            ),
            (
                sign(OTHER, Some("k1"), Algorithm::EdDSA, claims()),
                "jwt_signature",
                "signature is invalid",
            ),
            (
                ed(with(|c| c["exp"] = json!(NOW - 31))),
                "jwt_expired",
                "JWT expired at 2026-12-03T07:29:29Z (leeway 30 s)",
            ),
            (
                ed(with(|c| c["nbf"] = json!(NOW + 60))),
                "jwt_not_yet_valid",
                "not valid before 2026-12-03T07:31:00Z",
            ),
            (
                ed(with(|c| c["aud"] = json!(["api"]))),
                "jwt_audience",
                "audience [\"api\"] is not accepted",
            ),
            (
                ed(with(|c| c["sub"] = json!("system:serviceaccount:ops:x"))),
                "jwt_subject",
                "subject \"system:serviceaccount:ops:x\" is not accepted",
            ),
            (
                ed(with(|c| {
                    c.as_object_mut().unwrap().remove("exp");
                })),
                "jwt_malformed",
                "no numeric exp",
            ),
        ];
        for (token, reason, message) in cases {
            let r = check(&token).unwrap_err();
            assert_eq!(r.reason, reason, "{}", r.message);
            assert!(r.message.contains(message), "{} vs {message}", r.message);
        }
    }

    /// Signed tokens whose time claims are at the edges of, or outside, what fits: refused
    /// with a reason (no panic in a debug build, no wrap-around in a release one).
    #[test]
    fn time_claims_at_the_edges_are_refused_without_overflow() {
        let ed = |c: Value| sign(KEY, Some("k1"), Algorithm::EdDSA, c);
        let out_of_range = [
            json!(i64::MAX),
            json!(i64::MIN),
            json!(u64::MAX),
            json!(-1),
            json!(MAX_NUMERIC_DATE + 1),
            json!(1.5e9),
            json!(1_796_283_600.0),
            json!(1e300),
            json!("1796283600"),
            json!(null),
        ];
        for v in &out_of_range {
            for claim in ["exp", "nbf"] {
                let r = check(&ed(with(|c| c[claim] = v.clone()))).unwrap_err();
                assert_eq!(r.reason, "jwt_time_claim", "{claim} = {v}: {}", r.message);
                assert!(
                    r.message
                        .contains(&format!("JWT {claim} must be a whole number")),
                    "{}",
                    r.message
                );
            }
        }
        // An array does not even decode (jsonwebtoken reads exp and nbf to validate them).
        let r = check(&ed(with(|c| c["exp"] = json!([NOW])))).unwrap_err();
        assert_eq!(r.reason, "jwt_malformed", "{}", r.message);
        // A 30-digit number: serde_json reads it as a float; the message is bounded.
        let huge = "{\"iss\":\"https://k8s\",\"aud\":\"rsc\",\"sub\":\"a:billing:b\",\
                    \"exp\":123456789012345678901234567890}";
        let huge: Value = serde_json::from_str(huge).unwrap();
        let r = check(&ed(huge)).unwrap_err();
        assert_eq!(r.reason, "jwt_time_claim", "{}", r.message);
        // The last second that fits is accepted; the first one is too.
        for exp in [MAX_NUMERIC_DATE, NOW - 30] {
            assert!(check(&ed(with(|c| c["exp"] = json!(exp)))).is_ok(), "{exp}");
        }
        assert!(check(&ed(with(|c| c["nbf"] = json!(0)))).is_ok());
        // An extreme leeway and clock do not overflow either.
        let (a, b) = (rule("x"), rule("*:billing:*"));
        let t = ed(claims());
        for (leeway, now) in [(i64::MAX, i64::MAX), (i64::MAX, i64::MIN), (0, i64::MIN)] {
            let _ = verify(&t, &[&a, &b], leeway, now);
        }
    }

    #[test]
    fn max_token_age_bounds_the_lifetime_and_needs_iat() {
        let ed = |c: Value| sign(KEY, Some("k1"), Algorithm::EdDSA, c);
        let mut short = rule("*:billing:*");
        short.max_token_age = Some(3600);
        let lax = rule("*:billing:*");
        let verify_with = |rules: &[&JwtRule], c: Value| verify(&ed(c), rules, 30, NOW);
        let lived = |iat: i64, exp: i64| {
            with(|c| {
                c["iat"] = json!(iat);
                c["exp"] = json!(exp);
            })
        };
        // Within the bound, at the bound.
        assert!(verify_with(&[&short], lived(NOW - 10, NOW + 600)).is_ok());
        assert!(verify_with(&[&short], lived(NOW - 10, NOW - 10 + 3600)).is_ok());
        let cases = [
            (
                lived(NOW - 10, NOW - 10 + 3601),
                "lifetime 3601 s (exp - iat) exceeds",
            ),
            (
                lived(NOW, MAX_NUMERIC_DATE),
                "exceeds the max_token_age 3600 s",
            ),
            (claims(), "no iat claim"),
            // Issued in the future with a short lifetime: would stay valid for long.
            (
                lived(NOW + 86_400, NOW + 86_400 + 60),
                "issued in the future",
            ),
        ];
        for (c, words) in cases {
            let r = verify_with(&[&short], c.clone()).unwrap_err();
            assert_eq!(r.reason, "jwt_lifetime", "{}", r.message);
            assert!(r.message.contains(words), "{} vs {words}", r.message);
            // An entry without the bound still accepts it, and is the one that grants.
            let (_, matching) = verify_with(&[&short, &lax], c).unwrap();
            assert_eq!(matching, vec![1]);
        }
        // iat within the leeway ahead is accepted; a bad iat is a time-claim refusal.
        assert!(verify_with(&[&short], lived(NOW + 30, NOW + 600)).is_ok());
        let r = verify_with(&[&short], with(|c| c["iat"] = json!(1.5))).unwrap_err();
        assert_eq!(r.reason, "jwt_time_claim", "{}", r.message);
        // Without max_token_age, iat is not looked at.
        assert!(verify_with(&[&lax], with(|c| c["iat"] = json!("never"))).is_ok());
    }

    proptest::proptest! {
        /// Whatever the integers in exp, nbf and iat (and the clock): an answer, never a
        /// panic; and an accepted token's exp and nbf are within the leeway of now.
        #[test]
        fn any_time_claims_get_an_answer(
            exp in proptest::prelude::any::<i64>(),
            nbf in proptest::prelude::any::<i64>(),
            iat in proptest::prelude::any::<i64>(),
            now in proptest::prelude::any::<i64>(),
            leeway in 0i64..=3600,
            max in proptest::option::of(1i64..=i64::MAX),
        ) {
            let c = json!({"exp": exp, "nbf": nbf, "iat": iat, "sub": "a:billing:b",
                "aud": "rsc"});
            let times = check_times(&c, leeway, now);
            if times.is_ok() {
                proptest::prop_assert!(exp >= now.saturating_sub(leeway));
                proptest::prop_assert!(nbf <= now.saturating_add(leeway));
            }
            let life = check_lifetime(max, &c, leeway, now);
            if let (Ok(()), Some(max)) = (&life, max) {
                proptest::prop_assert!(exp.saturating_sub(iat) <= max);
            }
        }
    }

    #[test]
    fn symmetric_and_unsigned_algorithms_are_refused() {
        // HS256 signed with the public key as the secret: the classic confusion attack.
        let hs = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &claims(),
            &EncodingKey::from_secret(KEY_X.as_bytes()).unwrap(),
        )
        .unwrap();
        let r = check(&hs).unwrap_err();
        assert_eq!(r.reason, "jwt_algorithm", "{}", r.message);
        // alg "none": `eyJhbGciOiJub25lIn0` is {"alg":"none"}.
        let none = format!("eyJhbGciOiJub25lIn0.{}.", hs.split('.').nth(1).unwrap());
        assert!(!looks_like_jwt(&none));
        assert!(check(&none).is_err());
        assert!(!looks_like_jwt("plain-token"));
        assert!(!looks_like_jwt("a.b"));
        assert!(!looks_like_jwt("a.b.c=="));
    }
}
