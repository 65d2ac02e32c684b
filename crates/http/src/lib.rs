//! HTTP pieces the engine and the gateway share: the one place an [`ApiError`]
//! becomes a response, the shutdown signal, the Prometheus recorder, API keys, and
//! the first layers of settings.

pub mod admin;
pub mod conn;
pub mod cors;
pub mod keys;
pub mod settings;
pub mod timed;

use std::sync::OnceLock;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt as _;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use slotgate_protocol::{ApiError, ErrorEnvelope, ErrorType};

/// Marks `response` as a stream of server-sent events: its type, no caching,
/// and no buffering by a proxy in front (nginx's `x-accel-buffering`), so each
/// event reaches the client when it is sent.
pub fn event_stream(response: &mut Response) {
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
}

/// Puts every error answer of the Messages routes in Anthropic's envelope,
/// with its status (529 for OpenAI's 503), so that the `anthropic` SDK raises
/// the exception its callers catch; whatever produced it (the body extractor,
/// the model lookup, the scheduler, a gateway's key check) answered in OpenAI's.
pub async fn anthropic_errors(response: Response) -> Response {
    if response.status().is_success() {
        return response;
    }
    let (parts, body) = response.into_parts();
    let bytes = http_body_util::Limited::new(body, 1 << 20).collect().await;
    let err = bytes
        .ok()
        .and_then(|b| serde_json::from_slice::<ErrorEnvelope>(&b.to_bytes()).ok())
        .map_or_else(ApiError::internal, |e| e.error);
    let (status, envelope) = slotgate_protocol::anthropic::error(&err);
    // The answer's own headers stay (its request id, `Retry-After`).
    let body = axum::Json(envelope).into_response().into_body();
    let mut out = Response::from_parts(parts, body);
    // A method, a slow body or a large one keeps its own status.
    if !matches!(out.status().as_u16(), 405 | 408 | 413) {
        *out.status_mut() = StatusCode::from_u16(status).unwrap_or(out.status());
    }
    out.headers_mut().remove(header::CONTENT_LENGTH);
    out.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    out
}

/// Seconds a client is told to wait before retrying a 503.
pub const RETRY_AFTER_SECS: u32 = 1;

/// The response for an [`ApiError`]: the status of its type, the OpenAI envelope
/// as the body, and `Retry-After` on a 503 or where the error gives one.
pub fn api_response(err: ApiError) -> Response {
    let status = StatusCode::from_u16(err.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let retry = match err.retry_after {
        Some(seconds) => Some(seconds),
        None => (err.kind == ErrorType::UnavailableError).then_some(RETRY_AFTER_SECS),
    };
    let mut response = (status, axum::Json(err.into_envelope())).into_response();
    if let Some(seconds) = retry {
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(seconds));
    }
    response
}

/// An axum rejection (a body over the size limit, a wrong method...) in the OpenAI
/// envelope, with the rejection's own status: 413 stays 413, not a 400.
pub fn rejection_response(status: StatusCode, message: String) -> Response {
    let code = match status {
        StatusCode::PAYLOAD_TOO_LARGE => Some("request_too_large"),
        StatusCode::METHOD_NOT_ALLOWED => Some("method_not_allowed"),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => Some("unsupported_media_type"),
        _ => None,
    };
    let kind = if status.is_server_error() {
        ErrorType::ServerError
    } else {
        ErrorType::InvalidRequestError
    };
    let mut err = ApiError::new(kind, message);
    err.code = code.map(str::to_owned);
    (status, axum::Json(err.into_envelope())).into_response()
}

/// How log lines are written.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Serialize,
    serde::Deserialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// For people: one line per event, coloured only on a terminal.
    #[default]
    Text,
    /// One JSON object per line, for log shippers (Loki, Elasticsearch, Vector).
    Json,
}

/// Keeps the log writer's thread; dropping it (at the end of `main`) writes out
/// the lines still buffered.
#[must_use = "logs still buffered are lost when this is dropped"]
pub struct LogGuard {
    _writer: Option<tracing_appender::non_blocking::WorkerGuard>,
}

/// Logs to stderr in `format`, filtered by `RUST_LOG` (default `info`). Stdout is
/// kept for the one `listening on http://ADDR` line that scripts read. Colour
/// codes only where stderr is a terminal: in a file or a pipe they are noise.
///
/// Lines are written by a thread of their own: the access log writes one per
/// request, and a slow reader of stderr (a container runtime's log driver, a
/// full pipe) must not stall the worker thread that serves other connections.
/// The writer is not lossy: when its buffer (128 000 lines) is full, the next
/// line waits, as a blocking write would, rather than vanish.
pub fn init_tracing(format: LogFormat) -> LogGuard {
    use std::io::IsTerminal;
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .thread_name("slotgate-log")
        .finish(std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer);
    // A second init (tests that start servers in process) keeps the first.
    let installed = match format {
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).try_init(),
        LogFormat::Json => {
            builder.json().flatten_event(true).with_current_span(false).with_ansi(false).try_init()
        }
    };
    LogGuard { _writer: installed.ok().map(|()| guard) }
}

/// What kind of metric a name is, for its `# TYPE` and `# HELP` lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only goes up (`_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Observations in buckets.
    Histogram,
}

/// The process's Prometheus recorder ([`prometheus`]), with every metric of
/// `described` described: what each server's `handle()` gives its `/metrics`.
pub fn recorder(described: &[(&'static str, MetricKind, &'static str)]) -> PrometheusHandle {
    let handle = prometheus();
    describe(described);
    handle
}

/// Gives each metric in `described` its help text, shown by `/metrics` as
/// `# HELP` (Prometheus' linter wants one on every metric).
pub fn describe(described: &[(&'static str, MetricKind, &'static str)]) {
    for &(name, kind, help) in described {
        match kind {
            MetricKind::Counter => metrics::describe_counter!(name, help),
            MetricKind::Gauge => metrics::describe_gauge!(name, help),
            MetricKind::Histogram => metrics::describe_histogram!(name, help),
        }
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            s.recv().await;
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutdown signal received");
}

/// How often histogram samples are folded into their buckets.
const UPKEEP_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Folds recorded histogram samples into their buckets every few seconds. The
/// recorder keeps each sample until then (or until `/metrics` is rendered), and
/// `install_recorder` starts no task of its own for it: a server nobody scraped
/// grew by 16 bytes a request (5 MB in 5 s under load).
fn spawn_upkeep(handle: PrometheusHandle) {
    let spawned = std::thread::Builder::new().name("metrics-upkeep".into()).spawn(move || loop {
        std::thread::sleep(UPKEEP_INTERVAL);
        handle.run_upkeep();
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "no metrics upkeep thread: histograms grow until scraped");
    }
}

/// Installs the process's Prometheus recorder once, with latency buckets from
/// 0.5 ms to 60 s, and returns its handle.
pub fn prometheus() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let buckets = [
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0, 60.0,
            ];
            let builder = PrometheusBuilder::new()
                .set_buckets(&buckets)
                .unwrap_or_else(|_| PrometheusBuilder::new());
            match builder.install_recorder() {
                Ok(handle) => {
                    spawn_upkeep(handle.clone());
                    handle
                }
                // Another recorder is installed already: render a private one.
                Err(_) => PrometheusBuilder::new().build_recorder().handle(),
            }
        })
        .clone()
}
