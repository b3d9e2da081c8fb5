//! One route for both Python classes: [`prefix_client::Client`]'s and
//! [`prefix_client::Cluster`]'s routes behind one pointer, so that
//! `Index`'s methods are written once.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use prefix_client::wire::{Op, Reply};
use prefix_client::{ClientError, Route};

/// A future of the erased route.
type Pending<T> = Pin<Box<dyn Future<Output = Result<T, ClientError>> + Send>>;

/// A [`Route`] behind a pointer: what lets one Python class, [`Index`],
/// call a client or a cluster.
trait Erased: Send + Sync {
    fn one(&self, op: Op) -> Pending<Reply>;
    fn batch(&self, ops: Vec<Op>) -> Pending<Vec<Reply>>;
}

impl<R: Route> Erased for R {
    fn one(&self, op: Op) -> Pending<Reply> {
        let route = self.clone();
        Box::pin(async move { route.one(op).await })
    }

    fn batch(&self, ops: Vec<Op>) -> Pending<Vec<Reply>> {
        let route = self.clone();
        Box::pin(async move { route.batch(ops).await })
    }
}

/// A client's or a cluster's route, chosen when the Python object is made.
#[derive(Clone)]
pub(crate) struct AnyRoute(Arc<dyn Erased>);

impl AnyRoute {
    pub(crate) fn of<R: Route>(index: &prefix_client::Index<R>) -> prefix_client::Index<AnyRoute> {
        prefix_client::Index::new(AnyRoute(Arc::new(index.route().clone())))
    }
}

impl Route for AnyRoute {
    fn one(&self, op: Op) -> impl Future<Output = Result<Reply, ClientError>> + Send {
        self.0.one(op)
    }

    fn batch(&self, ops: Vec<Op>) -> impl Future<Output = Result<Vec<Reply>, ClientError>> + Send {
        self.0.batch(ops)
    }
}

/// The operations of either class.
pub(crate) type AnyIndex = prefix_client::Index<AnyRoute>;
