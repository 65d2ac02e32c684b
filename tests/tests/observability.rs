//! What operators read: both servers' `/metrics` as Prometheus' own linter
//! (`promtool check metrics`, Debian's `prometheus` package) judges it, the
//! vLLM-named load that Kubernetes' inference schedulers read, and log lines
//! (JSON for shippers, one access line per request, no colour codes in files).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use slotgate_tests::*;

/// What `promtool check metrics` says of `text`: its complaints, one per line.
fn promtool(text: &str) -> Vec<String> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool is installed by scripts/install-deps (Debian: prometheus)");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said =
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let complaints: Vec<String> = said.lines().map(str::to_owned).collect();
    assert_eq!(out.status.success(), complaints.is_empty(), "promtool: {said}");
    complaints
}

fn chat(stream: bool) -> Value {
    json!({"model": MODEL, "messages": [{"role": "user", "content": "Hello"}],
           "max_tokens": 4, "stream": stream, "temperature": 0})
}

#[tokio::test]
async fn promtool_finds_nothing_to_say_of_either_servers_metrics() {
    let engine = engine(&[
        "--n-parallel",
        "2",
        "--ctx-len",
        "512",
        "--vllm-metrics",
        "false",
        "--llama-server-metrics",
        "false",
    ]);
    // With a key, so that the per-key series exist too.
    let config = TempFile::new(
        "observability.toml",
        &format!(
            "listen = \"127.0.0.1:0\"\n[[backends]]\nurl = \"{}\"\n\
             [auth]\nadmin_key_env = \"SLOTGATE_TEST_OBS_ADMIN\"\n\
             [[keys]]\nname = \"team-a\"\nkey = \"sk-team-a\"\n",
            engine.url
        ),
    );
    let gw = gateway_with_config(&config.path, &[("SLOTGATE_TEST_OBS_ADMIN", "sk-admin")]);
    let client = client();
    ready_as(&client, &gw, 1, Some("sk-admin")).await;
    // Every kind of series: answers, streams, refusals.
    let url = format!("{}/v1/chat/completions", gw.url);
    let unknown = json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]});
    for (body, status) in [(chat(false), 200), (chat(true), 200), (unknown, 404)] {
        let r = client.post(&url).bearer_auth("sk-team-a").json(&body).send().await.unwrap();
        assert_eq!(r.status(), status);
        r.bytes().await.unwrap();
    }
    let mut texts = Vec::new();
    for server in [&engine.url, &gw.url] {
        let text = metrics(&client, server).await;
        assert!(text.contains("# HELP "), "{text}");
        assert_eq!(promtool(&text), Vec::<String>::new(), "{server}/metrics:\n{text}");
        texts.push(text);
    }
    let (engine_text, gateway_text) = (&texts[0], &texts[1]);
    assert_eq!(metric_sum(gateway_text, "slotgate_backend_slots"), 2.0, "{gateway_text}");
    assert_eq!(metric_sum(engine_text, "slotgate_engine_slots"), 2.0, "{engine_text}");
    assert!(!engine_text.contains("vllm:"), "--vllm-metrics false leaves them out");
    assert!(!engine_text.contains("llamacpp:"), "and --llama-server-metrics false these");

    // The Grafana dashboard asks only for series that these servers export.
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/slotgate.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let exprs: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .filter_map(|t| t["expr"].as_str())
        .collect();
    assert!(exprs.len() >= 9, "{exprs:?}");
    for expr in exprs {
        for name in metric_names(expr) {
            let text =
                if name.starts_with("slotgate_engine_") { engine_text } else { gateway_text };
            let exported = text
                .lines()
                .any(|l| l.starts_with(name.as_str()) && l[name.len()..].starts_with(['{', ' ']));
            assert!(exported, "the dashboard's `{expr}` names `{name}`, not exported");
        }
    }
}

/// The metric names in a PromQL expression (those of slotgate).
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("slotgate_") {
        let tail = &rest[at..];
        let end =
            tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

#[tokio::test]
async fn the_engine_shows_its_load_under_vllms_names() {
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "512"]);
    let client = client();
    let url = format!("{}/v1/completions", engine.url);
    // End-of-text and end-of-turn banned: it runs its 400 tokens.
    let body = json!({"prompt": "1, 2, 3,", "max_tokens": 400, "stream": true, "temperature": 0,
                      "logit_bias": {"1": -100, "106": -100}});
    let running = {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move { stream(&client, &url, &body).await })
    };
    wait_slot_busy(&client, &engine.url).await;
    let text = metrics(&client, &engine.url).await;
    let label = format!("model_name=\"{MODEL}\"");
    assert_eq!(metric_sum_where(&text, "vllm:num_requests_running", &label), 1.0, "{text}");
    assert_eq!(metric_sum_where(&text, "vllm:num_requests_waiting", &label), 0.0, "{text}");
    let usage = metric_sum_where(&text, "vllm:kv_cache_usage_perc", &label);
    assert!(usage > 0.0 && usage < 1.0, "one slot of two holds tokens: {usage}\n{text}");
    assert!(text.contains("num_gpu_blocks=\"1024\""), "two slots of 512 cells: {text}");
    // And as llama-server names it.
    assert_eq!(metric_sum(&text, "llamacpp:requests_processing"), 1.0, "{text}");
    assert_eq!(metric_sum(&text, "llamacpp:requests_deferred"), 0.0, "{text}");
    // Prometheus' linter objects to the `:` alone, which vLLM's and
    // llama-server's names have, and to llama-server's counter without
    // `_total`: their names, kept for the dashboards that read them.
    for complaint in promtool(&text) {
        let colon = (complaint.starts_with("vllm:") || complaint.starts_with("llamacpp:"))
            && complaint.ends_with("should not contain ':'");
        let theirs = "llamacpp:n_tokens_max counter metrics should have \"_total\" suffix";
        assert!(colon || complaint == theirs, "{complaint}");
    }
    running.abort();
}

#[test]
fn the_alert_rules_pass_their_checks_and_unit_tests() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus");
    for args in [["check", "rules", "alerts.yml"], ["test", "rules", "alerts-test.yml"]] {
        let out = Command::new("promtool").args(args).current_dir(&dir).output().expect("promtool");
        assert!(
            out.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[tokio::test]
async fn logs_are_json_lines_with_one_access_line_per_request() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "512"]);
    let mut gw = Command::new(binary("slotgate"))
        .args(["--listen", "127.0.0.1:0", "--backend", &engine.url, "--log-format", "json"])
        .env("RUST_LOG", "info")
        .env("SLOTGATE_ROUTING__HEALTH_INTERVAL_MS", "100")
        .env("SLOTGATE_ROUTING__HEALTHY_THRESHOLD", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the gateway");
    let mut stdout = BufReader::new(gw.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let url = line.trim().strip_prefix("listening on ").expect("address line").to_owned();
    let client = client();
    let healthy = eventually(Duration::from_secs(30), || async {
        client.get(format!("{url}/health")).send().await.is_ok_and(|r| r.status() == 200)
    })
    .await;
    assert!(healthy);
    let response =
        client.post(format!("{url}/v1/chat/completions")).json(&chat(false)).send().await.unwrap();
    let id = response.headers()["x-request-id"].to_str().unwrap().to_owned();
    let answer: Value = response.json().await.unwrap();
    let _ = Command::new("kill").args(["-TERM", &gw.id().to_string()]).status();
    let out = gw.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(!log.contains('\u{1b}'), "no colour codes in a pipe: {log}");
    let lines: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let access: Vec<&Value> = lines.iter().filter(|l| l["target"] == "slotgate::access").collect();
    assert_eq!(access.len(), 1, "{log}");
    let a = access[0];
    assert_eq!(a["request_id"], id.as_str(), "{a}");
    assert_eq!(a["model"], MODEL);
    assert_eq!(a["backend"], engine.url.as_str());
    assert_eq!(a["status"], 200);
    assert_eq!(a["attempts"], 1);
    assert_eq!(a["prompt_tokens"], answer["usage"]["prompt_tokens"]);
    assert_eq!(a["completion_tokens"], answer["usage"]["completion_tokens"]);
    assert!(
        a["cached_tokens"].is_u64() && a["ttft_ms"].is_f64() && a["duration_ms"].is_f64(),
        "{a}"
    );
    assert_eq!(a["key"], "-", "no keys configured");
}

/// Chromium, as Debian's package installs it.
fn chromium() -> &'static str {
    let path = "/usr/bin/chromium";
    assert!(
        std::path::Path::new(path).is_file(),
        "{path} is missing: scripts/install-deps installs Debian's chromium package"
    );
    path
}

#[tokio::test]
async fn the_dashboard_shows_the_slots_live_in_a_real_browser() {
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "512"]);
    let gw = gateway(&[&engine.url], &[]);
    let client = client();
    ready(&client, &gw, 1).await;
    // A few answers for the rates and percentiles, then one slot generating
    // and one idle while the browser looks.
    for _ in 0..3 {
        let url = format!("{}/v1/chat/completions", gw.url);
        assert_eq!(post(&client, &url, &chat(false)).await.0, 200);
    }
    let body = json!({"prompt": "1, 2, 3,", "max_tokens": 400, "stream": true, "temperature": 0,
                      "logit_bias": {"1": -100, "106": -100}});
    let running = {
        let (client, url) = (client.clone(), format!("{}/v1/completions", gw.url));
        tokio::spawn(async move { stream(&client, &url, &body).await })
    };
    let slots_url = format!("{}/slots", engine.url);
    let busy = eventually(Duration::from_secs(30), || async {
        let (_, slots) = get(&client, &slots_url).await;
        slots.as_array().is_some_and(|s| s.iter().any(|s| s["is_processing"] == true))
    })
    .await;
    assert!(busy, "the stream never took a slot");
    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");
    let url = format!("{}/ui", gw.url);
    let out = tokio::task::spawn_blocking(move || {
        python_client("ui_browser.py", &[chromium(), &url, shot.to_str().unwrap()])
    })
    .await
    .unwrap();
    let (_, slots) = get(&client, &format!("{}/slots", engine.url)).await;
    running.abort();
    let shown: Value = out
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .unwrap_or_else(|| panic!("no report from the browser: {out}"));
    let updates = shown["updates"].as_array().unwrap();
    assert!(updates[1].as_u64() > updates[0].as_u64(), "updated live, without a reload: {shown}");
    assert_eq!(shown["backends"], json!([{"url": engine.url, "state": "healthy"}]), "{shown}");
    let page: Vec<(u64, bool)> = shown["slots"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["slot"].as_u64().unwrap(), s["phase"] != "idle"))
        .collect();
    let engine_says: Vec<(u64, bool)> = slots
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["id"].as_u64().unwrap(), s["is_processing"] == true))
        .collect();
    assert_eq!(page, engine_says, "the page against /slots: {shown}");
    assert_eq!(page.iter().filter(|(_, busy)| *busy).count(), 1, "one slot of two busy: {shown}");
    assert!(std::fs::metadata(env!("CARGO_TARGET_TMPDIR").to_owned() + "/dashboard.png")
        .is_ok_and(|m| m.len() > 10_000));
}

#[tokio::test]
async fn with_keys_the_dashboard_needs_the_admin_key() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "256"]);
    let config = TempFile::new(
        "ui-keys.toml",
        &format!(
            "listen = \"127.0.0.1:0\"\n[[backends]]\nurl = \"{}\"\n\
             [auth]\nadmin_key_env = \"SLOTGATE_TEST_UI_ADMIN\"\n\
             [[keys]]\nname = \"team-a\"\nkey = \"sk-team-a\"\n",
            engine.url
        ),
    );
    let gw = gateway_with_config(&config.path, &[("SLOTGATE_TEST_UI_ADMIN", "sk-admin")]);
    let client = client();
    ready_as(&client, &gw, 1, Some("sk-admin")).await;
    for path in ["/ui", "/ui/state", "/ui/events"] {
        let url = format!("{}{path}", gw.url);
        let none = client.get(&url).send().await.unwrap();
        assert_eq!(none.status(), 401, "{path}");
        assert!(none.headers()["www-authenticate"].to_str().unwrap().starts_with("Basic "));
        let team = client.get(&url).basic_auth("x", Some("sk-team-a")).send().await.unwrap();
        assert_eq!(team.status(), 401, "a client key does not open {path}");
    }
    let page = client.get(format!("{}/ui", gw.url)).basic_auth("admin", Some("sk-admin"));
    let page = page.send().await.unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().await.unwrap().contains("<title>slotgate</title>"));
    let state = client.get(format!("{}/ui/state", gw.url)).bearer_auth("sk-admin");
    let state: Value = state.send().await.unwrap().json().await.unwrap();
    assert_eq!(state["backends"][0]["url"], engine.url.as_str(), "{state}");
    assert_eq!(state["backends"][0]["slots"][0]["phase"], "idle", "{state}");
}

/// A Prometheus server (Debian's package) scraping `targets` every second,
/// stopped when dropped.
struct Prometheus {
    child: std::process::Child,
    url: String,
    _config: TempFile,
    data: std::path::PathBuf,
}

impl Prometheus {
    fn start(jobs: &[(&str, &str)]) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut config =
            String::from("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n");
        for (job, url) in jobs {
            let target = url.trim_start_matches("http://");
            config += &format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n"
            );
        }
        let config = TempFile::new("prometheus.yml", &config);
        let data =
            std::env::temp_dir().join(format!("slotgate-prom-{}-{port}", std::process::id()));
        let sbin = std::path::Path::new("/usr/bin/prometheus");
        let child =
            Command::new(if sbin.is_file() { sbin } else { std::path::Path::new("prometheus") })
                .arg(format!("--config.file={}", config.path.display()))
                .arg(format!("--storage.tsdb.path={}", data.display()))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("prometheus is installed by scripts/install-deps (Debian: prometheus)");
        Self { child, url: format!("http://127.0.0.1:{port}"), _config: config, data }
    }

    /// The instant vector of `query`.
    async fn query(&self, client: &reqwest::Client, query: &str) -> Vec<Value> {
        let url = format!("{}/api/v1/query", self.url);
        let Ok(r) = client.get(url).query(&[("query", query)]).send().await else { return vec![] };
        let body: Value = r.json().await.unwrap_or(Value::Null);
        body["data"]["result"].as_array().cloned().unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

#[tokio::test]
async fn a_real_prometheus_scrapes_both_servers_with_their_labels() {
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "256"]);
    let gw = gateway(&[&engine.url], &[]);
    let client = client();
    ready(&client, &gw, 1).await;
    let url = format!("{}/v1/chat/completions", gw.url);
    assert_eq!(post(&client, &url, &chat(false)).await.0, 200);
    let prometheus =
        Prometheus::start(&[("slotgate-gateway", &gw.url), ("slotgate-engine", &engine.url)]);
    let instance = |url: &str| url.trim_start_matches("http://").to_owned();
    let wanted = [
        (
            "slotgate_backend_slots",
            json!({"__name__": "slotgate_backend_slots", "job": "slotgate-gateway",
            "instance": instance(&gw.url), "backend": engine.url, "model": MODEL}),
            2.0,
        ),
        (
            "slotgate_requests_total",
            json!({"__name__": "slotgate_requests_total", "job": "slotgate-gateway",
            "instance": instance(&gw.url), "backend": engine.url, "model": MODEL, "status": "200",
            "api": "chat"}),
            1.0,
        ),
        (
            "slotgate_engine_slots",
            json!({"__name__": "slotgate_engine_slots", "job": "slotgate-engine",
            "instance": instance(&engine.url), "model": MODEL}),
            2.0,
        ),
        (
            "vllm:num_requests_waiting",
            json!({"__name__": "vllm:num_requests_waiting", "job": "slotgate-engine",
            "instance": instance(&engine.url), "model_name": MODEL}),
            0.0,
        ),
    ];
    for (query, labels, value) in wanted {
        let arrived = eventually(Duration::from_secs(30), || async {
            prometheus.query(&client, query).await.iter().any(|s| {
                s["metric"] == labels
                    && s["value"][1].as_str().and_then(|v| v.parse().ok()) == Some(value)
            })
        })
        .await;
        assert!(
            arrived,
            "{query}: {labels} = {value} not in {:?}",
            prometheus.query(&client, query).await
        );
    }
}

/// llama-server's own series (`llamacpp:`), as its dashboards read them:
/// prompt tokens read and those found in the cache, tokens generated, decode
/// calls, each equal to what the answers' `timings` said; and its
/// `Process-Start-Time-Unix` header.
#[tokio::test]
async fn the_engine_counts_as_llama_server_does() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "512"]);
    let client = client();
    let url = format!("{}/completion", engine.url);
    let (mut read, mut cached, mut predicted) = (0, 0, 0);
    for n_predict in [1, 4, 16] {
        let body = json!({"prompt": "the quick brown fox jumps over the lazy dog",
            "n_predict": n_predict});
        let answer: Value =
            client.post(&url).json(&body).send().await.unwrap().json().await.unwrap();
        let timings = &answer["timings"];
        read += timings["prompt_n"].as_u64().unwrap();
        cached += timings["cache_n"].as_u64().unwrap();
        predicted += timings["predicted_n"].as_u64().unwrap();
        if n_predict == 1 {
            // One token is no decode step: no rate.
            assert_eq!(timings["predicted_per_second"], 0.0, "{answer}");
        }
    }
    assert!(cached > 0, "the later prompts were found in the slot's cache");
    let response = client.get(format!("{}/metrics", engine.url)).send().await.unwrap();
    let started = response.headers()["process-start-time-unix"].to_str().unwrap().to_owned();
    assert!(started.parse::<u64>().unwrap() > 1_700_000_000, "{started}");
    let text = response.text().await.unwrap();
    assert_eq!(metric_sum(&text, "llamacpp:prompt_tokens_total"), read as f64, "{text}");
    assert_eq!(metric_sum(&text, "llamacpp:prompt_tokens_cached_total"), cached as f64, "{text}");
    assert_eq!(metric_sum(&text, "llamacpp:tokens_predicted_total"), predicted as f64, "{text}");
    // At least one decode per prompt, and one per token after its first.
    assert!(metric_sum(&text, "llamacpp:n_decode_total") >= (1 + 4 + 16) as f64, "{text}");
    assert_eq!(metric_sum(&text, "llamacpp:requests_processing"), 0.0, "{text}");
    assert!(text.contains("# TYPE llamacpp:prompt_seconds_total counter\n"), "{text}");
}
