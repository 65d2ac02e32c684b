//! nginx in the two roles the gateway comparison gives it: a plain reverse proxy
//! (the peer slotgate is measured against), and a static backend that answers
//! every chat completion with fixed bytes, so that what a proxy adds is not lost
//! in what the backend costs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::peer::{free_port, Peer};

/// A folder of its own for one nginx process: config, pid, logs, temp files.
fn prefix(name: &str) -> anyhow::Result<PathBuf> {
    let dir =
        std::env::temp_dir().join(format!("slotgate-bench-nginx-{name}-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("tmp"))?;
    Ok(dir)
}

/// The `http` block's settings that every nginx of the bench shares.
fn http_common(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "access_log off;\n  client_body_temp_path {d}/tmp;\n  proxy_temp_path {d}/tmp;\n  \
         fastcgi_temp_path {d}/tmp;\n  uwsgi_temp_path {d}/tmp;\n  scgi_temp_path {d}/tmp;\n  \
         keepalive_requests 1000000;\n"
    )
}

async fn start(
    nginx: &Path,
    name: &str,
    dir: &Path,
    workers: usize,
    http: &str,
    port: u16,
    logs: &Path,
) -> anyhow::Result<Peer> {
    let d = dir.display();
    let conf = format!(
        "worker_processes {workers};\npid {d}/nginx.pid;\nerror_log {d}/error.log warn;\n\
         events {{ worker_connections 4096; }}\nhttp {{\n  {}{http}}}\n",
        http_common(dir)
    );
    std::fs::write(dir.join("nginx.conf"), conf)?;
    let mut command = std::process::Command::new(nginx);
    command.arg("-p").arg(dir).arg("-c").arg(dir.join("nginx.conf")).args(["-g", "daemon off;"]);
    Peer::start(name, command, port, "/health", logs, Duration::from_secs(15)).await
}

/// nginx as a plain reverse proxy to `backend`, as nginx's documentation sets one
/// up for streaming upstreams: HTTP/1.1 with kept-alive upstream connections, no
/// buffering. Two workers, as slotgate has one per core.
pub async fn start_proxy(
    nginx: &Path,
    name: &str,
    backend: &str,
    logs: &Path,
) -> anyhow::Result<Peer> {
    let dir = prefix(name)?;
    let port = free_port()?;
    let upstream = backend.trim_start_matches("http://");
    let http = format!(
        "upstream backend {{ server {upstream}; keepalive 256; keepalive_requests 1000000; }}\n  \
         server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://backend;\n      \
         proxy_http_version 1.1;\n      proxy_set_header Connection \"\";\n      \
         proxy_buffering off;\n    }}\n  }}\n"
    );
    start(nginx, name, &dir, 2, &http, port, logs).await
}

/// nginx as a backend that answers every POST to `/v1/chat/completions` with
/// `answer` (of `content_type`), and the health, model and slot documents that
/// the gateway reads, with `slots` idle slots. One worker: the cheapest backend
/// there is on this machine.
pub async fn start_static(
    nginx: &Path,
    name: &str,
    answer: &str,
    content_type: &str,
    slots: usize,
    logs: &Path,
) -> anyhow::Result<Peer> {
    anyhow::ensure!(!answer.contains('\''), "the answer goes between single quotes");
    let dir = prefix(name)?;
    let port = free_port()?;
    let slots: Vec<serde_json::Value> = (0..slots)
        .map(|i| serde_json::json!({"id": i, "id_task": -1, "n_ctx": 4096, "is_processing": false}))
        .collect();
    std::fs::write(dir.join("slots.json"), serde_json::to_vec(&slots)?)?;
    let models = r#"{"object":"list","data":[{"id":"fake","object":"model","created":0,"owned_by":"bench"}]}"#;
    let d = dir.display();
    let http = format!(
        "server {{\n    listen 127.0.0.1:{port};\n    default_type application/json;\n    \
         location = /health {{ return 200 '{{\"status\":\"ok\"}}'; }}\n    \
         location = /v1/models {{ return 200 '{models}'; }}\n    \
         location = /slots {{ alias {d}/slots.json; }}\n    \
         location = /v1/chat/completions {{ default_type {content_type}; return 200 '{answer}'; }}\n  }}\n"
    );
    start(nginx, name, &dir, 1, &http, port, logs).await
}
