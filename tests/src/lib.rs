//! Helpers for end-to-end tests: start the real binaries on the real default model,
//! talk to them over HTTP, and stop them when the test ends.

pub mod fake;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use serde_json::Value;
use slotgate_protocol::SseDecoder;

/// The default model, fetched by `scripts/fetch-model`.
pub fn model_path() -> PathBuf {
    let path = std::env::var_os("SLOTGATE_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("models/gemma-3-270m-q4_k_m.gguf"));
    assert!(path.is_file(), "{} is missing: run scripts/fetch-model", path.display());
    path
}

/// The id the engine gives the default model.
pub const MODEL: &str = "gemma-3-270m-q4_k_m";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A binary of this workspace, built next to the running test.
pub fn binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: build it with cargo build --bin {name}",
        path.display()
    );
    path
}

/// A process started by a test, killed when dropped.
pub struct Process {
    child: Child,
    /// `http://127.0.0.1:PORT`, from the line the process printed when ready.
    pub url: String,
}

impl Process {
    /// Starts `binary` with `args` and waits (at most 120 s) for its
    /// `listening on http://ADDR` line.
    pub fn start(binary: &Path, args: &[&str]) -> Self {
        Self::start_with_env(binary, args, &[])
    }

    /// Like [`Process::start`], with environment variables.
    pub fn start_with_env(binary: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut child = Command::new(binary)
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(addr) = line.strip_prefix("listening on ") {
                    let _ = tx.send(addr.to_owned());
                }
            }
        });
        match rx.recv_timeout(Duration::from_secs(120)) {
            Ok(url) => Self { child, url },
            Err(_) => {
                let _ = child.kill();
                let status = child.wait();
                panic!("{} did not print its address: {status:?}", binary.display());
            }
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends SIGTERM and waits (at most `limit`) for the process to exit.
    pub fn terminate(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// Kills the process now, as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    /// SIGTERM first, so that a gateway stops the engines it started; SIGKILL if it
    /// has not exited within five seconds.
    fn drop(&mut self) {
        if self.terminate(Duration::from_secs(5)).is_none() {
            self.kill();
        }
    }
}

/// Starts an engine on the default model with the given flags (two threads unless
/// they say otherwise).
pub fn engine(args: &[&str]) -> Process {
    let model = model_path();
    let mut all = vec!["--model", model.to_str().expect("utf-8 path"), "--port", "0"];
    // Loading and unloading are closed without an admin key; tests load from here.
    if !args.contains(&"--admin-loopback") {
        all.extend_from_slice(&["--admin-loopback", "true"]);
    }
    if !args.contains(&"--threads") {
        all.extend_from_slice(&["--threads", "2"]);
    }
    all.extend_from_slice(args);
    Process::start(&binary("slotgate-engine"), &all)
}

/// Starts the gateway in front of `backends`, with `SLOTGATE_*` settings in `env`.
pub fn gateway(backends: &[&str], env: &[(&str, &str)]) -> Process {
    let mut args = vec!["--listen", "127.0.0.1:0"];
    for b in backends {
        args.extend_from_slice(&["--backend", b]);
    }
    let mut env = env.to_vec();
    env.push(("SLOTGATE_ROUTING__HEALTH_INTERVAL_MS", "100"));
    env.push(("SLOTGATE_ROUTING__HEALTHY_THRESHOLD", "1"));
    // The admin API is closed without an admin key; tests ask it from here.
    env.push(("SLOTGATE_AUTH__ADMIN_LOOPBACK", "true"));
    Process::start_with_env(&binary("slotgate"), &args, &env)
}

/// Starts the gateway with the settings file `config`, with `SLOTGATE_*` settings
/// and other variables in `env`, checking its backends every 100 ms.
pub fn gateway_with_config(config: &Path, env: &[(&str, &str)]) -> Process {
    let config = config.to_str().expect("utf-8 path");
    let mut env = env.to_vec();
    env.push(("SLOTGATE_ROUTING__HEALTH_INTERVAL_MS", "100"));
    env.push(("SLOTGATE_ROUTING__HEALTHY_THRESHOLD", "1"));
    env.push(("SLOTGATE_AUTH__ADMIN_LOOPBACK", "true"));
    Process::start_with_env(&binary("slotgate"), &["--config", config], &env)
}

/// Runs `script` of `tests/clients/node` with `args` under Node, with the
/// official SDKs that `scripts/test` installs there; its output, after
/// asserting that it succeeded.
pub fn node_client(script: &str, args: &[&str]) -> String {
    let dir = workspace().join("tests/clients/node");
    assert!(
        dir.join("node_modules").is_dir(),
        "{}/node_modules is missing: run scripts/test, which installs the Node SDKs",
        dir.display()
    );
    run_client(Command::new("node").arg(dir.join(script)).args(args), script)
}

/// Runs a client script's `command`: its output and errors, after asserting
/// that it succeeded.
fn run_client(command: &mut Command, script: &str) -> String {
    let output = command.output().unwrap_or_else(|e| panic!("run {script}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{script} failed:\n{text}");
    text
}

/// libfaketime, from Debian's `faketime` (see `scripts/install-deps`).
const FAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// A wall clock that starts at the start of the current minute, for the
/// processes given this environment (libfaketime; their monotonic clocks,
/// which timers run on, are left alone). Per-minute limits count in windows
/// of the wall clock: a test of them started on this clock runs inside one
/// window, without waiting for the next to begin. Processes given the same
/// clock agree on it.
pub fn clock_at_a_minutes_start() -> Vec<(&'static str, String)> {
    assert!(Path::new(FAKETIME).exists(), "{FAKETIME} is missing: run scripts/install-deps");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    vec![
        ("LD_PRELOAD", FAKETIME.to_owned()),
        ("FAKETIME", format!("-{}s", now.as_secs() % 60)),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
    ]
}

/// A file written by a test, removed when dropped.
pub struct TempFile {
    /// Where it is.
    pub path: PathBuf,
}

impl TempFile {
    /// Writes `contents` to a new file named after `name`.
    pub fn new(name: &str, contents: &str) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("slotgate-{}-{n}-{name}", std::process::id()));
        let file = Self { path };
        file.write(contents);
        file
    }

    /// Replaces the contents.
    pub fn write(&self, contents: &str) {
        std::fs::write(&self.path, contents).expect("write a temporary file");
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Waits until the gateway's `/health` passes (its backends were admitted).
pub async fn ready(client: &reqwest::Client, gateway: &Process, backends: usize) {
    ready_as(client, gateway, backends, None).await;
}

/// [`ready`], asking the admin API with `admin_key` when the gateway has one.
pub async fn ready_as(
    client: &reqwest::Client,
    gateway: &Process,
    backends: usize,
    admin_key: Option<&str>,
) {
    let url = format!("{}/admin/backends", gateway.url);
    let ask = || async {
        let mut request = client.get(&url);
        if let Some(key) = admin_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.expect("request");
        response.json::<Value>().await.unwrap_or(Value::Null)
    };
    let ok = eventually(Duration::from_secs(30), || async {
        ask().await["backends"]
            .as_array()
            .is_some_and(|bs| bs.iter().filter(|b| b["healthy"] == true).count() == backends)
    })
    .await;
    assert!(ok, "backends not admitted: {}", ask().await);
}

/// A client with a bound on every request.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(120)).build().expect("client")
}

/// Posts JSON; returns the status and the body as JSON (`Null` if it is not).
pub async fn post(client: &reqwest::Client, url: &str, body: &Value) -> (u16, Value) {
    let response = client.post(url).json(body).send().await.expect("request");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// Gets JSON.
pub async fn get(client: &reqwest::Client, url: &str) -> (u16, Value) {
    let response = client.get(url).send().await.expect("request");
    let status = response.status().as_u16();
    let text = response.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// A streamed answer, read to its end.
#[derive(Debug, Default)]
pub struct Streamed {
    /// The `data:` payloads before `[DONE]`, parsed.
    pub chunks: Vec<Value>,
    /// Whether `[DONE]` came.
    pub done: bool,
}

impl Streamed {
    /// The text of choice `index`, joined from chat deltas or completion chunks.
    pub fn text(&self, index: u64) -> String {
        self.chunks
            .iter()
            .flat_map(|c| c["choices"].as_array().cloned().unwrap_or_default())
            .filter(|c| c["index"].as_u64() == Some(index))
            .filter_map(|c| {
                c["delta"]["content"].as_str().or(c["text"].as_str()).map(str::to_owned)
            })
            .collect()
    }

    /// The finish reason of choice `index`.
    pub fn finish_reason(&self, index: u64) -> Option<String> {
        self.chunks
            .iter()
            .flat_map(|c| c["choices"].as_array().cloned().unwrap_or_default())
            .filter(|c| c["index"].as_u64() == Some(index))
            .find_map(|c| c["finish_reason"].as_str().map(str::to_owned))
    }
}

/// Posts a streamed request; returns the status and, on 200, the stream read to
/// its end (at most `limit`).
pub async fn stream(client: &reqwest::Client, url: &str, body: &Value) -> (u16, Streamed) {
    let response = client.post(url).json(body).send().await.expect("request");
    let status = response.status().as_u16();
    let mut out = Streamed::default();
    if status != 200 {
        return (status, out);
    }
    let mut decoder = SseDecoder::new();
    let mut bytes = response.bytes_stream();
    let deadline = Instant::now() + Duration::from_secs(120);
    while let Some(chunk) = bytes.next().await {
        assert!(Instant::now() < deadline, "stream did not end in time");
        for event in decoder.push(&chunk.expect("stream chunk")) {
            if event.is_done() {
                out.done = true;
            } else {
                out.chunks.push(serde_json::from_str(&event.data).expect("chunk is JSON"));
            }
        }
    }
    (status, out)
}

/// Waits (at most 30 s) until the first slot of the engine at `engine_url` is
/// running a request; fails the test otherwise.
pub async fn wait_slot_busy(client: &reqwest::Client, engine_url: &str) {
    let url = format!("{engine_url}/slots");
    let busy = eventually(Duration::from_secs(30), || async {
        get(client, &url).await.1[0]["is_processing"] == Value::Bool(true)
    })
    .await;
    assert!(busy, "the first slot of {engine_url} never became busy");
}

/// The sum of a Prometheus series over its labels, read from the text format
/// (`name 1.5` or `name{model="m"} 1.5` lines).
pub fn metric_sum(text: &str, name: &str) -> f64 {
    metric_sum_where(text, name, "")
}

/// Like [`metric_sum`], over the lines whose labels contain `label` (such as
/// `reason="spilled"`).
pub fn metric_sum_where(text: &str, name: &str, label: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The Prometheus text of `{url}/metrics`.
pub async fn metrics(client: &reqwest::Client, url: &str) -> String {
    client
        .get(format!("{url}/metrics"))
        .send()
        .await
        .expect("metrics request")
        .text()
        .await
        .expect("metrics body")
}

/// Polls `check` every 20 ms until it is true or `limit` passes.
pub async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}

/// Runs `tests/clients/SCRIPT` with the Python that has OpenAI's SDK (set up by
/// `scripts/test`), with `args`; returns its combined output, failing on a non-zero exit.
pub fn python_client(script: &str, args: &[&str]) -> String {
    let python = std::env::var_os("SLOTGATE_TEST_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join(".venv/bin/python"));
    assert!(
        python.is_file(),
        "{} is missing: run scripts/test, which installs the openai package",
        python.display()
    );
    let path = workspace().join("tests/clients").join(script);
    run_client(Command::new(&python).arg(path).args(args), script)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_sums_add_up_labels_and_skip_longer_names() {
        let text = "# TYPE w histogram\nw_sum{model=\"a\"} 1.5\nw_sum{model=\"b\"} 2\nw_sum_x 9\nw_count 4\n";
        assert_eq!(metric_sum(text, "w_sum"), 3.5);
        assert_eq!(metric_sum_where(text, "w_sum", "model=\"b\""), 2.0);
        assert_eq!(metric_sum(text, "w_count"), 4.0);
        assert_eq!(metric_sum(text, "absent"), 0.0);
    }
}
