//! Who is calling: the client keys (`[[keys]]`) and the admin key. Without any
//! client key the gateway is open, as before; with keys, every forwarded request
//! and model list needs one, compared in constant time against stored hashes.
//! The admin API is closed without an admin key (or, opted in, served to the
//! loopback address only).
//! The secret is never kept, logged nor used as a label: only its SHA-256 and
//! the key's name.

pub mod config;
pub mod limits;
pub mod shared;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::http::{HeaderMap, Method};
use slotgate_protocol::{ApiError, ErrorType};

use config::{AuthConfig, KeyConfig, Priority};
use limits::{Limits, Usage, UsageBook};

pub use slotgate_http::keys::digest;
use slotgate_http::keys::{presented, same};

/// One client key as the gateway uses it.
#[derive(Debug)]
pub struct Tenant {
    /// Its name from the configuration.
    pub name: Arc<str>,
    digest: [u8; 32],
    /// Models it may use, by name or alias; `None`: all.
    models: Option<Vec<String>>,
    /// Its place in the queues.
    pub priority: Priority,
    /// Its number, stable across reloads, that the queues tell keys apart by.
    pub id: u32,
    /// Its limits.
    pub limits: Limits,
    /// What it has used; kept across reloads.
    pub usage: Arc<Usage>,
    /// Its `cache_salt`: derived from the key's digest, so the same on every
    /// replica and across restarts, and not guessable by another tenant (who
    /// would need the key's hash). A salt its client sends is salted with it.
    pub cache_salt: Arc<str>,
    /// Whether a request of its without a salt of its own carries this one.
    pub cache_isolation: bool,
}

impl Tenant {
    /// The models it may use; `None`: all.
    pub fn models(&self) -> Option<&[String]> {
        self.models.as_deref()
    }

    /// Whether it may use `model` (asked as `asked`, which may be an alias).
    pub fn may_use(&self, asked: &str, model: &str) -> bool {
        self.models.as_ref().is_none_or(|m| m.iter().any(|x| x == asked || x == model))
    }
}

/// The `cache_salt` of a key whose digest is `digest`: a hash of it under a
/// label of its own, in hex.
fn cache_salt(digest: &[u8; 32]) -> Arc<str> {
    let mut input = b"slotgate cache_salt\0".to_vec();
    input.extend_from_slice(digest);
    self::digest(&input).iter().map(|b| format!("{b:02x}")).collect::<String>().into()
}

/// The keys in force; replaced whole on reload.
#[derive(Debug, Default)]
pub struct Auth {
    tenants: Vec<Arc<Tenant>>,
    admin: Option<[u8; 32]>,
    /// Without an admin key, admin calls from the loopback address are served.
    admin_loopback: bool,
}

impl Auth {
    /// The keys of `keys` and `auth`, their usage taken from `book` by name.
    pub fn build(keys: &[KeyConfig], auth: &AuthConfig, book: &UsageBook) -> Result<Self, String> {
        config::check_keys(keys)?;
        let admin = auth.admin_digest()?;
        let mut tenants = Vec::with_capacity(keys.len());
        for (i, key) in keys.iter().enumerate() {
            let (id, usage) = book.entry(&key.name);
            let digest = key.digest(&format!("keys[{i}]"))?;
            tenants.push(Arc::new(Tenant {
                name: key.name.as_str().into(),
                digest,
                cache_salt: cache_salt(&digest),
                cache_isolation: key.cache_isolation,
                models: key.models.clone(),
                priority: key.priority,
                id,
                limits: Limits::of(key),
                usage,
            }));
        }
        Ok(Self { tenants, admin, admin_loopback: auth.admin_loopback })
    }

    /// Whether clients need no key.
    pub fn is_open(&self) -> bool {
        self.tenants.is_empty()
    }

    /// Every client key.
    pub fn tenants(&self) -> &[Arc<Tenant>] {
        &self.tenants
    }

    /// The caller's key: `None` when the gateway is open, else its tenant or a 401.
    pub fn identify(&self, headers: &HeaderMap) -> Result<Option<Arc<Tenant>>, ApiError> {
        if self.is_open() {
            return Ok(None);
        }
        let Some(secret) = presented(headers) else {
            return Err(unauthorized(
                "no API key: send it as `Authorization: Bearer KEY` or in `x-api-key`",
            ));
        };
        let d = digest(secret);
        // Every key is compared, found or not: the time says nothing of which.
        let mut found = None;
        for tenant in &self.tenants {
            if same(&tenant.digest, &d) {
                found = Some(tenant.clone());
            }
        }
        found.map(Some).ok_or_else(|| unauthorized("the API key is not valid"))
    }

    /// Whether the caller may make an admin call (`method`, from `peer`): it sent
    /// the admin key; without one configured, nobody may, unless
    /// `auth.admin_loopback` lets in callers on the loopback address. Never
    /// from another web origin; a POST must be JSON.
    pub fn admin(
        &self,
        method: &Method,
        headers: &HeaderMap,
        peer: Option<SocketAddr>,
    ) -> Result<(), ApiError> {
        if let (Some(admin), Some(secret)) = (&self.admin, presented(headers)) {
            let d = digest(secret);
            if !same(admin, &d) && self.tenants.iter().any(|t| same(&t.digest, &d)) {
                return Err(ApiError::new(
                    ErrorType::PermissionError,
                    "a client key does not open the admin API",
                ));
            }
        }
        let gate = slotgate_http::admin::Gate {
            key: self.admin.as_ref(),
            loopback: self.admin_loopback,
            setting: "auth.admin_key_env",
        };
        gate.check(method, headers, peer)
    }
}

fn unauthorized(message: &str) -> ApiError {
    ApiError::new(ErrorType::AuthenticationError, message).with_code("invalid_api_key")
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    fn headers(name: &'static str, value: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(name, HeaderValue::from_str(value).unwrap());
        h
    }

    fn auth(admin_env: Option<&str>) -> Auth {
        let keys =
            [KeyConfig { name: "a".into(), key: Some("sk-a".into()), ..KeyConfig::default() }];
        let config =
            AuthConfig { admin_key_env: admin_env.map(Into::into), ..AuthConfig::default() };
        Auth::build(&keys, &config, &UsageBook::default()).unwrap()
    }

    #[test]
    fn a_client_key_opens_the_api_and_never_the_admin_api() {
        let auth = auth(None);
        let bearer = headers("authorization", "Bearer sk-a");
        assert_eq!(&*auth.identify(&bearer).unwrap().unwrap().name, "a");
        let x = headers("x-api-key", "sk-a");
        assert_eq!(&*auth.identify(&x).unwrap().unwrap().name, "a");
        for bad in [
            HeaderMap::new(),
            headers("authorization", "Bearer sk-b"),
            headers("authorization", "Basic sk-a"),
        ] {
            let err = auth.identify(&bad).unwrap_err();
            assert_eq!((err.status(), err.code.as_deref()), (401, Some("invalid_api_key")));
        }
        let local: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let get = |auth: &Auth, h: &HeaderMap| auth.admin(&Method::GET, h, Some(local));
        assert_eq!(get(&auth, &bearer).unwrap_err().status(), 403, "no admin key: closed");
        assert_eq!(get(&Auth::default(), &HeaderMap::new()).unwrap_err().status(), 403, "closed");
        let loopback = Auth { admin_loopback: true, ..Auth::default() };
        assert!(get(&loopback, &HeaderMap::new()).is_ok(), "opted in, on loopback");
        let remote: SocketAddr = "192.0.2.1:1".parse().unwrap();
        assert!(loopback.admin(&Method::GET, &HeaderMap::new(), Some(remote)).is_err());
        assert!(Auth::default().identify(&HeaderMap::new()).unwrap().is_none());
    }

    #[test]
    fn the_admin_key_opens_only_the_admin_api() {
        // The variable is this test's own.
        std::env::set_var("SLOTGATE_TEST_ADMIN_KEY_UNIT", "sk-admin");
        let auth = auth(Some("SLOTGATE_TEST_ADMIN_KEY_UNIT"));
        let admin = headers("authorization", "Bearer sk-admin");
        let get = |h: &HeaderMap| auth.admin(&Method::GET, h, None);
        assert!(get(&admin).is_ok());
        assert_eq!(auth.identify(&admin).unwrap_err().status(), 401);
        assert_eq!(get(&headers("authorization", "Bearer sk-a")).unwrap_err().status(), 403);
        assert_eq!(get(&HeaderMap::new()).unwrap_err().status(), 401);
    }
}
