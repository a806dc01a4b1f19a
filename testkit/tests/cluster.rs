//! The cluster harness forms a working cluster and cleans up after itself.

use rsc_testkit::{CLUSTER_NODES, RedisCluster};
use std::time::Duration;

#[test]
fn cluster_forms_serves_every_slot_and_stops() {
    let cluster = RedisCluster::start().expect("cluster starts");
    assert_eq!(cluster.nodes().len(), CLUSTER_NODES);
    for node in cluster.nodes() {
        let info = node.command("CLUSTER INFO").unwrap();
        assert!(info.contains("cluster_state:ok"), "{info}");
        assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
        assert!(
            info.contains(&format!("cluster_known_nodes:{CLUSTER_NODES}")),
            "{info}"
        );
    }
    // A key is served by exactly one node; the others redirect.
    let replies: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| n.command("SET k v").unwrap())
        .collect();
    assert_eq!(
        replies.iter().filter(|r| r.starts_with("+OK")).count(),
        1,
        "{replies:?}"
    );
    assert_eq!(
        replies.iter().filter(|r| r.starts_with("-MOVED")).count(),
        CLUSTER_NODES - 1
    );
    assert!(cluster.url().split(',').count() == CLUSTER_NODES);
    let pids: Vec<u32> = cluster.nodes().iter().filter_map(|n| n.pid()).collect();
    drop(cluster);
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists()
                || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .is_ok_and(|s| s.contains(") Z ")),
            "node {pid} still runs"
        );
    }
}

#[test]
fn shared_cluster_is_started_once() {
    let a = RedisCluster::shared().expect("shared cluster");
    let b = RedisCluster::shared().expect("shared cluster");
    assert!(std::ptr::eq(a, b));
    a.wait_ready(Duration::from_secs(5)).unwrap();
}
