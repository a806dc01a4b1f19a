//! `serve` settings for the Redis store: flags, TOML, defaults and refusals.

use rsc_coordinator::config::{ServeArgs, StoreKind};

#[test]
fn defaults_follow_the_spec() {
    let cfg = ServeArgs::default().resolve().unwrap();
    assert_eq!(cfg.store, StoreKind::Memory);
    assert_eq!(cfg.redis_urls, ["redis://127.0.0.1:6379"]);
    assert!(!cfg.redis_cluster);
    assert_eq!(cfg.key_prefix, "rsc");
}

#[test]
fn toml_file_and_flags() {
    let dir = tempfile_dir();
    let path = dir.join("rsc.toml");
    std::fs::write(
        &path,
        "store = \"redis\"\nredis-url = \"redis://127.0.0.1:7001, redis://127.0.0.1:7002\"\n\
         redis-cluster = true\nkey-prefix = \"prod:rsc\"\n",
    )
    .unwrap();
    let cfg = ServeArgs {
        config: Some(path.clone()),
        ..ServeArgs::default()
    }
    .resolve()
    .unwrap();
    assert_eq!(cfg.store, StoreKind::Redis);
    assert_eq!(
        cfg.redis_urls,
        ["redis://127.0.0.1:7001", "redis://127.0.0.1:7002"]
    );
    assert!(cfg.redis_cluster);
    assert_eq!(cfg.key_prefix, "prod:rsc");
    // A flag wins over the file.
    let cfg = ServeArgs {
        config: Some(path),
        key_prefix: Some("other".into()),
        ..ServeArgs::default()
    }
    .resolve()
    .unwrap();
    assert_eq!(cfg.key_prefix, "other");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn refusals_say_what_to_do() {
    let err = ServeArgs {
        redis_url: Some("redis://a:1,redis://b:2".into()),
        ..ServeArgs::default()
    }
    .resolve()
    .unwrap_err();
    assert!(err.to_string().contains("--redis-cluster"), "{err}");
    for bad in ["", "rsc{x}", "with space"] {
        let err = ServeArgs {
            key_prefix: Some(bad.into()),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap_err();
        assert!(err.to_string().contains("key prefix"), "{bad:?}: {err}");
    }
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("rsc-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
