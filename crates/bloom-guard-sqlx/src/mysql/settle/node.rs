//! A node of a Galera cluster settled on its own, by the one-server
//! method, as a round over the cluster runs it (see `galera.rs`).

use std::sync::atomic::Ordering;

use sqlx::MySqlPool;

use super::{Running, Settled, ROUND_LIMIT};
use crate::mysql::galera::NodeSettling;

impl NodeSettling for Settled {
    /// The settling of one node of a Galera cluster, on its own.
    fn node() -> Self {
        Self {
            node_only: true,
            ..Self::default()
        }
    }

    /// One round on one node of a Galera cluster, unless one is under way.
    async fn node_round(&self, pool: &MySqlPool) {
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let _running = Running(&self.running);
        let stepped = tokio::time::timeout(ROUND_LIMIT, self.step(pool)).await;
        self.record(stepped);
    }

    fn now(&self) -> i64 {
        Settled::now(self)
    }

    fn settling(&self) -> bool {
        Settled::settling(self)
    }

    fn unlisted(&self) -> bool {
        Settled::unlisted(self)
    }
}
