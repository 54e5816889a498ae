//! The admin API's run-time settings and fleet view.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::{error, no_such_guard, AdminState};
use crate::control::fleet::SettingsError;
use crate::switches::mode::Mode;
use crate::switches::settings::Settings;

/// The body of `PUT /admin/bloom/{guard}/mode`.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct SettingsChange {
    mode: Option<Mode>,
    audit_rate: Option<f64>,
    #[serde(default)]
    scope: Scope,
}

/// Where a change applies.
#[derive(serde::Deserialize, Default, PartialEq)]
#[serde(rename_all = "lowercase")]
pub(super) enum Scope {
    /// Every instance (stored in the fleet's database).
    #[default]
    Fleet,
    /// This instance only, over the fleet's.
    Instance,
}

const SETTINGS_BODY: &str = r#"expected {"mode": "enforce" | "shadow" | "off", "audit_rate": 0 to 1, "scope": "fleet" | "instance"}, with a mode or an audit rate"#;

pub(super) async fn set_mode(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
    body: Result<Json<SettingsChange>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Some(admin) = state.find(&name) else {
        return no_such_guard();
    };
    let Ok(Json(change)) = body else {
        return error(StatusCode::UNPROCESSABLE_ENTITY, SETTINGS_BODY);
    };
    let mut settings = Settings::new();
    if let Some(mode) = change.mode {
        settings = settings.mode(mode);
    }
    if let Some(rate) = change.audit_rate {
        settings = settings.audit_rate(rate);
    }
    if settings.is_empty() {
        return error(StatusCode::UNPROCESSABLE_ENTITY, SETTINGS_BODY);
    }
    let applied = match change.scope {
        Scope::Fleet => admin.guard.set_settings(settings).await,
        Scope::Instance => admin
            .guard
            .override_settings(settings)
            .map_err(SettingsError::from),
    };
    match applied {
        Ok(()) => Json(admin.guard.stats()).into_response(),
        Err(SettingsError::InvalidAuditRate(_)) => {
            error(StatusCode::UNPROCESSABLE_ENTITY, SETTINGS_BODY)
        }
        Err(SettingsError::Fleet(_)) => fleet_unavailable(),
    }
}

fn fleet_unavailable() -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "the fleet's settings cannot be stored or read now (see the service's log); nothing changed",
    )
}

/// The query of `DELETE /admin/bloom/{guard}/mode`: which settings to
/// drop, said explicitly.
#[derive(serde::Deserialize)]
pub(super) struct ResetScope {
    scope: Scope,
}

pub(super) async fn reset(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
    scope: Result<Query<ResetScope>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Some(admin) = state.find(&name) else {
        return no_such_guard();
    };
    let Ok(Query(ResetScope { scope })) = scope else {
        return error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "expected ?scope=fleet (forget the fleet's settings) or ?scope=instance (drop this instance's overrides)",
        );
    };
    match scope {
        Scope::Instance => admin.guard.clear_overrides(),
        Scope::Fleet => {
            if admin.guard.reset_settings().await.is_err() {
                return fleet_unavailable();
            }
        }
    }
    Json(admin.guard.stats()).into_response()
}

pub(super) async fn fleet(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
) -> Response {
    let Some(admin) = state.find(&name) else {
        return no_such_guard();
    };
    match admin.guard.fleet().await {
        Ok(instances) => Json(json!({ "instances": instances })).into_response(),
        Err(_) => fleet_unavailable(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    use axum::body::Body;
    use axum::extract::Request;
    use axum::http::header;
    use axum::Router;
    use futures_util::future::BoxFuture;
    use serde_json::Value;
    use tower::ServiceExt;

    use super::super::tests::json as get;
    use crate::control::admin::Admin;
    use crate::control::fleet::{Fleet, FleetStoreError, Instance};
    use crate::handle::guard::BloomGuard;
    use crate::switches::settings::SetBy;

    /// A fleet in memory whose database can be made to fail.
    #[derive(Default)]
    struct MemoryFleet {
        stored: Mutex<Vec<(String, Settings)>>,
        down: std::sync::atomic::AtomicBool,
    }

    impl Fleet for MemoryFleet {
        fn store<'a>(
            &'a self,
            guard: &'a str,
            change: Settings,
        ) -> BoxFuture<'a, Result<(), FleetStoreError>> {
            Box::pin(async move {
                if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                    return Err("connection refused".into());
                }
                crate::lock::lock(&self.stored).push((guard.to_owned(), change));
                Ok(())
            })
        }

        fn settings<'a>(
            &'a self,
            _guard: &'a str,
        ) -> BoxFuture<'a, Result<Settings, FleetStoreError>> {
            Box::pin(async move {
                if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                    return Err("connection refused".into());
                }
                Ok(crate::lock::lock(&self.stored)
                    .last()
                    .map_or_else(Settings::new, |(_, settings)| *settings))
            })
        }

        fn reset<'a>(&'a self, _guard: &'a str) -> BoxFuture<'a, Result<(), FleetStoreError>> {
            Box::pin(async move {
                crate::lock::lock(&self.stored).clear();
                Ok(())
            })
        }

        fn instances<'a>(
            &'a self,
            _guard: &'a str,
        ) -> BoxFuture<'a, Result<Vec<Instance>, FleetStoreError>> {
            Box::pin(async move {
                if self.down.load(std::sync::atomic::Ordering::SeqCst) {
                    return Err("connection refused".into());
                }
                let stats = BloomGuard::builder().build().stats();
                Ok(vec![
                    Instance::new("a:1", &stats),
                    Instance::new("b:2", &stats),
                ])
            })
        }
    }

    async fn send(app: &Router, method: &str, body: &str) -> (StatusCode, Value) {
        send_to(app, method, "/admin/bloom/items/mode", body).await
    }

    async fn send_to(app: &Router, method: &str, uri: &str, body: &str) -> (StatusCode, Value) {
        let request = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::AUTHORIZATION, "Bearer s3cret")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(body.to_owned()))
            .expect("valid request");
        let response = app.clone().oneshot(request).await.expect("infallible");
        let status = response.status();
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .expect("body");
        (
            status,
            serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        )
    }

    fn app(guard: &BloomGuard) -> Router {
        Admin::new("s3cret").guard(guard.clone()).into_router()
    }

    #[tokio::test]
    async fn the_mode_is_switched_at_run_time() {
        let guard = BloomGuard::builder().name("items").build();
        let app = app(&guard);
        let (status, stats) = send(&app, "PUT", r#"{"mode":"shadow"}"#).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(guard.mode(), Mode::Shadow);
        assert_eq!(
            (
                &stats["mode"],
                &stats["mode_set_by"],
                &stats["shadow_would_reject"]
            ),
            (&json!("shadow"), &json!("fleet"), &json!(0))
        );
        for bad in [
            r#"{"mode":"loud"}"#,
            r#"{}"#,
            "mode=off",
            r#"{"audit_rate":1.5}"#,
            r#"{"mode":"off","scope":"everywhere"}"#,
        ] {
            assert_eq!(
                send(&app, "PUT", bad).await.0,
                StatusCode::UNPROCESSABLE_ENTITY,
                "{bad}"
            );
        }
        assert_eq!((guard.mode(), guard.audit_rate()), (Mode::Shadow, 0.0));
    }

    #[tokio::test]
    async fn an_instance_override_wins_until_it_is_dropped() {
        let guard = BloomGuard::builder().name("items").build();
        let app = app(&guard);
        let (status, stats) = send(&app, "PUT", r#"{"mode":"off","scope":"instance"}"#).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            (&stats["mode"], &stats["mode_set_by"]),
            (&json!("off"), &json!("instance"))
        );
        let (_, stats) = send(&app, "PUT", r#"{"mode":"shadow","audit_rate":0.5}"#).await;
        assert_eq!(
            (&stats["mode"], &stats["mode_set_by"]),
            (&json!("off"), &json!("instance"))
        );
        assert_eq!(
            (&stats["audit_rate"], &stats["audit_rate_set_by"]),
            (&json!(0.5), &json!("fleet"))
        );
        assert_eq!(
            send_to(&app, "DELETE", "/admin/bloom/items/mode", "")
                .await
                .0,
            StatusCode::UNPROCESSABLE_ENTITY,
            "the scope is said explicitly"
        );
        let (status, stats) =
            send_to(&app, "DELETE", "/admin/bloom/items/mode?scope=instance", "").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            (&stats["mode"], &stats["mode_set_by"]),
            (&json!("shadow"), &json!("fleet"))
        );
        let (_, stats) = send_to(&app, "DELETE", "/admin/bloom/items/mode?scope=fleet", "").await;
        assert_eq!(
            (&stats["mode"], &stats["mode_set_by"], &stats["audit_rate"]),
            (&json!("enforce"), &json!("default"), &json!(0.0))
        );
    }

    #[tokio::test]
    async fn a_change_for_the_fleet_is_stored_or_not_made_at_all() {
        let guard = BloomGuard::builder().name("items").build();
        let fleet = std::sync::Arc::new(MemoryFleet::default());
        let _member = guard.feed().join_fleet(fleet.clone());
        let app = app(&guard);
        let (status, _) = send(&app, "PUT", r#"{"mode":"shadow","audit_rate":0.25}"#).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            crate::lock::lock(&fleet.stored).as_slice(),
            &[(
                "items".to_owned(),
                Settings::new().mode(Mode::Shadow).audit_rate(0.25)
            )]
        );
        // An override is this instance's own: never stored.
        send(&app, "PUT", r#"{"audit_rate":1,"scope":"instance"}"#).await;
        assert_eq!(crate::lock::lock(&fleet.stored).len(), 1);

        // What was stored is read back, and a read older than a change
        // made here meanwhile is not.
        guard.refresh_settings().await.expect("read");
        assert_eq!(guard.stats().mode_set_by, SetBy::Fleet);
        assert_eq!(guard.audit_rate(), 1.0, "the override stays");

        fleet.down.store(true, std::sync::atomic::Ordering::SeqCst);
        assert!(guard.refresh_settings().await.is_err());
        assert_eq!(
            guard.mode(),
            Mode::Shadow,
            "a failed read keeps the settings in force"
        );
        let (status, body) = send(&app, "PUT", r#"{"mode":"off"}"#).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(!body.to_string().contains("refused"), "{body}");
        assert_eq!(guard.mode(), Mode::Shadow);
        assert_eq!(
            get(&app, "GET", "/admin/bloom/items/fleet").await.0,
            StatusCode::SERVICE_UNAVAILABLE
        );
    }

    #[tokio::test]
    async fn the_fleet_view_lists_the_fleets_instances_or_this_one() {
        let guard = BloomGuard::builder().name("items").build();
        let app = app(&guard);
        let (status, view) = get(&app, "GET", "/admin/bloom/items/fleet").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            view["instances"][0]["id"],
            json!(crate::fleet::instance_id())
        );
        assert_eq!(view["instances"][0]["state"], json!("warming"));
        let member = guard
            .feed()
            .join_fleet(std::sync::Arc::new(MemoryFleet::default()));
        let (_, view) = get(&app, "GET", "/admin/bloom/items/fleet").await;
        let ids: Vec<_> = view["instances"]
            .as_array()
            .expect("a list")
            .iter()
            .map(|i| i["id"].clone())
            .collect();
        assert_eq!(ids, [json!("a:1"), json!("b:2")]);
        for field in [
            "mode",
            "generation",
            "origin",
            "keys",
            "estimated_fpp",
            "passed",
            "rejected",
            "false_negatives",
            "feed_age_ms",
            "seen_ago_ms",
            "version",
        ] {
            assert!(view["instances"][0].get(field).is_some(), "{field}");
        }
        drop(member);
        let (_, view) = get(&app, "GET", "/admin/bloom/items/fleet").await;
        assert_eq!(view["instances"].as_array().map(Vec::len), Some(1));
        assert_eq!(guard.stats().mode_set_by, SetBy::Default);
    }
}
