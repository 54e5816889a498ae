//! An items API guarded by bloom-guard.
//!
//! Shows the whole flow: a guard per resource as `route_layer` on
//! `/items/{key}` (text keys) and `/users/{id}` (UUID keys),
//! warm-up from the database at start, write-through inserts, a moka
//! read-through cache behind the guard, and the admin API on its own port.
//!
//! Run with `cargo run -p items-service` (an embedded SQLite file with demo
//! items), or against Postgres with
//! `DATABASE_URL=postgres://postgres@127.0.0.1/postgres ADMIN_TOKEN=secret cargo run -p items-service`.
//!
//! ```text
//! curl -i localhost:3000/items/apple            # 200, from the database
//! curl -i localhost:3000/items/no-such-key      # 404, answered by the guard
//! curl -i -X POST localhost:3000/items -H 'content-type: application/json' \
//!      -d '{"key":"kiwi","value":"green"}'     # 201
//! curl -i localhost:3000/items/kiwi             # 200 at once
//! curl -s -X POST localhost:3000/users -H 'content-type: application/json' \
//!      -d '{"name":"ada"}'                       # 201 {"id":"<uuid>","name":"ada"}
//! curl -i localhost:3000/users/<UUID IN UPPER CASE>   # 200: one canonical form
//! curl -s -H 'authorization: Bearer secret' localhost:3001/admin/bloom/users
//! curl -s -H 'authorization: Bearer secret' localhost:3001/admin/bloom
//! curl -s -X POST -H 'authorization: Bearer secret' localhost:3001/admin/bloom/rebuild
//! curl -s -H 'authorization: Bearer secret' localhost:3001/metrics
//! ```

use std::io::IsTerminal;
use std::process::ExitCode;

use items_service::startup::guards_at_start;
use items_service::{admin_app, app, prepare, serve, AppState, Config, Database, Limits};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tracing_subscriber::EnvFilter;

/// mimalloc instead of the system allocator: a flood keeps thousands of
/// requests' buffers alive across the read barrier's wait, and glibc's
/// malloc spends a sixth of the service's CPU on them (see
/// docs/benchmarks.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    // Postgres notices (`relation "_sqlx_migrations" already exists,
    // skipping` at every start) are not problems: warnings and up only.
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,sqlx::postgres::notice=warn"));
    // Colour only on a terminal; one JSON object per line for machines.
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal());
    if std::env::var("LOG_FORMAT").is_ok_and(|format| format.eq_ignore_ascii_case("json")) {
        logs.json().init();
    } else {
        logs.init();
    }
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error}");
            ExitCode::FAILURE
        }
    }
}

/// The pool's connections a start uses at once: the session check's and
/// the install's statements, and each guard's first statements and build
/// lock.
const START_CONNECTIONS: u32 = 6;

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let config = Config::from_env()?;
    let db = match &config.database_url {
        Some(url) => {
            let db = Database::connect(url).await?;
            match &config.database_replica_url {
                Some(replica) => db.with_replica(replica).await?,
                None => db,
            }
        }
        None => {
            tracing::info!(path = %config.sqlite_path, "DATABASE_URL is unset: using an embedded SQLite database");
            Database::sqlite(&config.sqlite_path).await?
        }
    };
    // Behind a pooler in transaction mode the followers cannot keep their
    // sessions, and a standby takes no writes: a clear error now, not a
    // service that never protects. A
    // database that is down is waited for below, as ever.
    if let items_service::db::Pool::Postgres(pool) = db.pool() {
        // The start's connections open together (the session check's, the
        // install's, the followers' first statements and locks): over TLS
        // each new one costs a handshake.
        tokio::spawn(bloom_guard_sqlx::postgres::warm_pool(
            pool.clone(),
            START_CONNECTIONS,
        ));
        if let Err(
            error @ (bloom_guard_sqlx::FeedError::Pooler(_) | bloom_guard_sqlx::FeedError::Standby),
        ) = bloom_guard_sqlx::postgres::check_session(pool).await
        {
            return Err(error.into());
        }
    }
    // The recorder before the guards: they register their metrics when built.
    let prometheus = match &config.admin_token {
        Some(_) => Some(
            PrometheusBuilder::new()
                .set_buckets_for_metric(
                    Matcher::Prefix("bloom_guard_".into()),
                    bloom_guard::metrics::DURATION_BUCKETS,
                )?
                .install_recorder()?,
        ),
        None => None,
    };
    let guards = if config.guard_enabled {
        Some(guards_at_start(&config, &db).await?)
    } else {
        None
    };
    if guards.is_none() {
        tracing::warn!("BLOOM_GUARD=off: every request reaches the cache and the database");
    }
    let state = AppState::new(db, guards).with_feed(config.feed);
    let (stop, stopped) = watch::channel(());
    // Both ports first: a port that is taken stops the service before any
    // background work starts.
    let public = bind(config.bind_addr).await?;
    let admin = match &config.admin_token {
        Some(_) => Some(bind(config.admin_addr).await?),
        None => None,
    };
    let seeding = state.clone();
    let seed_demo = config.seed_demo && config.database_url.is_some();
    tokio::spawn(async move {
        prepare(seeding.clone()).await;
        if seed_demo {
            if let Err(error) = seeding.db.seed_if_empty().await {
                tracing::warn!(%error, "cannot seed the demo items");
            }
        }
    });

    tracing::info!(addr = %config.bind_addr, "serving the items API");
    // Each port holds up to MAX_CONNECTIONS sockets: the process needs the
    // file descriptors for both, beyond the operating system's default.
    let open_files = items_service::server::raise_open_files_limit();
    let limits = Limits {
        max_connections: config
            .max_connections
            .min((open_files.saturating_sub(128) / 2).max(1) as usize),
        first_bytes_timeout: config.first_bytes_timeout,
        idle_timeout: config.idle_timeout,
        keep_alive_interval: config.keep_alive_interval,
        keep_alive_timeout: config.keep_alive_timeout,
        ..Limits::default()
    };
    if limits.max_connections < config.max_connections {
        tracing::warn!(
            open_files,
            max_connections = limits.max_connections,
            "the open files limit caps the connections per port"
        );
    }
    let mut servers = vec![tokio::spawn(serve(
        public,
        app(state.clone()),
        stopped_signal(&stopped),
        limits,
    ))];
    match (&config.admin_token, admin) {
        (Some(token), Some(admin)) => {
            tracing::info!(addr = %config.admin_addr, "serving the admin API");
            let admin_app = admin_app(&state, token, prometheus);
            servers.push(tokio::spawn(serve(
                admin,
                admin_app,
                stopped_signal(&stopped),
                limits,
            )));
        }
        _ => tracing::info!("ADMIN_TOKEN is unset: the admin API is off"),
    }

    shutdown_signal().await;
    tracing::info!("shutting down: finishing requests in flight");
    drop(stop);
    for server in servers {
        server.await??;
    }
    state.shut_down().await;
    tracing::info!("stopped");
    Ok(())
}

/// Binds `addr`, naming it in the error.
async fn bind(addr: std::net::SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(addr)
        .await
        .map_err(|error| format!("cannot listen on {addr}: {error}"))
}

/// Completes when the sender of `stopped` is dropped.
fn stopped_signal(
    stopped: &watch::Receiver<()>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut stopped = stopped.clone();
    async move {
        let _ = stopped.changed().await;
    }
}

/// Ctrl-C, or SIGTERM on Unix.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(error) = tokio::signal::ctrl_c().await {
            tracing::warn!(%error, "cannot listen for ctrl-c");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = terminate => {}
    }
}
