//! Tests of `feed.rs`.

use super::*;

#[test]
fn reads_ask_for_open_ids_by_value_up_to_a_bound() {
    let mut since = Cursor {
        high: 10,
        digest: None,
        open: [3, 7].into_iter().collect(),
    };
    assert_eq!(
        after(&since, ""),
        ("(id > ? or id in (?, ?))".to_owned(), vec![10, 3, 7])
    );
    since.open = (1..=2000).collect();
    since.high = 3000;
    assert_eq!(after(&since, ""), ("id >= ?".to_owned(), vec![1]));
    since.open = OpenIds::new();
    assert_eq!(after(&since, ""), ("id > ?".to_owned(), vec![3000]));
}
