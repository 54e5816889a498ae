//! Which table and key columns a change feed watches.

/// A table whose keys a guard holds, and the column(s) that make the key.
///
/// The same value installs the feed's triggers ([`install`](Self::install),
/// once, at migration time), gives the warm-up scan its key query, and names
/// the feed that a follower reads. A table with children or partitions is
/// watched whole.
///
/// # Keys
///
/// One column: its Postgres text form (`key::text`: an integer in decimal,
/// a UUID in lower case with hyphens). Several columns: each part's text
/// prefixed by its length in bytes and a colon, `2:423:abc` for `(42,
/// 'abc')`, which no other key shares. Rows with a NULL key part are left
/// out: no request can name them.
///
/// # Example
///
/// ```no_run
/// use bloom_guard_sqlx::Watch;
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), bloom_guard_sqlx::FeedError> {
/// let users = Watch::table("users").key("id");
/// let orders = Watch::table("shop.orders").key("tenant").key("number").name("orders");
/// users.install(&pool).await?;
/// orders.install(&pool).await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Watch {
    pub(crate) table: String,
    pub(crate) key_columns: Vec<String>,
    name: Option<String>,
}

impl Watch {
    /// Watches `table` (as SQL names it: `items`, `shop.orders`,
    /// `"Mixed Case"`). Add its key column(s) with [`key`](Self::key): a
    /// watch without one is refused by the database.
    pub fn table(table: impl Into<String>) -> Self {
        Self {
            table: table.into(),
            key_columns: Vec::new(),
            name: None,
        }
    }

    /// Adds a key column; call once per column of a composite key, in the
    /// order the request path names them.
    #[must_use]
    pub fn key(mut self, column: impl Into<String>) -> Self {
        self.key_columns.push(column.into());
        self
    }

    /// The feed's name (default: the table's name as given): the `guard`
    /// column of `bloom_guard.changes` and the payload of its wake-ups.
    #[must_use]
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// The feed's name.
    pub fn feed_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.table)
    }
}
