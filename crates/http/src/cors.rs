//! CORS, so that a browser front-end can call the gateway or an engine directly
//! when the operator allows its origin. Off by default: no CORS header is ever
//! sent. A listed origin (or, by `localhost`, any page served from this machine:
//! `localhost`, `127.0.0.1`, `[::1]`, any port) is echoed back with credentials
//! allowed; `*` allows any origin, echoed back without credentials; an origin that is not
//! allowed gets no CORS header, so the browser keeps the answer from the page.

use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

/// Methods the servers' routes take.
const METHODS: &str = "GET, POST, DELETE, OPTIONS";
/// Request headers allowed when a preflight names none.
const HEADERS: &str =
    "authorization, content-type, x-api-key, x-request-id, x-session-id, x-slotgate-deadline-ms";

/// The allowed origins.
#[derive(Debug, Default)]
pub struct Cors {
    origins: Vec<String>,
    any: bool,
    local: bool,
    max_age: u64,
}

impl Cors {
    /// CORS for `origins` (each an origin, `*` or `localhost`), whose preflights
    /// browsers may keep for `max_age` seconds.
    pub fn new(origins: &[String], max_age: u64) -> Self {
        let keyword = |o: &String| *o == "*" || *o == "localhost";
        Self {
            origins: origins.iter().filter(|o| !keyword(o)).cloned().collect(),
            any: origins.iter().any(|o| o == "*"),
            local: origins.iter().any(|o| o == "localhost"),
            max_age,
        }
    }

    /// Checks that each of `origins` is `*`, `localhost`, or a scheme and host
    /// with no path; the error names the first that is not, as `setting[i]`.
    pub fn check(origins: &[String], setting: &str) -> Result<(), String> {
        for (i, origin) in origins.iter().enumerate() {
            let host = origin.strip_prefix("http://").or_else(|| origin.strip_prefix("https://"));
            let ok = origin == "*"
                || origin == "localhost"
                || host.is_some_and(|h| !h.is_empty() && !h.contains('/'));
            if !ok {
                return Err(format!(
                    "{setting}[{i}]: `{origin}` is not an origin such as https://chat.example.com, \
                     `localhost` or `*`"
                ));
            }
        }
        Ok(())
    }

    /// Whether no origin is allowed.
    pub fn is_off(&self) -> bool {
        self.origins.is_empty() && !self.any && !self.local
    }

    /// `Some(true)`: the origin is listed (credentials allowed); `Some(false)`:
    /// allowed by `*`; `None`: not allowed.
    fn allows(&self, origin: &HeaderValue) -> Option<bool> {
        let origin = origin.to_str().ok()?;
        if self.origins.iter().any(|o| o.eq_ignore_ascii_case(origin)) {
            return Some(true);
        }
        if self.local && is_local(origin) {
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
        // 200 either way, as llama-server (and tower-http) answer: a page not
        // allowed gets no Access-Control-Allow-Origin, which is what browsers
        // refuse on and what their consoles then name.
        let mut response = StatusCode::OK.into_response();
        self.decorate(Some(origin), &mut response);
        if self.allows(origin).is_none() {
            return Some(response);
        }
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
            // The origin itself rather than `*`, as llama-server answers: the
            // same permission (no credentials), and caches keep apart by `Vary`.
            Some(false) => {
                h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone());
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

/// Whether `origin` is a page of this machine: `localhost`, `127.0.0.1` or
/// `[::1]`, on any scheme and port (and not `localhost.evil.com`).
fn is_local(origin: &str) -> bool {
    let Some((_, rest)) = origin.split_once("://") else { return false };
    let host = match rest.strip_prefix("[::1]") {
        Some(port) => return port.is_empty() || port.starts_with(':'),
        None => rest.split(':').next().unwrap_or(""),
    };
    matches!(host, "localhost" | "127.0.0.1") && !rest.contains('/')
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
        let cors = Cors::new(&["https://chat.example.com".into()], 600);
        let ok = cors.preflight(&Method::OPTIONS, &request("https://chat.example.com")).unwrap();
        assert_eq!(ok.status(), 200);
        assert_eq!(ok.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN], "https://chat.example.com");
        assert_eq!(ok.headers()[header::ACCESS_CONTROL_ALLOW_CREDENTIALS], "true");
        let evil = cors.preflight(&Method::OPTIONS, &request("https://evil.example.com")).unwrap();
        assert_eq!(evil.status(), 200, "answered, as llama-server answers, with no origin");
        assert!(!evil.headers().contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN));
        assert!(!evil.headers().contains_key(header::ACCESS_CONTROL_ALLOW_CREDENTIALS));
        let mut answer = StatusCode::OK.into_response();
        cors.decorate(Some(&HeaderValue::from_static("https://evil.example.com")), &mut answer);
        assert!(!answer.headers().contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN));

        let any = Cors::new(&["*".into()], 600);
        let r = any.preflight(&Method::OPTIONS, &request("https://evil.example.com")).unwrap();
        assert_eq!(r.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN], "https://evil.example.com");
        assert!(
            !r.headers().contains_key(header::ACCESS_CONTROL_ALLOW_CREDENTIALS),
            "never with *"
        );

        let off = Cors::new(&[], 600);
        assert!(off.preflight(&Method::OPTIONS, &request("https://chat.example.com")).is_none());
    }

    #[test]
    fn localhost_allows_this_machines_pages_only() {
        let cors = Cors::new(&["localhost".into()], 600);
        for origin in [
            "http://localhost",
            "http://localhost:8080",
            "http://127.0.0.1:3000",
            "http://[::1]",
            "http://[::1]:3000",
            "https://localhost",
        ] {
            let r = cors.preflight(&Method::OPTIONS, &request(origin)).unwrap();
            assert_eq!(r.headers()[header::ACCESS_CONTROL_ALLOW_ORIGIN], origin, "{origin}");
        }
        for origin in [
            "http://localhost.evil.com",
            "http://notlocalhost",
            "http://evil.com",
            "http://[::1].evil.com",
            "localhost",
        ] {
            let r = cors.preflight(&Method::OPTIONS, &request(origin)).unwrap();
            assert!(!r.headers().contains_key(header::ACCESS_CONTROL_ALLOW_ORIGIN), "{origin}");
        }
    }

    #[test]
    fn origins_are_checked() {
        let check = |o: &str| Cors::check(&[o.to_owned()], "cors_origins");
        assert!(check("https://chat.example.com").is_ok());
        assert!(check("http://127.0.0.1:3000").is_ok());
        assert!(check("*").is_ok() && check("localhost").is_ok());
        assert!(check("https://x.com/path").is_err());
        assert_eq!(
            check("chat.example.com").unwrap_err().split(':').next(),
            Some("cors_origins[0]")
        );
    }
}
