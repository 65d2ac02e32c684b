//! The request-body extractor: reads the bytes and parses them with errors in the
//! OpenAI envelope, naming the field at fault. An oversized body is a 413 in the
//! same envelope.

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use slotgate_protocol::{parse_json, ApiError};

use crate::error::api_response;

/// A JSON body of type `T`.
pub struct JsonBody<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|rejection| {
            let status = rejection.status();
            let err = ApiError::invalid(
                "body",
                format!("cannot read the request body: {}", rejection.body_text()),
            );
            let mut response = api_response(err);
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                *response.status_mut() = status;
            }
            response.into_response()
        })?;
        parse_json(&bytes).map(JsonBody).map_err(api_response)
    }
}
