//! Workload-identity tokens (PROTOCOL §20, "JWT"): signed JWTs checked against the JWKS
//! files of the ACL's `[[jwt]]` entries, e.g. Kubernetes projected service-account tokens.
//!
//! The checks, in order, each with its own `401` message: the token decodes (`malformed`);
//! its `alg` is RS256, ES256 or EdDSA (`algorithm`: never `none` or a shared secret); an
//! entry names its `iss` (`issuer`); that issuer's JWKS holds its `kid` (`kid`); the
//! signature verifies (`signature`); `exp` is present and not past, `nbf` not ahead, both
//! with the ACL's leeway (`expired`, `not_yet_valid`); an entry of the issuer names one of
//! its `aud` (`audience`); and one of those matches its `sub` (`subject`). Claims are read
//! from the verified token only; the issuer and `kid` are looked at before, to find the key.

use super::glob::Glob;
use super::refusal::{Refusal, rfc3339};
use crate::watch::{Stamp, stamp};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

/// Verifies `token` against `rules` at `now` (Unix seconds) with `leeway` seconds on `exp`
/// and `nbf`. Returns the verified `sub` and the indices of the rules it satisfies (issuer,
/// audience and subject), in order; or which check failed.
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

/// `exp` (required) and `nbf` (when present) against `now`, with `leeway` seconds.
fn check_times(claims: &Value, leeway: i64, now: i64) -> Result<(), Refusal> {
    let Some(exp) = claims.get("exp").and_then(Value::as_i64) else {
        return Err(refuse(
            "jwt_malformed",
            "malformed JWT: it has no numeric exp claim",
        ));
    };
    if exp + leeway < now {
        return Err(refuse(
            "jwt_expired",
            format!("JWT expired at {} (leeway {leeway} s)", rfc3339(exp)),
        ));
    }
    if let Some(nbf) = claims.get("nbf") {
        let Some(nbf) = nbf.as_i64() else {
            return Err(refuse(
                "jwt_malformed",
                "malformed JWT: nbf is not a number",
            ));
        };
        if nbf - leeway > now {
            return Err(refuse(
                "jwt_not_yet_valid",
                format!(
                    "JWT is not valid before {} (leeway {leeway} s)",
                    rfc3339(nbf)
                ),
            ));
        }
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
