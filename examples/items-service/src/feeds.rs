//! Which tables and columns hold the guards' keys: their change feeds are
//! installed with the migrations and read by every instance.

use bloom_guard_sqlx::Watch;

/// The table and column whose values are every key the guard must hold:
/// its change feed is installed with the migrations and read by every
/// instance.
pub fn items_feed() -> Watch {
    Watch::table("items").key("key")
}

/// The table and column of the `users` guard's keys.
pub fn users_feed() -> Watch {
    Watch::table("users").key("id")
}
