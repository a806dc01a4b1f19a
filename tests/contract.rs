//! docs/PROTOCOL.md is the contract, and these tests keep it true: its error-code table
//! against `rsc_protocol::ErrorCode` (and the OpenAPI document's enum), its route table
//! against the routes a running coordinator describes in `/openapi.json`, its routing rows
//! against the hash and the vectors file, its entry fields and owner-token format against
//! the protocol crate's items; and every document of the repository links only to files
//! inside it.

use rsc_protocol::owner::OwnerToken;
use rsc_protocol::routing::{key_hash, shard_for_key};
use rsc_protocol::{ErrorCode, entry};
use rsc_testkit::CoordinatorProcess;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const PROTOCOL: &str = include_str!("../docs/PROTOCOL.md");

/// The repository's root (this crate lives in `tests/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// The text of PROTOCOL.md from the heading that starts with `heading` up to the next
/// heading of the same or a higher level.
fn section(heading: &str) -> &'static str {
    let start = PROTOCOL
        .find(&format!("\n{heading}"))
        .unwrap_or_else(|| panic!("PROTOCOL.md has no heading {heading:?}"));
    let level = heading.chars().take_while(|&c| c == '#').count();
    let body = &PROTOCOL[start + 1..];
    let end = body
        .match_indices("\n#")
        .find(|(i, _)| {
            let rest = &body[i + 1..];
            let l = rest.chars().take_while(|&c| c == '#').count();
            l <= level && rest[l..].starts_with(' ')
        })
        .map_or(body.len(), |(i, _)| i);
    &body[..end]
}

/// The cells of every table row in `text` (header rows included, separator rows not).
fn rows(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .filter(|l| l.starts_with('|') && !l.chars().all(|c| matches!(c, '|' | '-' | ':' | ' ')))
        .map(|l| {
            l.trim()
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect()
}

/// A cell's text without its backticks.
fn unquote(cell: &str) -> &str {
    cell.trim_matches('`')
}

/// Every variant, by an exhaustive match: adding a variant does not compile until it is
/// listed here, so `ErrorCode::ALL` (compared below) cannot silently miss one.
fn listed(code: ErrorCode) -> bool {
    use ErrorCode::*;
    match code {
        InvalidRequest
        | Unauthenticated
        | Forbidden
        | GroupNotFound
        | StreamNotFound
        | UnknownMemberId
        | FencedMemberEpoch
        | GroupAlreadyExists
        | ShardCountMismatch
        | ReshardInProgress
        | RollbackWindowExpired
        | NothingToRollback
        | GroupNotEmpty
        | GroupMaxSizeReached
        | MemberIdInUse
        | PayloadTooLarge
        | UnsupportedProtocolVersion
        | RateLimited
        | StoreUnavailable
        | StoreConflict
        | NotFound
        | MethodNotAllowed
        | Internal => true,
    }
}

/// The error-code table of PROTOCOL §4.2: code → (status, meaning).
fn documented_codes() -> BTreeMap<String, (u16, String)> {
    let mut codes = BTreeMap::new();
    for row in rows(section("### 4.2")) {
        let [code, status, meaning] = row.as_slice() else {
            panic!("error table row with {} cells: {row:?}", row.len());
        };
        let Ok(status) = status.parse::<u16>() else {
            continue; // the header
        };
        let code = unquote(code).to_owned();
        assert!(
            codes
                .insert(code.clone(), (status, meaning.clone()))
                .is_none(),
            "{code} is listed twice"
        );
    }
    codes
}

#[test]
fn error_table_lists_every_code_with_its_status() {
    let documented = documented_codes();
    for code in ErrorCode::ALL {
        assert!(listed(code));
        let Some((status, meaning)) = documented.get(code.as_str()) else {
            panic!("{} is missing from PROTOCOL §4.2", code.as_str());
        };
        assert_eq!(
            *status,
            code.http_status(),
            "status of {} in PROTOCOL §4.2",
            code.as_str()
        );
        assert!(!meaning.is_empty(), "{} has no meaning", code.as_str());
        let wire = serde_json::to_value(code).unwrap();
        assert_eq!(wire, code.as_str(), "wire string of {code:?}");
    }
    let known: BTreeSet<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
    for code in documented.keys() {
        assert!(
            known.contains(code.as_str()),
            "PROTOCOL §4.2 lists {code}, which ErrorCode does not have"
        );
    }
    assert_eq!(documented.len(), ErrorCode::ALL.len());
}

#[test]
fn routing_rows_match_the_hash_and_the_vectors_file() {
    let vectors: Value =
        serde_json::from_str(include_str!("../protocol/tests/routing-vectors.json")).unwrap();
    let by_key: BTreeMap<&str, &Value> = vectors["vectors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| (v["key"].as_str().unwrap(), v))
        .collect();
    let table = rows(section("## 3."));
    let header = table
        .iter()
        .find(|r| r[0].starts_with("key"))
        .expect("the routing table's header");
    let counts: Vec<u32> = header[2..].iter().map(|c| c.parse().unwrap()).collect();
    let mut checked = 0;
    for row in table.iter().filter(|r| r[0].starts_with('`')) {
        let key = unquote(row[0].split(' ').next().unwrap());
        let hash: u64 = row[1].parse().unwrap();
        assert_eq!(key_hash(key.as_bytes()), hash, "xxh3_64({key:?})");
        let file = by_key
            .get(key)
            .unwrap_or_else(|| panic!("{key:?} is not in routing-vectors.json"));
        assert_eq!(file["xxh3_64"], hash.to_string());
        for (count, cell) in counts.iter().zip(&row[2..]) {
            let shard: u32 = cell.parse().unwrap();
            assert_eq!(
                shard_for_key(key.as_bytes(), *count),
                shard,
                "{key:?} / {count}"
            );
            assert_eq!(
                file["shards"][count.to_string()],
                shard,
                "{key:?} / {count}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 30, "only {checked} answers in PROTOCOL §3");
}

/// The backquoted words of `text`, in order.
fn quoted(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

#[test]
fn entry_fields_and_owner_token_match_the_protocol_crate() {
    let data = section("### 2.2");
    let fields: Vec<String> = rows(data)
        .iter()
        .filter(|r| r.len() == 2 && r[0].starts_with('`'))
        .map(|r| unquote(&r[0]).to_owned())
        .collect();
    assert_eq!(
        fields,
        [
            entry::PAYLOAD,
            entry::KEY,
            entry::CONTENT_TYPE,
            entry::HEADERS,
            entry::PRODUCER_ID,
            entry::PRODUCER_SEQ
        ],
        "entry fields of PROTOCOL §2.2, in the producer's order"
    );

    let dead = &data[data
        .find("**Dead letters**")
        .expect("the dead-letter paragraph")..];
    let dead = &dead[..dead.find("\n\n").unwrap_or(dead.len())];
    let dead = &dead[dead.find("followed by").expect("the added fields")..];
    let added: Vec<&str> = quoted(dead)
        .into_iter()
        .filter(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '_'))
        .collect();
    assert_eq!(
        added,
        entry::DEAD_LETTER_FIELDS,
        "dead-letter fields of PROTOCOL §2.2, in the order they are written"
    );

    let owner = section("### 5.6");
    assert!(
        owner.contains("**Format**: `<created_ms>:<grant_epoch>:<member id>`"),
        "PROTOCOL §5.6 states the owner-token format"
    );
    let token = OwnerToken::new(1_700_000_000_000, 7, "10.0.0.7-billing-0");
    assert_eq!(token.to_string(), "1700000000000:7:10.0.0.7-billing-0");
    assert_eq!(
        "1700000000000:7:pod:a".parse(),
        Ok(OwnerToken::new(1_700_000_000_000, 7, "pod:a"))
    );
}

/// The route table of PROTOCOL §4.1: (METHOD, path).
fn documented_routes() -> BTreeSet<(String, String)> {
    rows(section("### 4.1"))
        .into_iter()
        .filter(|r| r.len() >= 2 && r[0].starts_with('`'))
        .map(|r| (unquote(&r[0]).to_owned(), unquote(&r[1]).to_owned()))
        .collect()
}

#[tokio::test]
async fn route_table_and_codes_match_the_openapi_document() {
    let coordinator = CoordinatorProcess::start(&[]).expect("coordinator starts");
    let doc: Value = rsc_e2e::http()
        .get(format!("{}/openapi.json", coordinator.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut served = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for method in item.as_object().unwrap().keys() {
            if matches!(method.as_str(), "get" | "post" | "put" | "patch" | "delete") {
                served.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    let documented = documented_routes();
    let undocumented: Vec<_> = served.difference(&documented).collect();
    let unserved: Vec<_> = documented.difference(&served).collect();
    assert!(
        undocumented.is_empty(),
        "routes missing from PROTOCOL §4.1: {undocumented:?}"
    );
    assert!(
        unserved.is_empty(),
        "PROTOCOL §4.1 lists routes the coordinator does not serve: {unserved:?}"
    );

    let schema_codes: BTreeSet<String> = doc["components"]["schemas"]["ErrorCode"]["enum"]
        .as_array()
        .expect("the ErrorCode schema's enum")
        .iter()
        .map(|c| c.as_str().unwrap().to_owned())
        .collect();
    let table_codes: BTreeSet<String> = documented_codes().into_keys().collect();
    assert_eq!(
        schema_codes, table_codes,
        "OpenAPI ErrorCode vs PROTOCOL §4.2"
    );
}

/// The fields of PROTOCOL §5's request line (`Request `{…}``), each with whether it is
/// optional (`name?:`).
fn documented_heartbeat_fields() -> BTreeMap<String, bool> {
    let text = section("## 5. Heartbeat");
    let line = text
        .lines()
        .find(|l| l.starts_with("Request `{"))
        .expect("PROTOCOL §5 has a request line");
    let body = &line["Request `{".len()..line.rfind("}`").expect("a closing }`")];
    let (mut fields, mut depth, mut item) = (BTreeMap::new(), 0, String::new());
    for c in body.chars().chain([',']) {
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' => depth -= 1,
            ',' if depth == 0 => {
                let head = item.split(':').next().unwrap_or_default().trim();
                if !head.is_empty() {
                    let name = head.trim_end_matches('?');
                    fields.insert(name.to_owned(), head.ends_with('?'));
                }
                item.clear();
                continue;
            }
            _ => {}
        }
        item.push(c);
    }
    fields
}

/// PROTOCOL §5's heartbeat request and the OpenAPI schema list the same fields, optional alike
/// (`owned_shards` is optional: PROTOCOL §5 says what its absence means, and both say it).
#[tokio::test]
async fn heartbeat_request_fields_match_the_openapi_document() {
    let coordinator = CoordinatorProcess::start(&[]).expect("coordinator starts");
    let doc: Value = rsc_e2e::http()
        .get(format!("{}/openapi.json", coordinator.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let schema = &doc["components"]["schemas"]["HeartbeatRequest"];
    let required: BTreeSet<&str> = schema["required"]
        .as_array()
        .expect("required")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let served: BTreeMap<String, bool> = schema["properties"]
        .as_object()
        .expect("properties")
        .keys()
        .map(|k| (k.clone(), !required.contains(k.as_str())))
        .collect();
    assert_eq!(
        documented_heartbeat_fields(),
        served,
        "PROTOCOL §5 request line vs OpenAPI HeartbeatRequest (field -> optional)"
    );
    assert_eq!(served.get("owned_shards"), Some(&true));
    let heartbeat = section("## 5. Heartbeat").replace('\n', " ");
    for phrase in ["**without** it", "\"unchanged\"", "never releases a shard"] {
        assert!(heartbeat.contains(phrase), "PROTOCOL §5 lacks {phrase:?}");
    }
    assert!(
        section("### 5.4")
            .replace('\n', " ")
            .contains("without `owned_shards`"),
        "PROTOCOL §5.4 says what the previous epoch without owned_shards gets"
    );
    let description = schema["properties"]["owned_shards"]["description"]
        .as_str()
        .unwrap_or_default()
        .replace('\n', " ");
    assert!(description.contains("unchanged"), "{description}");
}

/// README.md, CHANGELOG.md, docs/*.md and every crate's README.md.
fn documents() -> Vec<PathBuf> {
    let root = root();
    let mut docs = vec![root.join("README.md"), root.join("CHANGELOG.md")];
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    for dir in dirs {
        if dir.join("README.md").is_file() {
            docs.push(dir.join("README.md"));
        }
    }
    let mut in_docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    in_docs.sort();
    docs.extend(in_docs);
    docs
}

/// The targets of the Markdown links (`[text](target)`, `[label]: target`) of `text`,
/// outside fenced code blocks.
fn link_targets(text: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let end = after.find(')').unwrap_or(after.len());
            targets.push(after[..end].trim().to_owned());
            rest = &after[end..];
        }
        let t = line.trim_start();
        if t.starts_with('[')
            && let Some(i) = t.find("]: ")
        {
            targets.push(t[i + 3..].trim().to_owned());
        }
    }
    targets
}

#[test]
fn documents_link_only_inside_the_repository() {
    let root = root().canonicalize().unwrap();
    let mut broken = Vec::new();
    let docs = documents();
    assert!(docs.len() >= 10, "documents found: {docs:?}");
    for doc in docs {
        let text =
            std::fs::read_to_string(&doc).unwrap_or_else(|e| panic!("{}: {e}", doc.display()));
        let name = doc
            .strip_prefix(&root)
            .unwrap_or(&doc)
            .display()
            .to_string();
        if text.contains("../shared") {
            broken.push(format!(
                "{name}: mentions ../shared, outside the repository"
            ));
        }
        for target in link_targets(&text) {
            let target = target.split_whitespace().next().unwrap_or("");
            if target.is_empty()
                || target.starts_with('#')
                || target.starts_with("https://")
                || target.starts_with("http://")
                || target.starts_with("mailto:")
            {
                continue;
            }
            let file = target.split('#').next().unwrap();
            let resolved = doc.parent().unwrap().join(file);
            match resolved.canonicalize() {
                Ok(p) if p.starts_with(&root) => {}
                Ok(p) => broken.push(format!(
                    "{name}: {target} leaves the repository ({})",
                    p.display()
                )),
                Err(_) => broken.push(format!("{name}: {target} does not exist")),
            }
        }
    }
    assert!(broken.is_empty(), "bad links:\n{}", broken.join("\n"));
}
