//! Workload-identity tokens (PROTOCOL §20, "JWT"), against a real coordinator: an RSA, a
//! P-256 and an Ed25519 key made by the test with `openssl`, their public keys in a JWKS
//! file that an ACL `[[jwt]]` entry names, and JWTs signed in the test (`jsonwebtoken`).
//! Tokens of each algorithm authenticate a member (a heartbeat joins); an admin JWT's
//! mutation is audited with `credential: jwt` and the token's `sub` as principal; each
//! refusal reason gives `401 UNAUTHENTICATED` saying which check failed, and is counted;
//! a JWKS file rewritten with a new key is used within a few seconds, without a restart.
//! Time claims that do not fit (`exp` = `i64::MAX`, a float) are refused with `401` and
//! the coordinator keeps serving; an entry's `max_token_age` refuses a token that lives
//! longer.

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use rsc_e2e::{Api, code};
use rsc_testkit::CoordinatorProcess;
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";
const AUDIENCE: &str = "rsc-coordinator";

/// A private key made with `openssl genpkey` (PKCS#8 PEM), its algorithm and key id.
struct TestKey {
    kid: &'static str,
    alg: Algorithm,
    key: EncodingKey,
}

fn genpkey(dir: &Path, name: &str, args: &[&str]) -> Vec<u8> {
    let path = dir.join(name);
    let status = Command::new("openssl")
        .arg("genpkey")
        .args(args)
        .arg("-out")
        .arg(&path)
        .status()
        .expect("openssl runs");
    assert!(status.success(), "openssl genpkey {args:?}");
    std::fs::read(path).unwrap()
}

fn keys(dir: &Path) -> Vec<TestKey> {
    let rsa = genpkey(
        dir,
        "rsa.pem",
        &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"],
    );
    let ec = genpkey(
        dir,
        "ec.pem",
        &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"],
    );
    let ed = genpkey(dir, "ed.pem", &["-algorithm", "ed25519"]);
    vec![
        TestKey {
            kid: "rsa-1",
            alg: Algorithm::RS256,
            key: EncodingKey::from_rsa_pem(&rsa).unwrap(),
        },
        TestKey {
            kid: "ec-1",
            alg: Algorithm::ES256,
            key: EncodingKey::from_ec_pem(&ec).unwrap(),
        },
        TestKey {
            kid: "ed-1",
            alg: Algorithm::EdDSA,
            key: EncodingKey::from_ed_pem(&ed).unwrap(),
        },
    ]
}

/// The JWKS of `keys`' public halves, as `kubectl get --raw /openid/v1/jwks` prints one.
fn jwks(keys: &[&TestKey]) -> String {
    let keys = keys
        .iter()
        .map(|k| {
            let mut jwk = Jwk::from_encoding_key(&k.key, k.alg).unwrap();
            jwk.common.key_id = Some(k.kid.to_owned());
            jwk
        })
        .collect();
    serde_json::to_string(&JwkSet { keys }).unwrap()
}

fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

/// Claims as a Kubernetes projected service-account token has them.
fn claims(sub: &str) -> Value {
    json!({"iss": ISSUER, "aud": [AUDIENCE], "sub": sub, "iat": now(), "nbf": now(),
        "exp": now() + 600,
        "kubernetes.io": {"namespace": "billing", "serviceaccount": {"name": "consumer"}}})
}

fn sign(key: &TestKey, kid: &str, claims: &Value) -> String {
    let mut header = Header::new(key.alg);
    header.kid = Some(kid.to_owned());
    jsonwebtoken::encode(&header, claims, &key.key).unwrap()
}

fn with(mut c: Value, field: &str, v: Value) -> Value {
    c[field] = v;
    c
}

const ACL: &str = r#"
[[tokens]]
principal = "ops"
token = "t-ops"
roles = ["admin"]
groups = ["*"]
streams = ["*"]

[[jwt]]
issuer = "ISSUER"
audience = "AUDIENCE"
jwks_file = "jwks.json"
subject = "system:serviceaccount:billing:*"
roles = ["member"]
groups = ["billing*"]

[[jwt]]
issuer = "ISSUER"
audience = "AUDIENCE"
jwks_file = "jwks.json"
subject = "system:serviceaccount:ops:deployer"
max_token_age = 3600
roles = ["admin"]
groups = ["*"]
streams = ["*"]
"#;

fn join(member: &str) -> Value {
    json!({"protocol_version": 1, "member_id": member, "member_epoch": 0, "owned_shards": []})
}

async fn heartbeat(base: &str, token: &str, member: &str) -> (u16, Value) {
    let (s, body) = Api::new(base)
        .with_token(token)
        .post("/v1/groups/billing/heartbeat", join(member))
        .await;
    (s.as_u16(), body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwts_authenticate_and_each_refusal_says_which_check_failed() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys(dir.path());
    std::fs::write(
        dir.path().join("jwks.json"),
        jwks(&keys.iter().collect::<Vec<_>>()),
    )
    .unwrap();
    let acl = dir.path().join("acl.toml");
    std::fs::write(
        &acl,
        ACL.replace("ISSUER", ISSUER).replace("AUDIENCE", AUDIENCE),
    )
    .unwrap();
    let acl = acl.display().to_string();
    let coordinator = CoordinatorProcess::start(&["--store", "memory", "--acl", &acl]).unwrap();
    let base = coordinator.url();

    // An admin JWT creates the group: audited with its credential and its subject.
    let deployer = sign(
        &keys[0],
        "rsa-1",
        &claims("system:serviceaccount:ops:deployer"),
    );
    let (s, body) = Api::new(&base)
        .with_token(&deployer)
        .post(
            "/v1/groups",
            json!({"group": "billing", "stream": "orders", "shard_count": 2}),
        )
        .await;
    assert_eq!(s.as_u16(), 201, "{body}");
    let (_, audit) = Api::new(&base).with_token("t-ops").get("/v1/audit").await;
    let entry = &audit["entries"][0];
    assert_eq!(entry["action"], "group.create", "{audit}");
    assert_eq!(entry["credential"], "jwt");
    assert_eq!(entry["principal"], "system:serviceaccount:ops:deployer");

    // A member JWT of each algorithm joins; a member JWT cannot create groups.
    let sub = "system:serviceaccount:billing:consumer";
    for (i, k) in keys.iter().enumerate() {
        let (s, body) = heartbeat(&base, &sign(k, k.kid, &claims(sub)), &format!("m{i}")).await;
        assert_eq!(s, 200, "{:?}: {body}", k.alg);
    }
    let member = sign(&keys[2], "ed-1", &claims(sub));
    let (s, body) = Api::new(&base)
        .with_token(&member)
        .post(
            "/v1/groups",
            json!({"group": "billing2", "stream": "o2", "shard_count": 1}),
        )
        .await;
    assert_eq!(s.as_u16(), 403, "{body}");

    // The admin entry's max_token_age: a deployer token living 2 h is refused.
    let long = with(
        claims("system:serviceaccount:ops:deployer"),
        "exp",
        json!(now() + 7200),
    );
    let (s, body) = Api::new(&base)
        .with_token(sign(&keys[0], "rsa-1", &long))
        .post(
            "/v1/groups",
            json!({"group": "billing3", "stream": "o3", "shard_count": 1}),
        )
        .await;
    assert_eq!(s.as_u16(), 401, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("exceeds the max_token_age 3600 s"),
        "{body}"
    );
    assert!(refusals_of(&base, "jwt_lifetime").await >= 1.0);

    refusals(&base, &keys, sub).await;
    jwks_rotation(&base, dir.path(), &keys, sub).await;
}

/// Every check that can fail, with the words its message must contain.
async fn refusals(base: &str, keys: &[TestKey], sub: &str) {
    let (rsa, ec, ed) = (&keys[0], &keys[1], &keys[2]);
    let good = claims(sub);
    let hs256 = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &good,
        &EncodingKey::from_secret(b"guessed").unwrap(),
    )
    .unwrap();
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "jwt_issuer",
            sign(
                rsa,
                "rsa-1",
                &with(good.clone(), "iss", json!("https://evil.example")),
            ),
            "JWT issuer \"https://evil.example\" is not accepted",
        ),
        (
            "jwt_audience",
            sign(ec, "ec-1", &with(good.clone(), "aud", json!(["vault"]))),
            "JWT audience [\"vault\"] is not accepted",
        ),
        (
            // Signed by the Ed25519 key, but claiming the RSA key's kid.
            "jwt_algorithm",
            sign(ed, "rsa-1", &good),
            "does not match",
        ),
        (
            "jwt_signature",
            {
                // The RSA key's token with another payload: the signature no longer fits.
                let t = sign(rsa, "rsa-1", &good);
                let other = sign(rsa, "rsa-1", &with(good.clone(), "sub", json!("x")));
                let parts: Vec<&str> = t.split('.').collect();
                let forged: Vec<&str> = other.split('.').collect();
                format!("{}.{}.{}", parts[0], forged[1], parts[2])
            },
            "JWT signature is invalid",
        ),
        (
            "jwt_expired",
            sign(rsa, "rsa-1", &with(good.clone(), "exp", json!(now() - 120))),
            "JWT expired at",
        ),
        (
            "jwt_not_yet_valid",
            sign(rsa, "rsa-1", &with(good.clone(), "nbf", json!(now() + 600))),
            "JWT is not valid before",
        ),
        (
            "jwt_kid",
            sign(rsa, "rsa-9", &good),
            "JWT key id (kid) \"rsa-9\" is unknown",
        ),
        (
            "jwt_subject",
            sign(rsa, "rsa-1", &claims("system:serviceaccount:shop:web")),
            "JWT subject \"system:serviceaccount:shop:web\" is not accepted",
        ),
        (
            "jwt_algorithm",
            hs256,
            "JWT algorithm HS256 is not accepted",
        ),
        // exp + leeway wrapped around (release) or panicked (debug) before: refused, and
        // the next cases show the coordinator still serving.
        (
            "jwt_time_claim",
            sign(rsa, "rsa-1", &with(good.clone(), "exp", json!(i64::MAX))),
            "JWT exp must be a whole number of seconds",
        ),
        (
            "jwt_time_claim",
            sign(rsa, "rsa-1", &with(good.clone(), "nbf", json!(i64::MIN))),
            "JWT nbf must be a whole number of seconds",
        ),
        (
            "jwt_time_claim",
            sign(
                ec,
                "ec-1",
                &with(good.clone(), "exp", json!(now() as f64 + 600.5)),
            ),
            "JWT exp must be a whole number of seconds",
        ),
        (
            "jwt_issuer",
            sign(
                rsa,
                "rsa-1",
                &with(good.clone(), "iss", json!("https://still-serving.example")),
            ),
            "JWT issuer \"https://still-serving.example\" is not accepted",
        ),
    ];
    for (reason, token, words) in &cases {
        let before = refusals_of(base, reason).await;
        let (s, body) = heartbeat(base, token, "m-refused").await;
        assert_eq!(
            (s, code(&body)),
            (401, "UNAUTHENTICATED"),
            "{reason}: {body}"
        );
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(words),
            "{reason}: {message:?} lacks {words:?}"
        );
        // Never which keys exist.
        assert!(
            !message.contains("ec-1") && !message.contains("ed-1"),
            "{message}"
        );
        let after = refusals_of(base, reason).await;
        assert!(after > before, "{reason} counted ({before} → {after})");
    }
}

/// `rsc_auth_refusals_total{reason}`, scraped with the admin token.
async fn refusals_of(base: &str, reason: &str) -> f64 {
    let (s, body) = Api::new(base).with_token("t-ops").get("/metrics").await;
    assert_eq!(s.as_u16(), 200, "{body}");
    let text = body.as_str().unwrap_or_default();
    rsc_e2e::metric_sum(text, "rsc_auth_refusals_total", &[("reason", reason)])
}

/// The JWKS file rewritten with a new key only: the new key's tokens are accepted and the
/// old key's refused within a few seconds (a 1 s poll), without a restart.
async fn jwks_rotation(base: &str, dir: &Path, keys: &[TestKey], sub: &str) {
    let pem = genpkey(dir, "ed-2.pem", &["-algorithm", "ed25519"]);
    let fresh = TestKey {
        kid: "ed-2",
        alg: Algorithm::EdDSA,
        key: EncodingKey::from_ed_pem(&pem).unwrap(),
    };
    let tmp = dir.join("jwks.json.tmp");
    std::fs::write(&tmp, jwks(&[&fresh])).unwrap();
    let started = Instant::now();
    std::fs::rename(&tmp, dir.join("jwks.json")).unwrap();
    let new_token = sign(&fresh, "ed-2", &claims(sub));
    let old_token = sign(&keys[0], "rsa-1", &claims(sub));
    loop {
        let (s, _) = heartbeat(base, &new_token, "m-new").await;
        let (old, body) = heartbeat(base, &old_token, "m-old").await;
        if s == 200 && old == 401 {
            assert!(
                body["error"]["message"].as_str().unwrap().contains("rsa-1"),
                "{body}"
            );
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the new JWKS was not used within 5 s ({s}, {old})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!(
        "JWKS rotation: new key accepted {:?} after the rename",
        started.elapsed()
    );
}
