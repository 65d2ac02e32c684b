//! Who may make an admin call, for the engine and the gateway alike: the holder of
//! the admin key; without a key, nobody, unless the operator opted in to
//! serving callers on the loopback address. Calls that change something must be
//! JSON (a cross-site form post is `text/plain` or a form type), and no admin
//! call is taken from another web origin (a cross-site `fetch` carries an
//! `Origin` that names another host), so that a page a browser opened can
//! neither drive them nor read what they answer.

use std::net::SocketAddr;

use axum::http::{header, HeaderMap, Method};
use slotgate_protocol::{ApiError, ErrorType};

use crate::keys;

/// How admin calls are let in.
#[derive(Debug, Clone, Copy)]
pub struct Gate<'a> {
    /// The admin key's SHA-256, when one is configured.
    pub key: Option<&'a [u8; 32]>,
    /// Without a key: serve callers on the loopback address (opted in).
    pub loopback: bool,
    /// What the setting is called, for the refusal's message.
    pub setting: &'static str,
}

impl Gate<'_> {
    /// Whether the call may go on: the key, or the loopback opt-in; from this
    /// origin; and a POST, as JSON.
    pub fn check(
        &self,
        method: &Method,
        headers: &HeaderMap,
        peer: Option<SocketAddr>,
    ) -> Result<(), ApiError> {
        match self.key {
            Some(key) if !keys::carries(headers, key) => {
                return Err(ApiError::new(
                    ErrorType::AuthenticationError,
                    "this endpoint needs the admin key, as `Authorization: Bearer KEY`",
                )
                .with_code("invalid_api_key"));
            }
            Some(_) => {}
            None if self.loopback && peer.is_some_and(|p| p.ip().is_loopback()) => {}
            None => {
                return Err(ApiError::new(
                    ErrorType::PermissionError,
                    format!(
                        "admin calls are closed: no admin key is configured ({}); set one, or \
                         opt in to serving them on the loopback address",
                        self.setting
                    ),
                )
                .with_code("admin_closed"));
            }
        }
        // A GET is refused only when a page's script reads it from elsewhere (with
        // an `Origin`): a link followed from elsewhere to the dashboard is fine.
        same_origin(headers, method != Method::GET && method != Method::HEAD)?;
        if method == Method::POST {
            json(headers)?;
        }
        Ok(())
    }
}

/// Refuses a call from another web origin; with `strict`, also one the browser
/// says another site started.
pub fn same_origin(headers: &HeaderMap, strict: bool) -> Result<(), ApiError> {
    let cross = |why: &str| {
        Err(ApiError::new(ErrorType::PermissionError, format!("admin calls {why}"))
            .with_code("cross_origin"))
    };
    if let Some(site) = headers.get("sec-fetch-site").filter(|_| strict) {
        if !matches!(site.as_bytes(), b"same-origin" | b"none") {
            return cross("are not taken from another web site");
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("");
        let origin = origin.to_str().unwrap_or("");
        let authority = origin.split_once("://").map_or("", |(_, rest)| rest);
        if host.is_empty() || !authority.eq_ignore_ascii_case(host) {
            return cross("are not taken from another web origin");
        }
    }
    Ok(())
}

/// Refuses a body that is not JSON.
pub fn json(headers: &HeaderMap) -> Result<(), ApiError> {
    let json = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").trim())
        .is_some_and(|v| v.eq_ignore_ascii_case("application/json"));
    if !json {
        let mut err = ApiError::new(
            ErrorType::InvalidRequestError,
            "admin calls must send `Content-Type: application/json`",
        )
        .with_code("unsupported_media_type");
        err.param = Some("content-type".into());
        return Err(err);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    const JSON: (&str, &str) = ("content-type", "application/json");

    #[test]
    fn without_a_key_only_an_opted_in_loopback_caller_passes() {
        let local: SocketAddr = "127.0.0.1:5000".parse().unwrap();
        let remote: SocketAddr = "10.1.2.3:5000".parse().unwrap();
        let closed = Gate { key: None, loopback: false, setting: "x" };
        let err = closed.check(&Method::GET, &HeaderMap::new(), Some(local)).unwrap_err();
        assert_eq!((err.status(), err.code.as_deref()), (403, Some("admin_closed")));
        let local_only = Gate { key: None, loopback: true, setting: "x" };
        assert!(local_only.check(&Method::GET, &HeaderMap::new(), Some(local)).is_ok());
        assert!(local_only.check(&Method::GET, &HeaderMap::new(), Some(remote)).is_err());
        assert!(local_only.check(&Method::GET, &HeaderMap::new(), None).is_err());
    }

    #[test]
    fn a_key_is_checked_and_changes_must_be_same_origin_json() {
        let key = keys::digest(b"sk-admin");
        let gate = Gate { key: Some(&key), loopback: false, setting: "x" };
        let bearer = ("authorization", "Bearer sk-admin");
        assert_eq!(gate.check(&Method::GET, &HeaderMap::new(), None).unwrap_err().status(), 401);
        assert!(gate.check(&Method::GET, &headers(&[bearer]), None).is_ok());
        let plain = headers(&[bearer, ("content-type", "text/plain")]);
        assert_eq!(gate.check(&Method::POST, &plain, None).unwrap_err().status(), 400);
        assert!(gate.check(&Method::POST, &headers(&[bearer, JSON]), None).is_ok());
        let from_page =
            headers(&[bearer, JSON, ("host", "gw:8080"), ("origin", "http://evil.example")]);
        assert_eq!(gate.check(&Method::POST, &from_page, None).unwrap_err().status(), 403);
        let same = headers(&[bearer, JSON, ("host", "gw:8080"), ("origin", "http://gw:8080")]);
        assert!(gate.check(&Method::POST, &same, None).is_ok());
        let fetched = headers(&[bearer, ("sec-fetch-site", "cross-site")]);
        assert_eq!(gate.check(&Method::DELETE, &fetched, None).unwrap_err().status(), 403);
        assert!(gate.check(&Method::GET, &fetched, None).is_ok(), "a link from elsewhere");
        let read = headers(&[bearer, ("host", "gw:8080"), ("origin", "http://evil.example")]);
        assert_eq!(gate.check(&Method::GET, &read, None).unwrap_err().status(), 403);
        assert!(gate.check(&Method::DELETE, &headers(&[bearer]), None).is_ok(), "no body, no type");
    }
}
