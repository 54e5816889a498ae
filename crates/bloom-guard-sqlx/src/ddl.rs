//! DDL on a user's table that never stalls it: each try waits a short
//! while for its lock, and tries again until the transaction in its way
//! ends.

use std::time::Duration;

use crate::backoff::retry_pauses;

/// Runs `attempt` until it does not time out on a lock (`timed_out` says
/// which errors are that), pausing between tries as every retry loop of
/// the crate does ([`retry_pauses`]), so that writers run between the
/// tries; says once that it waits, and once that it got through.
/// `waits_at_most` is each try's lock timeout, for the log.
pub(crate) async fn retrying_locks<F, Fut>(
    what: &str,
    waits_at_most: &str,
    timed_out: fn(&sqlx::Error) -> bool,
    mut attempt: F,
) -> Result<(), sqlx::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), sqlx::Error>>,
{
    let mut pauses = retry_pauses();
    let mut tries = 0_u32;
    loop {
        match attempt().await {
            Err(error) if timed_out(&error) => {
                tries += 1;
                if tries == 1 {
                    tracing::warn!(
                        what,
                        %error,
                        "an open transaction holds a lock the feed's DDL needs; trying again every few seconds, never holding writers back longer than {waits_at_most}"
                    );
                }
                let pause = pauses.next().unwrap_or(Duration::from_secs(10));
                tokio::time::sleep(pause).await;
            }
            result => {
                if tries > 0 && result.is_ok() {
                    tracing::info!(what, tries, "the feed's DDL got its lock");
                }
                return result;
            }
        }
    }
}
