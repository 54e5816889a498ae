//! The one lock helper: a mutex whose data stays valid even if a holder
//! panicked.

use std::sync::{Mutex, MutexGuard, PoisonError};

/// Locks `mutex`, taking the data over from a holder that panicked.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
