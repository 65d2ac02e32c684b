//! Every answer of the generation endpoints counted once in
//! `slotgate_engine_requests_total`, by status and model, whatever produced it:
//! the handler, a refusal of the body before the handler ran, or a model that
//! is not served. Handlers say which model they serve ([`serving`]) once they
//! know it; an answer given before that (a body that does not parse, a model
//! not served) is counted with an empty model, so that a client's made-up
//! model names never become labels.

use std::cell::RefCell;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;

use crate::metrics as m;

tokio::task_local! {
    /// The model the request being answered was for, once known.
    static MODEL: RefCell<String>;
}

/// Records that the request being answered is for `model` (a served model's id).
pub(super) fn serving(model: &str) {
    let _ = MODEL.try_with(|m| model.clone_into(&mut m.borrow_mut()));
}

/// The layer that counts: runs the route, then counts its answer.
pub(super) async fn record(request: Request, next: Next) -> Response {
    let (response, model) = MODEL
        .scope(RefCell::new(String::new()), async move {
            let response = next.run(request).await;
            (response, MODEL.with(|m| m.take()))
        })
        .await;
    let status = response.status().as_u16().to_string();
    metrics::counter!(m::REQUESTS, "model" => model, "status" => status).increment(1);
    response
}
