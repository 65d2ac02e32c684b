//! CORS, so that a browser chat front-end can call the gateway directly when the
//! operator allows its origin. Off by default: no CORS header is ever sent. A
//! listed origin is echoed back with credentials allowed; `*` allows any origin
//! without credentials; an origin that is not allowed gets no CORS header, so
//! the browser keeps the answer from the page.

use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use slotgate_protocol::{ApiError, ErrorType};

use super::config::CorsConfig;

/// Methods the gateway's routes take.
const METHODS: &str = "GET, POST, DELETE, OPTIONS";
/// Request headers allowed when a preflight names none.
const HEADERS: &str =
    "authorization, content-type, x-api-key, x-request-id, x-session-id, x-slotgate-deadline-ms";

/// The allowed origins.
#[derive(Debug, Default)]
pub struct Cors {
    origins: Vec<String>,
    any: bool,
    max_age: u64,
}

impl Cors {
    /// CORS as `config` allows it.
    pub fn new(config: &CorsConfig) -> Self {
        Self {
            origins: config.allowed_origins.iter().filter(|o| *o != "*").cloned().collect(),
            any: config.allowed_origins.iter().any(|o| o == "*"),
            max_age: config.max_age_secs,
        }
    }

    /// Whether no origin is allowed.
    pub fn is_off(&self) -> bool {
        self.origins.is_empty() && !self.any
    }

    /// `Some(true)`: the origin is listed (credentials allowed); `Some(false)`:
    /// allowed by `*`; `None`: not allowed.
    fn allows(&self, origin: &HeaderValue) -> Option<bool> {
        let origin = origin.to_str().ok()?;
        if self.origins.iter().any(|o| o.eq_ignore_ascii_case(origin)) {
            return Some(true);
        }
        self.any.then_some(false)
    }

    /// The answer to a preflight (`OPTIONS` with `Access-Control-Request-Method`),
    /// or `None` when the request is not one.
    pub fn preflight(&self, method: &Method, headers: &HeaderMap) -> Option<Response> {
        if self.is_off() || method != Method::OPTIONS {
            return None;
        }
        let origin = headers.get(header::ORIGIN)?;
        headers.get(header::ACCESS_CONTROL_REQUEST_METHOD)?;
        if self.allows(origin).is_none() {
            let err = ApiError::new(
                ErrorType::PermissionError,
                "this origin is not allowed (cors.allowed_origins)",
            );
            return Some(slotgate_http::api_response(err));
        }
        let mut response = StatusCode::NO_CONTENT.into_response();
        self.decorate(Some(origin), &mut response);
        let h = response.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_METHODS, HeaderValue::from_static(METHODS));
        let asked = headers.get(header::ACCESS_CONTROL_REQUEST_HEADERS).cloned();
        h.insert(
            header::ACCESS_CONTROL_ALLOW_HEADERS,
            asked.unwrap_or(HeaderValue::from_static(HEADERS)),
        );
        h.insert(header::ACCESS_CONTROL_MAX_AGE, HeaderValue::from(self.max_age));
        Some(response)
    }

    /// Adds the CORS headers for a request from `origin` to its answer.
    pub fn decorate(&self, origin: Option<&HeaderValue>, response: &mut Response) {
        if self.is_off() {
            return;
        }
        let h = response.headers_mut();
        h.append(header::VARY, HeaderValue::from_static("origin"));
        let Some(origin) = origin else { return };
        match self.allows(origin) {
            Some(true) => {
                h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
                h.insert(
                    header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
                    HeaderValue::from_static("true"),
                );
            }
            Some(false) => {
                h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, HeaderValue::from_static("*"));
            }
            None => {}
        }
        if self.allows(origin).is_some() {
            h.insert(
                header::ACCESS_CONTROL_EXPOSE_HEADERS,
                HeaderValue::from_static("x-request-id, retry-after"),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(origin: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::ORIGIN, HeaderValue::from_str(origin).unwrap());
        h.insert(header::ACCESS_CONTROL_REQUEST_METHOD, HeaderValue::from_static("POST"));
        h
    }

    #[test]
    fn only_allowed_origins_get_cors_headers() {
        let config = CorsConfig {
            allowed_origins: vec!["https://chat.example.com".into()],
            ..CorsConfig::default()
        };
        let cors = Cors::new(&config);
        let ok = cors.preflight(&Method::OPTIONS, &request("https://chat.example.com")).unwrap();
        assert_eq!(ok.status(), 204);
        assert_eq!(ok.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN], "https://chat.example.com");
        assert_eq!(ok.headers()[header::ACCESS_CONTROL_ALLOW_CREDENTIALS], "true");
        let evil = cors.preflight(&Method::OPTIONS, &request("https://evil.example.com")).unwrap();
        assert_eq!(evil.status(), 403);
        assert!(!evil.headers().contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN));
        assert!(!evil.headers().contains_key(header::ACCESS_CONTROL_ALLOW_CREDENTIALS));
        let mut answer = StatusCode::OK.into_response();
        cors.decorate(Some(&HeaderValue::from_static("https://evil.example.com")), &mut answer);
        assert!(!answer.headers().contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN));

        let any =
            Cors::new(&CorsConfig { allowed_origins: vec!["*".into()], ..CorsConfig::default() });
        let r = any.preflight(&Method::OPTIONS, &request("https://evil.example.com")).unwrap();
        assert_eq!(r.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN], "*");
        assert!(
            !r.headers().contains_key(header::ACCESS_CONTROL_ALLOW_CREDENTIALS),
            "never with *"
        );

        let off = Cors::new(&CorsConfig::default());
        assert!(off.preflight(&Method::OPTIONS, &request("https://chat.example.com")).is_none());
    }
}
