//! Tests of `backend.rs`.

use super::*;
use crate::postgres::log::feed::LogRead;

/// A read of another epoch sends the guard to a rebuild every time it
/// is asked, whoever's read it was: one made for another guard (a
/// shared read, whose answer for this guard only fails its waiting
/// refusals) does not make the next read continue from the position.
#[test]
fn a_position_of_another_epoch_is_never_continued_from() {
    let since = LogPosition {
        lsn: 5_000,
        epoch: "slot@streamed@before".to_owned(),
    };
    let read = LogRead {
        rows: Vec::new(),
        position: 6_000,
        horizon: 4_000,
        epoch: "slot@streamed@after".to_owned(),
        lag: None,
    };
    assert!(matches!(changes(&since, &read), Read::Pruned));
    assert!(matches!(changes(&since, &read), Read::Pruned));
    let same = LogRead {
        epoch: since.epoch.clone(),
        ..read
    };
    let Read::Changes { position, .. } = changes(&since, &same) else {
        panic!("a read of the position's own epoch was not continued from");
    };
    assert_eq!(position.lsn, 6_000);
    assert_eq!(position.epoch, since.epoch);
}
