//! Peer systems started by a comparison (nginx, LiteLLM, llama-server,
//! llama-cpp-python): a process in its own process group, its output in a log
//! file, ready once a URL answers 200, and stopped with everything it started
//! when dropped.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running peer.
pub struct Peer {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// Where its output goes.
    pub log: PathBuf,
}

/// A port that was free a moment ago, for peers that cannot be handed a listener.
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// Starts llama.cpp's `llama-server` (`binary`) on the default model with `slots`
/// slots of `ctx_len` tokens each (its `-c` is the whole KV cache, split evenly
/// over `-np` slots) and `threads` for generation and prompts, named as the tests'
/// model, logging to `LOG_DIR/llama-server.log`; waits up to 2 minutes for it.
pub async fn start_llama_server(
    binary: &Path,
    threads: u32,
    slots: usize,
    ctx_len: u32,
    log_dir: &Path,
) -> anyhow::Result<Peer> {
    let port = free_port()?;
    let model = slotgate_tests::model_path();
    let mut command = Command::new(binary);
    let threads = threads.to_string();
    command.args([
        "-m",
        model.to_str().unwrap_or_default(),
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
        "-t",
        &threads,
        "-tb",
        &threads,
        "-np",
        &slots.to_string(),
        "-c",
        &(ctx_len as usize * slots).to_string(),
        "-a",
        slotgate_tests::MODEL,
    ]);
    Peer::start("llama-server", command, port, "/health", log_dir, Duration::from_secs(120)).await
}

impl Peer {
    /// Starts `command`, which must listen on `127.0.0.1:port`, logging to
    /// `LOG_DIR/NAME.log`, and waits up to `limit` for `GET ready_path` to answer 200.
    pub async fn start(
        name: &str,
        mut command: Command,
        port: u16,
        ready_path: &str,
        log_dir: &Path,
        limit: Duration,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(log_dir)?;
        let log = log_dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log)?;
        let child = command
            .stdin(Stdio::null())
            .stdout(file.try_clone()?)
            .stderr(file)
            .process_group(0)
            .spawn()
            .map_err(|e| anyhow::anyhow!("starting {name} ({:?}): {e}", command.get_program()))?;
        let mut peer = Self { child, url: format!("http://127.0.0.1:{port}"), log };
        let probe = reqwest::Client::builder().timeout(Duration::from_secs(2)).build()?;
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(r) = probe.get(format!("{}{ready_path}", peer.url)).send().await {
                if r.status().is_success() {
                    return Ok(peer);
                }
            }
            if let Some(status) = peer.child.try_wait()? {
                anyhow::bail!("{name} exited ({status}); see {}", peer.log.display());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "{name} not ready after {limit:?}; see {}",
                peer.log.display()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

impl Drop for Peer {
    /// SIGTERM to the whole group, SIGKILL if it is still there after ten seconds.
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
    }
}
