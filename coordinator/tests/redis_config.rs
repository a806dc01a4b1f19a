//! `serve` settings for the Redis store: flags, TOML, defaults and refusals.

use rsc_coordinator::config::{DataRedisArgs, ServeArgs, StoreKind, StoreRedisArgs};

#[test]
fn defaults_follow_the_spec() {
    let cfg = ServeArgs::default().resolve().unwrap();
    assert_eq!(cfg.store, StoreKind::Memory);
    assert_eq!(cfg.redis.urls(), ["redis://127.0.0.1:6379"]);
    assert!(!cfg.redis.cluster);
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
        cfg.redis.urls(),
        ["redis://127.0.0.1:7001", "redis://127.0.0.1:7002"]
    );
    assert!(cfg.redis.cluster);
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
        redis: StoreRedisArgs {
            redis_url: Some("redis://a:1,redis://b:2".into()),
            ..Default::default()
        },
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

#[test]
fn data_redis_cluster_from_flags_and_toml() {
    // Flags: comma-separated seed URLs with --data-redis-cluster.
    let cfg = ServeArgs {
        data_redis: DataRedisArgs {
            data_redis_url: Some("redis://127.0.0.1:7101, redis://127.0.0.1:7102,".into()),
            data_redis_cluster: true,
            ..Default::default()
        },
        ..ServeArgs::default()
    }
    .resolve()
    .unwrap();
    let data = cfg.data_redis.clone().unwrap();
    assert_eq!(
        data.urls(),
        ["redis://127.0.0.1:7101", "redis://127.0.0.1:7102"]
    );
    assert!(data.cluster);
    // The metadata store is independent of it.
    assert!(!cfg.redis.cluster);
    assert_eq!(cfg.redis.urls(), ["redis://127.0.0.1:6379"]);

    // The same from a TOML file.
    let dir = std::env::temp_dir().join(format!("rsc-data-cluster-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("rsc.toml");
    std::fs::write(
        &path,
        "data-redis-url = \"redis://127.0.0.1:7101,redis://127.0.0.1:7103\"\n\
         data-redis-cluster = true\n",
    )
    .unwrap();
    let cfg = ServeArgs {
        config: Some(path),
        ..ServeArgs::default()
    }
    .resolve()
    .unwrap();
    let data = cfg.data_redis.unwrap();
    assert_eq!(
        data.urls(),
        ["redis://127.0.0.1:7101", "redis://127.0.0.1:7103"]
    );
    assert!(data.cluster);
    std::fs::remove_dir_all(dir).unwrap();

    // One URL, no flag: a standalone data Redis.
    let cfg = ServeArgs {
        data_redis: DataRedisArgs {
            data_redis_url: Some("redis://127.0.0.1:7101".into()),
            ..Default::default()
        },
        ..ServeArgs::default()
    }
    .resolve()
    .unwrap();
    assert!(!cfg.data_redis.unwrap().cluster);
    // No data Redis at all.
    let cfg = ServeArgs::default().resolve().unwrap();
    assert!(cfg.data_redis.is_none());
}

#[test]
fn data_redis_refusals_say_what_to_do() {
    let err = ServeArgs {
        data_redis: DataRedisArgs {
            data_redis_url: Some("redis://a:1,redis://b:2".into()),
            ..Default::default()
        },
        ..ServeArgs::default()
    }
    .resolve()
    .unwrap_err();
    assert!(err.to_string().contains("--data-redis-cluster"), "{err}");
    // --redis-cluster is the metadata store's flag: it does not cover the data Redis.
    let err = ServeArgs {
        redis: StoreRedisArgs {
            redis_cluster: true,
            redis_url: Some("redis://a:1,redis://b:2".into()),
            ..Default::default()
        },
        data_redis: DataRedisArgs {
            data_redis_url: Some("redis://a:1,redis://b:2".into()),
            ..Default::default()
        },
        ..ServeArgs::default()
    }
    .resolve()
    .unwrap_err();
    assert!(err.to_string().contains("--data-redis-cluster"), "{err}");
    let err = ServeArgs {
        data_redis: DataRedisArgs {
            data_redis_url: Some(" , ".into()),
            ..Default::default()
        },
        ..ServeArgs::default()
    }
    .resolve()
    .unwrap_err();
    assert!(err.to_string().contains("data-redis-url is empty"), "{err}");
    let err = ServeArgs {
        data_redis: DataRedisArgs {
            data_redis_cluster: true,
            ..Default::default()
        },
        ..ServeArgs::default()
    }
    .resolve()
    .unwrap_err();
    assert!(err.to_string().contains("--data-redis-url"), "{err}");
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("rsc-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
