//! Local `slotgate-engine` processes: started from `[[engines]]`, one backend each,
//! restarted with backoff when they exit, and stopped with the gateway. Each gets
//! a key of its own, made at start and known only to this gateway, that opens
//! its admin API and its inference endpoints alike.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;

use crate::config::EngineSpec;
use crate::fleet::backend::Backend;

/// The engine binary: the one configured, else the one next to this executable.
fn engine_binary(spec: &EngineSpec) -> PathBuf {
    if let Some(path) = &spec.binary {
        return path.clone();
    }
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("slotgate-engine")))
        .unwrap_or_else(|| PathBuf::from("slotgate-engine"))
}

/// The variable through which an engine gets its admin key. Not under
/// `SLOTGATE_ENGINE_`: the engine reads those as its settings.
const ADMIN_KEY_ENV: &str = "SLOTGATE_SUPERVISOR_ADMIN_KEY";

/// A new random admin key for an engine.
pub fn new_admin_key() -> String {
    rand::random::<[u8; 24]>().iter().map(|b| format!("{b:02x}")).collect()
}

async fn spawn(spec: &EngineSpec, admin_key: &str) -> std::io::Result<(Child, String)> {
    let mut cmd = Command::new(engine_binary(spec));
    // Through the environment, not a flag: flags are visible to every user in `ps`.
    cmd.env(ADMIN_KEY_ENV, admin_key).args(["--admin-key-env", ADMIN_KEY_ENV]);
    // The same key is its API key (llama-server's --api-key), unless its args
    // name keys of their own (the admin key opens it then too): the gateway
    // sends it with every request, and nothing else on the host reaches the
    // engine past the gateway's keys, limits and queue.
    if !spec.args.iter().any(|a| a.starts_with("--api-key")) {
        cmd.args(["--api-key-env", ADMIN_KEY_ENV]);
    }
    cmd.arg("--model")
        .arg(&spec.model)
        .args(["--host", "127.0.0.1", "--port", "0"])
        .args([
            "--n-parallel",
            &spec.n_parallel.to_string(),
            "--ctx-len",
            &spec.ctx_len.to_string(),
        ])
        .args(&spec.args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
    if let Some(id) = &spec.model_id {
        cmd.args(["--model-id", id]);
    }
    if let Some(gpu) = spec.gpu {
        cmd.env("CUDA_VISIBLE_DEVICES", gpu.to_string());
    }
    let mut child = cmd.spawn()?;
    let stdout = child.stdout.take().ok_or_else(|| std::io::Error::other("no stdout"))?;
    let mut lines = BufReader::new(stdout).lines();
    let url = loop {
        match lines.next_line().await? {
            Some(line) => {
                if let Some(url) = line.strip_prefix("listening on ") {
                    break url.trim().to_owned();
                }
            }
            None => return Err(std::io::Error::other("engine exited before it was ready")),
        }
    };
    // Keep draining stdout so the engine never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    Ok((child, url))
}

/// Runs one engine until `stop` is cancelled, restarting it when it exits.
pub async fn supervise(
    spec: EngineSpec,
    admin_key: String,
    backend: Arc<Backend>,
    stop: CancellationToken,
) {
    let mut backoff = Duration::from_millis(500);
    loop {
        let started = tokio::select! {
            () = stop.cancelled() => return,
            r = spawn(&spec, &admin_key) => r,
        };
        match started {
            Ok((mut child, url)) => {
                tracing::info!(engine = %spec.model.display(), %url, "engine started");
                backend.set_address(url);
                let ran = tokio::time::Instant::now();
                tokio::select! {
                    () = stop.cancelled() => {
                        let _ = child.start_kill();
                        let _ = child.wait().await;
                        return;
                    }
                    status = child.wait() => {
                        backend.eject();
                        tracing::warn!(engine = %spec.model.display(), ?status, "engine exited; restarting");
                        if ran.elapsed() > Duration::from_secs(60) {
                            backoff = Duration::from_millis(500);
                        }
                    }
                }
            }
            Err(err) => {
                tracing::error!(engine = %spec.model.display(), error = %err, "engine failed to start")
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}
