//! The indexer APIs the field's routers already call, served beside our
//! own on the HTTP listener (`docs/routers.md`): NVIDIA Dynamo's standalone
//! indexer routes (`dynamo`; Mooncake's RFC #1403 has their shape) and
//! SGLang's gRPC indexer service (`sglang`). Each translates another
//! indexer's requests into our operations and their answers back.

use std::sync::Arc;

use axum::Router;

use crate::api::Api;

pub mod dynamo;
pub mod sglang;

/// Every drop-in route, on the API's state.
pub fn router(api: Arc<Api>) -> Router {
    dynamo::router(api.clone()).merge(sglang::router(api))
}
