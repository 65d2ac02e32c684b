//! The settings of API keys, the admin key and CORS, and their checks: a key is
//! read from exactly one source, names are unique, and a limit is never 0.

use serde::{Deserialize, Serialize};

/// `[auth]`: where the admin key comes from, and where limits are shared.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AuthConfig {
    /// The environment variable holding the admin API's key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_key_env: Option<String>,
    /// Without an admin key, the admin API and `/ui` are closed to everyone;
    /// with this set, they are served to callers on the loopback address.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub admin_loopback: bool,
    /// A Redis server (`redis://host:port`) holding the rate-limit counters,
    /// so that every replica enforces the same limits.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_url: Option<String>,
}

/// A key's place in the queues, which the pool orders its waiters by.
pub use crate::fleet::pool::priority::Priority;

/// `[[keys]]`: one client key, what it may use and how much.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// Shown in metrics, logs and `/admin/keys`; never the secret.
    pub name: String,
    /// The SHA-256 of the key, in hex.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_sha256: Option<String>,
    /// The environment variable holding the key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_env: Option<String>,
    /// The key itself; for tests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// Models it may use (names or aliases); default: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Vec<String>>,
    /// Requests it may start per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_minute: Option<u64>,
    /// Prompt and completion tokens it may use per minute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_minute: Option<u64>,
    /// Requests it may have in flight, queued or running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent: Option<u32>,
    /// Its place in the queues.
    #[serde(default)]
    pub priority: Priority,
    /// Its prompts never share cached prefixes with another key's: each request
    /// carries a `cache_salt` of its own, so `cached_tokens` says nothing of
    /// what other keys sent (vLLM's `cache_salt`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cache_isolation: bool,
}

/// `[cors]`: which web pages may call the gateway from a browser.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CorsConfig {
    /// Origins (`https://chat.example.com`) allowed; `"localhost"` allows this
    /// machine's pages; `"*"` allows any, without credentials. Default: none,
    /// and no CORS headers at all.
    pub allowed_origins: Vec<String>,
    /// How long a browser may cache a preflight's answer.
    pub max_age_secs: u64,
}

impl Default for CorsConfig {
    fn default() -> Self {
        Self { allowed_origins: Vec::new(), max_age_secs: 600 }
    }
}

impl KeyConfig {
    /// The SHA-256 of the key, read from its one source; the error names the field.
    pub fn digest(&self, at: &str) -> Result<[u8; 32], String> {
        let sources = [self.key_sha256.is_some(), self.key_env.is_some(), self.key.is_some()];
        match sources.iter().filter(|s| **s).count() {
            1 => {}
            0 => return Err(format!("{at}: give one of key_sha256, key_env or key")),
            _ => {
                return Err(format!(
                    "{at}: give only one of key_sha256, key_env or key (a key both hashed and plain is ambiguous)"
                ))
            }
        }
        if let Some(hex) = &self.key_sha256 {
            return parse_hex(hex).ok_or_else(|| {
                format!("{at}.key_sha256: not 64 hex digits (the SHA-256 of the key)")
            });
        }
        let (field, secret) = match (&self.key_env, &self.key) {
            (Some(var), _) => {
                let value = std::env::var(var).unwrap_or_default();
                (format!("{at}.key_env"), value)
            }
            (None, Some(key)) => (format!("{at}.key"), key.clone()),
            (None, None) => unreachable!("one source is set"),
        };
        if secret.is_empty() {
            return Err(format!("{field}: the key is empty or the variable is not set"));
        }
        Ok(super::digest(secret.as_bytes()))
    }

    /// Checks the limits and models; the error names the field.
    pub fn check(&self, at: &str) -> Result<(), String> {
        if self.name.is_empty() {
            return Err(format!("{at}.name: must not be empty"));
        }
        let zero = [
            ("requests_per_minute", self.requests_per_minute == Some(0)),
            ("tokens_per_minute", self.tokens_per_minute == Some(0)),
            ("max_concurrent", self.max_concurrent == Some(0)),
        ];
        if let Some((field, _)) = zero.iter().find(|(_, z)| *z) {
            return Err(format!("{at}.{field}: must be at least 1 (leave it out for no limit)"));
        }
        if self.models.as_ref().is_some_and(Vec::is_empty) {
            return Err(format!("{at}.models: empty; leave it out to allow every model"));
        }
        self.digest(at).map(|_| ())
    }
}

/// Checks every key and that names and keys are unique.
pub fn check_keys(keys: &[KeyConfig]) -> Result<(), String> {
    let mut digests = Vec::with_capacity(keys.len());
    for (i, key) in keys.iter().enumerate() {
        let at = format!("keys[{i}]");
        key.check(&at)?;
        if keys[..i].iter().any(|k| k.name == key.name) {
            return Err(format!("{at}.name: `{}` is used by another key", key.name));
        }
        let digest = key.digest(&at)?;
        if digests.contains(&digest) {
            return Err(format!("{at}: the same key as another entry"));
        }
        digests.push(digest);
    }
    Ok(())
}

impl AuthConfig {
    /// The admin key's SHA-256, when one is configured; an unset variable is an error.
    pub fn admin_digest(&self) -> Result<Option<[u8; 32]>, String> {
        let Some(var) = &self.admin_key_env else { return Ok(None) };
        match std::env::var(var) {
            Ok(value) if !value.is_empty() => Ok(Some(super::digest(value.as_bytes()))),
            _ => Err(format!("auth.admin_key_env: the variable `{var}` is not set")),
        }
    }

    /// Checks the Redis URL's form.
    pub fn check(&self) -> Result<(), String> {
        self.admin_digest()?;
        if let Some(url) = &self.redis_url {
            if !url.starts_with("redis://") {
                return Err(format!("auth.redis_url: `{url}` is not a redis:// URL"));
            }
        }
        Ok(())
    }
}

impl CorsConfig {
    /// Checks that each origin is `*`, `localhost`, or a scheme and host with
    /// no path.
    pub fn check(&self) -> Result<(), String> {
        slotgate_http::cors::Cors::check(&self.allowed_origins, "cors.allowed_origins")
    }
}

fn parse_hex(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.as_bytes();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in hex.chunks(2).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16);
        out[i] = u8::try_from(digit(pair[0])? * 16 + digit(pair[1])?).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, secret: &str) -> KeyConfig {
        KeyConfig { name: name.into(), key: Some(secret.into()), ..KeyConfig::default() }
    }

    #[test]
    fn each_bad_key_is_refused_naming_its_field() {
        let hashed = KeyConfig {
            key_sha256: Some(
                "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08".into(),
            ),
            ..key("a", "test")
        };
        let err = check_keys(std::slice::from_ref(&hashed)).unwrap_err();
        assert!(err.contains("keys[0]") && err.contains("only one"), "{err}");
        let hashed = KeyConfig { key: None, ..hashed };
        assert_eq!(hashed.digest("k").unwrap(), crate::tenancy::digest(b"test"));
        let err = check_keys(&[key("a", "x"), key("a", "y")]).unwrap_err();
        assert!(err.contains("keys[1].name"), "{err}");
        let err = check_keys(&[key("a", "x"), key("b", "x")]).unwrap_err();
        assert!(err.contains("keys[1]"), "{err}");
        let zero = KeyConfig { tokens_per_minute: Some(0), ..key("a", "x") };
        assert!(check_keys(&[zero]).unwrap_err().contains("keys[0].tokens_per_minute"));
        let short = KeyConfig { key: None, key_sha256: Some("abc".into()), ..key("a", "") };
        assert!(check_keys(&[short]).unwrap_err().contains("keys[0].key_sha256"));
        let unset = KeyConfig {
            key: None,
            key_env: Some("SLOTGATE_TEST_NO_SUCH_VARIABLE".into()),
            ..key("a", "")
        };
        assert!(check_keys(&[unset]).unwrap_err().contains("keys[0].key_env"));
        assert!(check_keys(&[key("a", "x"), key("b", "y")]).is_ok());
    }

    #[test]
    fn origins_have_no_path() {
        let cors =
            |o: &str| CorsConfig { allowed_origins: vec![o.into()], ..CorsConfig::default() };
        assert!(cors("https://chat.example.com").check().is_ok());
        assert!(cors("http://127.0.0.1:3000").check().is_ok());
        assert!(cors("*").check().is_ok());
        assert!(cors("https://x.com/path").check().is_err());
        assert!(cors("chat.example.com").check().is_err());
    }
}
