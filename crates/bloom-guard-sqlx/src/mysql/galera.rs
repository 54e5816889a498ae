//! Settling feed ids on a Galera cluster, where every node takes writes.
//!
//! Each node hands out auto-increment ids of its own (`auto_increment_increment`
//! and `_offset` interleave them), and a transaction that took an id on one
//! node may commit after another node's higher id was read. One node's
//! transaction list shows only its own transactions. So each node is
//! settled on its own, by the one-server method (`settle.rs`) run on a
//! connection to that node: a node hands out only ids above the highest it
//! has seen (replicated rows move its counter too), so once the
//! transactions it had running then have ended, it will never commit an
//! id up to that highest one. The cluster's ids are settled up to the
//! least node's. A node that does not answer settles nothing until the
//! cluster has evicted it (its uncertified transactions never commit);
//! until then the ids stay open, which costs reads, never a key.
//!
//! Reads after the proof must see what those transactions committed on
//! other nodes: they are causal (`wsrep_sync_wait`), so a node applies
//! every write set certified before the read first.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use sqlx::mysql::MySqlPoolOptions;
use sqlx::MySqlPool;

/// One node's own settling, by the one-server method (`settle.rs`), as a
/// round over the cluster runs it.
pub(super) trait NodeSettling: Send + Sync {
    /// The settling of one node, on its own.
    fn node() -> Self;
    /// One round on the node, through `pool` (connections to it alone).
    fn node_round(&self, pool: &MySqlPool) -> impl std::future::Future<Output = ()> + Send;
    /// Every id up to this one is settled on the node.
    fn now(&self) -> i64;
    /// Whether the node's ids wait to be settled.
    fn settling(&self) -> bool;
    /// Whether the node refused the transaction list.
    fn unlisted(&self) -> bool;
}

/// The nodes of the cluster, by address, each with its own settling `S`.
#[derive(Debug)]
pub(crate) struct Cluster<S> {
    nodes: Mutex<BTreeMap<String, Node<S>>>,
}

impl<S> Default for Cluster<S> {
    fn default() -> Self {
        Self {
            nodes: Mutex::default(),
        }
    }
}

#[derive(Debug)]
struct Node<S> {
    pool: MySqlPool,
    settled: Arc<S>,
}

impl<S> Clone for Node<S> {
    fn clone(&self) -> Self {
        Self {
            pool: self.pool.clone(),
            settled: Arc::clone(&self.settled),
        }
    }
}

/// What one round over the cluster found.
#[derive(Debug)]
pub(super) struct Round {
    /// The least node's settled id, if every member could be reached.
    pub(super) settled: Option<i64>,
    /// Whether a node's ids wait to be settled.
    pub(super) settling: bool,
    /// Whether a node refused the transaction list (no `PROCESS`).
    pub(super) unlisted: bool,
}

impl<S: NodeSettling> Cluster<S> {
    /// Settles every member node once, through `pool` (a connection to
    /// one of them) for the membership.
    pub(super) async fn round(&self, pool: &MySqlPool) -> Result<Round, sqlx::Error> {
        let status: Vec<(String, String)> = sqlx::query_as(
            "select variable_name, variable_value from information_schema.global_status
              where variable_name in ('WSREP_INCOMING_ADDRESSES', 'WSREP_CLUSTER_SIZE')",
        )
        .fetch_all(pool)
        .await?;
        let value = |name: &str| {
            status
                .iter()
                .find(|(found, _)| found.eq_ignore_ascii_case(name))
                .map(|(_, value)| value.as_str())
        };
        let size: usize = value("WSREP_CLUSTER_SIZE")
            .and_then(|size| size.parse().ok())
            .unwrap_or(0);
        let addresses = addresses(value("WSREP_INCOMING_ADDRESSES").unwrap_or(""));
        let nodes: Vec<Node<S>> = {
            let mut nodes = crate::lock::lock(&self.nodes);
            nodes.retain(|address, _| addresses.contains(address));
            for address in &addresses {
                if let (false, Some((host, port))) =
                    (nodes.contains_key(address), host_port(address))
                {
                    let options = pool
                        .connect_options()
                        .as_ref()
                        .clone()
                        .host(host)
                        .port(port);
                    nodes.insert(
                        address.clone(),
                        Node {
                            pool: MySqlPoolOptions::new()
                                .max_connections(2)
                                .connect_lazy_with(options),
                            settled: Arc::new(S::node()),
                        },
                    );
                }
            }
            nodes.values().cloned().collect()
        };
        futures_util::future::join_all(
            nodes.iter().map(|node| node.settled.node_round(&node.pool)),
        )
        .await;
        // A member without an address (or not yet listed) holds ids no
        // list of ours shows: nothing settles past it.
        let complete = size > 0 && nodes.len() >= size;
        Ok(Round {
            settled: complete
                .then(|| nodes.iter().map(|node| node.settled.now()).min())
                .flatten(),
            settling: nodes.iter().any(|node| node.settled.settling()),
            unlisted: nodes.iter().any(|node| node.settled.unlisted()),
        })
    }
}

/// The client addresses `wsrep_incoming_addresses` lists (`host:port`,
/// comma-separated; a node without one is listed as `AUTO` or empty).
fn addresses(list: &str) -> Vec<String> {
    list.split(',')
        .map(str::trim)
        .filter(|address| host_port(address).is_some())
        .map(str::to_owned)
        .collect()
}

/// A `host:port` (IPv6 hosts in brackets) split.
fn host_port(address: &str) -> Option<(&str, u16)> {
    let (host, port) = address.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = port.parse().ok()?;
    (!host.is_empty()).then_some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_members_addresses() {
        assert_eq!(
            addresses("10.0.0.1:3306,AUTO, [::1]:3307,,db3:3308"),
            ["10.0.0.1:3306", "[::1]:3307", "db3:3308"]
        );
        assert_eq!(host_port("[::1]:3307"), Some(("::1", 3307)));
        assert_eq!(host_port("AUTO"), None);
    }
}
