//! Rate-limit windows shared by every gateway replica through Redis
//! (`[auth] redis_url`): per key and minute, a request counter and a token
//! counter, checked and counted by one script so that two replicas cannot both
//! take the last request of a window. When Redis cannot be reached the gateway
//! keeps serving on its own counters, says so in its log and sets
//! `slotgate_limits_redis_up` to 0.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio_util::sync::CancellationToken;

use crate::metrics::REDIS_UP;

/// Longest wait for Redis on a request's path before local counters decide.
const TIMEOUT: Duration = Duration::from_millis(250);

/// Checks both windows and counts the request, atomically. KEYS: requests,
/// tokens; ARGV: the request and token limits ("" for none). Returns 0 when
/// admitted, 1 when the requests, 2 when the tokens are spent.
const ADMIT: &str = r"
local tokens = tonumber(redis.call('GET', KEYS[2]) or '0')
if ARGV[2] ~= '' and tokens >= tonumber(ARGV[2]) then return 2 end
local requests = tonumber(redis.call('GET', KEYS[1]) or '0')
if ARGV[1] ~= '' and requests >= tonumber(ARGV[1]) then return 1 end
redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], 120)
return 0
";

/// The connection to Redis, made and remade by a task of the gateway.
#[derive(Clone)]
pub struct RedisLimits {
    inner: Arc<Inner>,
}

struct Inner {
    connection: ArcSwapOption<ConnectionManager>,
    script: redis::Script,
    /// Whether the last operation reached Redis; a change is logged once.
    up: AtomicBool,
}

impl RedisLimits {
    /// Starts connecting to `url` in a task that ends with `stop`. An invalid
    /// URL is an error; an unreachable server is not.
    pub fn start(url: &str, stop: CancellationToken) -> Result<Self, String> {
        let client = redis::Client::open(url).map_err(|e| format!("auth.redis_url: {e}"))?;
        let inner = Arc::new(Inner {
            connection: ArcSwapOption::empty(),
            script: redis::Script::new(ADMIT),
            up: AtomicBool::new(true),
        });
        metrics::gauge!(REDIS_UP).set(0.0);
        let task = inner.clone();
        tokio::spawn(async move {
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Duration::from_millis(500))
                .set_response_timeout(TIMEOUT)
                .set_number_of_retries(2)
                .set_max_delay(1000);
            while task.connection.load().is_none() {
                let connect = ConnectionManager::new_with_config(client.clone(), config.clone());
                tokio::select! {
                    () = stop.cancelled() => return,
                    made = connect => match made {
                        Ok(manager) => {
                            task.connection.store(Some(Arc::new(manager)));
                            task.mark(true);
                        }
                        Err(e) => {
                            task.mark(false);
                            tracing::debug!(error = %e, "redis: not reachable yet");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    },
                }
            }
        });
        Ok(Self { inner })
    }

    /// Checks and counts a request of `key` in `minute`'s window against its
    /// `(requests, tokens)` per minute; `None` when Redis did not answer (the
    /// caller counts locally).
    pub async fn admit(
        &self,
        key: &str,
        minute: u64,
        (requests_per_minute, tokens_per_minute): (Option<u64>, Option<u64>),
    ) -> Option<Result<(), &'static str>> {
        let mut connection = (*self.inner.connection.load_full()?).clone();
        let limit = |l: Option<u64>| l.map(|n| n.to_string()).unwrap_or_default();
        let mut invocation = self.inner.script.prepare_invoke();
        invocation
            .key(window_key(key, "requests", minute))
            .key(window_key(key, "tokens", minute))
            .arg(limit(requests_per_minute))
            .arg(limit(tokens_per_minute));
        let answer =
            tokio::time::timeout(TIMEOUT, invocation.invoke_async::<i64>(&mut connection)).await;
        match answer {
            Ok(Ok(code)) => {
                self.inner.mark(true);
                Some(match code {
                    0 => Ok(()),
                    1 => Err("requests_per_minute"),
                    _ => Err("tokens_per_minute"),
                })
            }
            Ok(Err(e)) => {
                self.inner.mark(false);
                tracing::debug!(error = %e, "redis: admit failed");
                None
            }
            Err(_) => {
                self.inner.mark(false);
                None
            }
        }
    }

    /// Adds `tokens` to `key`'s window of `minute`, in the background.
    pub fn add_tokens(&self, key: &str, minute: u64, tokens: u64) {
        let Some(connection) = self.inner.connection.load_full() else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let inner = self.inner.clone();
        let window = window_key(key, "tokens", minute);
        runtime.spawn(async move {
            let mut connection = (*connection).clone();
            let mut pipe = redis::pipe();
            pipe.atomic().incr(&window, tokens).ignore().expire(&window, 120).ignore();
            let done = tokio::time::timeout(TIMEOUT, pipe.query_async::<()>(&mut connection)).await;
            inner.mark(matches!(done, Ok(Ok(()))));
        });
    }
}

impl Inner {
    fn mark(&self, up: bool) {
        if self.up.swap(up, Ordering::Relaxed) != up {
            if up {
                tracing::info!("redis: reachable; rate limits are shared between replicas");
            } else {
                tracing::warn!("redis: unreachable; rate limits are counted by this gateway alone");
            }
        }
        metrics::gauge!(REDIS_UP).set(if up { 1.0 } else { 0.0 });
    }
}

/// The Redis key of one window. The name is hashed in: names come from config,
/// but a colon or space in one must not run into the next field.
fn window_key(key: &str, what: &str, minute: u64) -> String {
    let id: String =
        super::digest(key.as_bytes())[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("slotgate:limits:{id}:{what}:{minute}")
}
