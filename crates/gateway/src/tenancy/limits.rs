//! Per-key limits and usage: requests and tokens per minute, counted in fixed
//! one-minute windows of the wall clock (as LiteLLM counts them, so that every
//! replica agrees on the window without talking), and requests in flight.
//!
//! A request is admitted against the window it starts in; its tokens, known only
//! when its answer has been read (a stream's at its end), are added to the
//! window it ends in. A window whose tokens are spent refuses new requests until
//! it ends. The counters live here, or in Redis when `[auth] redis_url` is set
//! (see [`super::shared`]); concurrency is counted by each replica.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use slotgate_protocol::{ApiError, ErrorType};

use super::config::KeyConfig;
use super::Tenant;

use crate::metrics::{KEY_COMPLETION_TOKENS, KEY_PROMPT_TOKENS, KEY_REFUSALS, KEY_REQUESTS};

/// Why a key's request may be refused, as the `reason` label of its refusals.
pub const REFUSAL_REASONS: [&str; 3] =
    ["max_concurrent", "requests_per_minute", "tokens_per_minute"];

/// A key's limits; `None`: no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Limits {
    /// Requests started per minute.
    pub requests_per_minute: Option<u64>,
    /// Prompt and completion tokens per minute.
    pub tokens_per_minute: Option<u64>,
    /// Requests in flight, queued or running.
    pub max_concurrent: Option<u32>,
}

impl Limits {
    /// The limits of `key`.
    pub fn of(key: &KeyConfig) -> Self {
        Self {
            requests_per_minute: key.requests_per_minute,
            tokens_per_minute: key.tokens_per_minute,
            max_concurrent: key.max_concurrent,
        }
    }
}

/// What one key has used, kept across reloads by its name.
#[derive(Debug, Default)]
pub struct Usage {
    /// Requests in flight now.
    pub in_flight: AtomicU32,
    /// The current window, counted here (and, with Redis, a fallback).
    window: Mutex<Window>,
    /// Requests admitted since the start.
    pub requests: AtomicU64,
    /// Prompt tokens used since the start.
    pub prompt_tokens: AtomicU64,
    /// Completion tokens used since the start.
    pub completion_tokens: AtomicU64,
    /// Refusals since the start, by reason.
    refusals: Mutex<BTreeMap<&'static str, u64>>,
}

/// Counts of one minute.
#[derive(Debug, Default, Clone, Copy)]
pub struct Window {
    /// Minutes since the Unix epoch.
    pub minute: u64,
    /// Requests started in it.
    pub requests: u64,
    /// Tokens used in it.
    pub tokens: u64,
}

impl Usage {
    /// Refusals so far, by reason.
    pub fn refusals(&self) -> BTreeMap<&'static str, u64> {
        self.refusals.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The local window as of `minute`.
    pub fn window(&self, minute: u64) -> Window {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        if w.minute != minute {
            *w = Window { minute, ..Window::default() };
        }
        *w
    }

    fn local_admit(&self, minute: u64, limits: &Limits) -> Result<(), &'static str> {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        if w.minute != minute {
            *w = Window { minute, ..Window::default() };
        }
        if limits.tokens_per_minute.is_some_and(|max| w.tokens >= max) {
            return Err("tokens_per_minute");
        }
        if limits.requests_per_minute.is_some_and(|max| w.requests >= max) {
            return Err("requests_per_minute");
        }
        w.requests += 1;
        Ok(())
    }

    fn local_tokens(&self, minute: u64, tokens: u64) {
        let mut w = self.window.lock().unwrap_or_else(|e| e.into_inner());
        if w.minute != minute {
            *w = Window { minute, ..Window::default() };
        }
        w.tokens += tokens;
    }

    fn refused(&self, key: &str, reason: &'static str) {
        *self.refusals.lock().unwrap_or_else(|e| e.into_inner()).entry(reason).or_default() += 1;
        metrics::counter!(KEY_REFUSALS, "key" => key.to_owned(), "reason" => reason).increment(1);
    }
}

/// Where the windows' time comes from: seconds since the Unix epoch. The wall
/// clock in the gateway; a clock the test moves in tests.
pub type Clock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// Every key's usage by name, and where the windows are shared.
pub struct UsageBook {
    entries: Mutex<HashMap<String, (u32, Arc<Usage>)>>,
    /// Redis, when limits are shared between replicas.
    shared: Option<super::shared::RedisLimits>,
    clock: Clock,
}

impl Default for UsageBook {
    fn default() -> Self {
        Self::new(None)
    }
}

impl std::fmt::Debug for UsageBook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsageBook").field("shared", &self.shared.is_some()).finish()
    }
}

impl UsageBook {
    /// A book whose windows live in `shared` when given, on the wall clock.
    pub fn new(shared: Option<super::shared::RedisLimits>) -> Self {
        Self::with_clock(shared, Arc::new(unix_seconds))
    }

    /// A book whose windows follow `clock`.
    pub fn with_clock(shared: Option<super::shared::RedisLimits>, clock: Clock) -> Self {
        Self { entries: Mutex::default(), shared, clock }
    }

    /// The window now: minutes since the Unix epoch.
    pub fn minute(&self) -> u64 {
        (self.clock)() / 60
    }

    /// The number and usage of the key named `name`, made on first use.
    pub fn entry(&self, name: &str) -> (u32, Arc<Usage>) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let next = u32::try_from(entries.len() + 1).unwrap_or(u32::MAX);
        entries.entry(name.to_owned()).or_insert_with(|| (next, Arc::default())).clone()
    }

    /// Admits a request of `tenant`, or refuses it with a 429 whose
    /// `Retry-After` is the end of the window (1 s for concurrency).
    pub async fn admit(self: &Arc<Self>, tenant: &Arc<Tenant>) -> Result<Permit, ApiError> {
        let usage = &tenant.usage;
        let limits = &tenant.limits;
        let in_flight = usage.in_flight.fetch_add(1, Ordering::AcqRel) + 1;
        // The permit gives the place back whether admitted or not.
        let permit =
            Permit { book: self.clone(), tenant: tenant.clone(), prompt: 0, completion: 0 };
        if limits.max_concurrent.is_some_and(|max| in_flight > max) {
            return Err(permit.refuse("max_concurrent", 1));
        }
        let now = (self.clock)();
        let minute = now / 60;
        let to_window_end = u32::try_from(60 - now % 60).unwrap_or(60);
        let verdict = match &self.shared {
            Some(shared)
                if limits.requests_per_minute.is_some() || limits.tokens_per_minute.is_some() =>
            {
                let per_minute = (limits.requests_per_minute, limits.tokens_per_minute);
                match shared.admit(&tenant.name, minute, per_minute).await {
                    Some(verdict) => verdict,
                    None => usage.local_admit(minute, limits),
                }
            }
            _ => usage.local_admit(minute, limits),
        };
        if let Err(reason) = verdict {
            return Err(permit.refuse(reason, to_window_end));
        }
        usage.requests.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(KEY_REQUESTS, "key" => tenant.name.to_string()).increment(1);
        Ok(permit)
    }
}

/// An admitted request of one key: holds its place among the key's requests in
/// flight, and adds its tokens to the key's window when dropped.
pub struct Permit {
    book: Arc<UsageBook>,
    tenant: Arc<Tenant>,
    prompt: u64,
    completion: u64,
}

impl Permit {
    /// The key's name.
    pub fn key(&self) -> &Arc<str> {
        &self.tenant.name
    }

    /// The tokens the answer reported (the largest seen, for a stream that
    /// reports them more than once).
    pub fn tokens(&mut self, prompt: u64, completion: u64) {
        self.prompt = self.prompt.max(prompt);
        self.completion = self.completion.max(completion);
    }

    fn refuse(self, reason: &'static str, retry_after: u32) -> ApiError {
        self.tenant.usage.refused(&self.tenant.name, reason);
        let what = match reason {
            "max_concurrent" => "too many requests in flight",
            "requests_per_minute" => "requests per minute",
            _ => "tokens per minute",
        };
        ApiError::new(
            ErrorType::RateLimitError,
            format!(
                "rate limit reached for key `{}`: {what}; retry after {retry_after} s",
                self.tenant.name
            ),
        )
        .with_code("rate_limit_exceeded")
        .with_retry_after(retry_after)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let usage = &self.tenant.usage;
        usage.in_flight.fetch_sub(1, Ordering::AcqRel);
        let tokens = self.prompt + self.completion;
        if tokens == 0 {
            return;
        }
        usage.prompt_tokens.fetch_add(self.prompt, Ordering::Relaxed);
        usage.completion_tokens.fetch_add(self.completion, Ordering::Relaxed);
        let key = self.tenant.name.to_string();
        metrics::counter!(KEY_PROMPT_TOKENS, "key" => key.clone()).increment(self.prompt);
        metrics::counter!(KEY_COMPLETION_TOKENS, "key" => key).increment(self.completion);
        let minute = self.book.minute();
        usage.local_tokens(minute, tokens);
        if let Some(shared) = &self.book.shared {
            shared.add_tokens(&self.tenant.name, minute, tokens);
        }
    }
}

fn unix_seconds() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tenancy::config::AuthConfig;
    use crate::tenancy::Auth;

    fn tenant(key: KeyConfig, book: &UsageBook) -> Arc<Tenant> {
        let auth = Auth::build(&[key], &AuthConfig::default(), book).unwrap();
        auth.tenants()[0].clone()
    }

    fn key() -> KeyConfig {
        KeyConfig { name: "a".into(), key: Some("sk".into()), ..KeyConfig::default() }
    }

    #[tokio::test]
    async fn each_limit_refuses_with_a_retry_after() {
        let book = Arc::new(UsageBook::default());
        let t = tenant(KeyConfig { max_concurrent: Some(2), ..key() }, &book);
        let a = book.admit(&t).await.unwrap();
        let _b = book.admit(&t).await.unwrap();
        let err = book.admit(&t).await.err().unwrap();
        assert_eq!((err.status(), err.retry_after), (429, Some(1)));
        assert_eq!(err.code.as_deref(), Some("rate_limit_exceeded"));
        drop(a);
        assert!(book.admit(&t).await.is_ok(), "a finished request frees its place");

        let book = Arc::new(UsageBook::default());
        let t = tenant(KeyConfig { requests_per_minute: Some(2), ..key() }, &book);
        for _ in 0..2 {
            drop(book.admit(&t).await.unwrap());
        }
        let err = book.admit(&t).await.err().unwrap();
        assert!(err.message.contains("requests per minute"), "{}", err.message);
        assert!((1..=60).contains(&err.retry_after.unwrap()));
        assert_eq!(t.usage.refusals().get("requests_per_minute"), Some(&1));

        let book = Arc::new(UsageBook::default());
        let t = tenant(KeyConfig { tokens_per_minute: Some(100), ..key() }, &book);
        let mut p = book.admit(&t).await.unwrap();
        p.tokens(60, 10);
        p.tokens(60, 39);
        drop(p);
        assert!(book.admit(&t).await.is_ok(), "99 of 100 tokens used");
        let mut p = book.admit(&t).await.unwrap();
        p.tokens(1, 0);
        drop(p);
        let err = book.admit(&t).await.err().unwrap();
        assert!(err.message.contains("tokens per minute"), "{}", err.message);
        assert_eq!(t.usage.prompt_tokens.load(Ordering::Relaxed), 61);
    }

    #[test]
    fn usage_outlives_a_reload_by_name() {
        let book = UsageBook::default();
        let (a1, u1) = book.entry("a");
        let (b, _) = book.entry("b");
        let (a2, u2) = book.entry("a");
        assert_eq!(a1, a2);
        assert_ne!(a1, b);
        assert!(Arc::ptr_eq(&u1, &u2));
    }

    /// On a clock the test moves: a window's requests and tokens are refused
    /// past their limits with the seconds left in it, and a new window admits
    /// again; tokens count in the window a request ends in.
    #[tokio::test]
    async fn windows_follow_the_books_clock() {
        let now = Arc::new(AtomicU64::new(120 * 60 + 15));
        let clock = now.clone();
        let book =
            Arc::new(UsageBook::with_clock(None, Arc::new(move || clock.load(Ordering::SeqCst))));
        let key = KeyConfig { requests_per_minute: Some(2), tokens_per_minute: Some(100), ..key() };
        let tenant = tenant(key, &book);
        let mut first = book.admit(&tenant).await.unwrap();
        drop(book.admit(&tenant).await.unwrap());
        let refused = book.admit(&tenant).await.map(|_| ()).unwrap_err();
        assert_eq!(refused.retry_after, Some(45), "{refused:?}");
        // The first request ends in the next minute: its tokens count there.
        now.store(121 * 60 + 59, Ordering::SeqCst);
        first.tokens(60, 40);
        drop(first);
        assert_eq!(tenant.usage.window(121).tokens, 100);
        let spent = book.admit(&tenant).await.map(|_| ()).unwrap_err();
        assert!(spent.message.contains("tokens per minute"), "{spent:?}");
        assert_eq!(spent.retry_after, Some(1));
        now.store(122 * 60, Ordering::SeqCst);
        drop(book.admit(&tenant).await.unwrap());
        assert_eq!(book.minute(), 122);
    }
}
