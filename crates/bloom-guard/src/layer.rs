//! `BloomGuard` as a tower `Layer`.

use tower_layer::Layer;

use crate::guard::BloomGuard;
use crate::service::BloomGuardService;

/// The handle is the layer: `.route_layer(guard.clone())`.
impl<S, K: Clone> Layer<S> for BloomGuard<K> {
    type Service = BloomGuardService<S, K>;

    fn layer(&self, inner: S) -> Self::Service {
        BloomGuardService::new(inner, self.clone())
    }
}
