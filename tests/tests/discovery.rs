//! DNS discovery against a real name server: `dnsmasq` (Debian's package,
//! installed by scripts/install-deps) answers for two real engines on 127.0.0.2
//! and 127.0.0.3, and the test adds and removes them by rewriting its records
//! while clients keep sending.

use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use slotgate_tests::*;

const NAME: &str = "engines.slotgate.test";

/// A `dnsmasq` serving the records of a hosts file, stopped when dropped.
struct Dnsmasq {
    child: Child,
    port: u16,
    hosts: TempFile,
}

impl Dnsmasq {
    /// Starts it on 127.0.0.1 with `hosts` as its only records, and an SRV
    /// record `_engine._tcp.slotgate.test` for `srv_target` at `srv_port`.
    fn start(hosts: &str, srv_target: &str, srv_port: u16) -> Self {
        let hosts = TempFile::new("hosts", hosts);
        let port = std::net::UdpSocket::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        // Debian puts it in /usr/sbin, which a non-root PATH may leave out.
        let sbin = std::path::Path::new("/usr/sbin/dnsmasq");
        let child =
            Command::new(if sbin.is_file() { sbin } else { std::path::Path::new("dnsmasq") })
                .args(["--keep-in-foreground", "--no-resolv", "--no-hosts", "--bind-interfaces"])
                .args(["--listen-address=127.0.0.1", "--pid-file=", "--log-facility=-"])
                // Names under slotgate.test that are not listed do not exist (not
                // "refused"): there is no upstream to ask.
                .arg("--local=/slotgate.test/")
                .arg(format!("--port={port}"))
                .arg(format!("--addn-hosts={}", hosts.path.display()))
                .arg(format!("--srv-host=_engine._tcp.slotgate.test,{srv_target},{srv_port}"))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("dnsmasq is installed by scripts/install-deps (Debian: dnsmasq-base)");
        let dns = Self { child, port, hosts };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !dns.answers() {
            assert!(Instant::now() < deadline, "dnsmasq did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        dns
    }

    /// Whether it is up: dnsmasq binds its TCP port too.
    fn answers(&self) -> bool {
        std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
    }

    /// Replaces its records (dnsmasq reads its hosts files again on SIGHUP).
    fn set(&self, hosts: &str) {
        self.hosts.write(hosts);
        let status = Command::new("kill").args(["-HUP", &self.child.id().to_string()]).status();
        assert!(status.is_ok_and(|s| s.success()), "SIGHUP to dnsmasq");
    }
}

impl Drop for Dnsmasq {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port free on both 127.0.0.2 and 127.0.0.3: A records carry no port, so
/// the engines behind one name share one.
fn shared_port() -> u16 {
    for _ in 0..20 {
        let a = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
        let port = a.local_addr().unwrap().port();
        if std::net::TcpListener::bind(("127.0.0.3", port)).is_ok() {
            return port;
        }
    }
    panic!("no port free on both 127.0.0.2 and 127.0.0.3");
}

fn engine_on(host: &str, port: u16) -> Process {
    let model = model_path();
    let port = port.to_string();
    let args = [
        "--model",
        model.to_str().expect("utf-8 path"),
        "--host",
        host,
        "--port",
        &port,
        "--n-parallel",
        "2",
        "--threads",
        "1",
        "--ctx-len",
        "512",
    ];
    Process::start(&binary("slotgate-engine"), &args)
}

/// The backends the gateway lists, by URL: whether each is healthy.
async fn listed(client: &reqwest::Client, gateway: &str) -> Vec<(String, bool)> {
    let (_, body) = get(client, &format!("{gateway}/admin/backends")).await;
    body["backends"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|b| (b["url"].as_str().unwrap_or_default().to_owned(), b["healthy"] == true))
        .collect()
}

/// Requests served through the gateway by the backend at `url`.
async fn served_by(client: &reqwest::Client, gateway: &str, url: &str) -> f64 {
    let text = metrics(client, gateway).await;
    metric_sum_where(&text, "slotgate_requests_total", &format!("backend=\"{url}\""))
}

#[tokio::test]
async fn engines_join_and_leave_by_their_dns_records_under_load() {
    let port = shared_port();
    let (a, b) = (format!("http://127.0.0.2:{port}"), format!("http://127.0.0.3:{port}"));
    let mut engines = [engine_on("127.0.0.2", port), engine_on("127.0.0.3", port)];
    let dns = Dnsmasq::start(
        &format!("127.0.0.2 {NAME}\n127.0.0.3 b.slotgate.test\n"),
        "b.slotgate.test",
        port,
    );
    let config = TempFile::new(
        "discovery.toml",
        &format!(
            "listen = \"127.0.0.1:0\"\ndrain_timeout_ms = 20000\n\
             [[backends]]\nurl = \"dns+http://{NAME}:{port}\"\n\
             [[backends]]\nurl = \"dnssrv+http://_engine._tcp.slotgate.test\"\n\
             [discovery]\ninterval_ms = 200\nnameservers = [\"127.0.0.1:{}\"]\n",
            dns.port
        ),
    );
    let gw = gateway_with_config(&config.path, &[]);
    let client = client();
    // The A record gives the engine on .2, the SRV record the one on .3.
    ready(&client, &gw, 2).await;
    let mut urls: Vec<String> =
        listed(&client, &gw.url).await.into_iter().map(|(u, _)| u).collect();
    urls.sort();
    assert_eq!(urls, vec![a.clone(), b.clone()]);
    drop(gw);

    // Now the A records alone, under load: .2 first; .3 is added, then .2 removed.
    dns.set(&format!("127.0.0.2 {NAME}\n"));
    let config = TempFile::new(
        "discovery.toml",
        &format!(
            "listen = \"127.0.0.1:0\"\ndrain_timeout_ms = 20000\n[[backends]]\nurl = \"dns+http://{NAME}:{port}\"\n\
             [discovery]\ninterval_ms = 200\nnameservers = [\"127.0.0.1:{}\"]\n",
            dns.port
        ),
    );
    let gw = gateway_with_config(&config.path, &[]);
    ready(&client, &gw, 1).await;
    assert_eq!(listed(&client, &gw.url).await, vec![(a.clone(), true)]);

    let stop = Arc::new(AtomicBool::new(false));
    let url = format!("{}/v1/completions", gw.url);
    let load: Vec<_> = (0..4)
        .map(|i| {
            let (client, url, stop) = (client.clone(), url.clone(), stop.clone());
            tokio::spawn(async move {
                let mut statuses = Vec::new();
                let until = Instant::now() + Duration::from_secs(90);
                while !stop.load(Ordering::SeqCst) && statuses.len() < 400 && Instant::now() < until
                {
                    let body = json!({"prompt": format!("Client {i} counts:"), "max_tokens": 4,
                                      "stream": statuses.len() % 2 == 1});
                    let response = client.post(&url).json(&body).send().await;
                    let status = match response {
                        Ok(r) => {
                            let status = r.status().as_u16();
                            // Read to the end: a stream cut short is a failure too.
                            match r.bytes().await {
                                Ok(b) if String::from_utf8_lossy(&b).contains("\"error\"") => 599,
                                Ok(_) => status,
                                Err(_) => 598,
                            }
                        }
                        Err(_) => 597,
                    };
                    statuses.push(status);
                }
                statuses
            })
        })
        .collect();

    dns.set(&format!("127.0.0.2 {NAME}\n127.0.0.3 {NAME}\n"));
    let joined = eventually(Duration::from_secs(20), || async {
        served_by(&client, &gw.url, &b).await > 0.0
    })
    .await;
    assert!(joined, "the engine added to DNS takes requests: {:?}", listed(&client, &gw.url).await);

    dns.set(&format!("127.0.0.3 {NAME}\n"));
    let left = eventually(Duration::from_secs(20), || async {
        listed(&client, &gw.url).await.iter().all(|(u, _)| u != &a)
    })
    .await;
    assert!(
        left,
        "the engine gone from DNS is drained and removed: {:?}",
        listed(&client, &gw.url).await
    );
    let served_by_a = served_by(&client, &gw.url, &a).await;
    let served_by_b = served_by(&client, &gw.url, &b).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(served_by(&client, &gw.url, &a).await, served_by_a, "nothing more goes to it");
    assert!(served_by(&client, &gw.url, &b).await > served_by_b, "the load goes on, on .3");
    // As a Kubernetes pod that left its Service: the engine itself stops too.
    assert!(engines[0].terminate(Duration::from_secs(10)).is_some(), "engine .2 stops");
    tokio::time::sleep(Duration::from_millis(500)).await;

    stop.store(true, Ordering::SeqCst);
    let mut statuses = Vec::new();
    for task in load {
        statuses.extend(task.await.unwrap());
    }
    assert!(statuses.len() >= 8, "the load ran: {statuses:?}");
    let failed: Vec<&u16> = statuses.iter().filter(|s| **s != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {failed:?}",
        failed.len(),
        statuses.len()
    );
    eprintln!(
        "{} requests, none failed; {served_by_a} served by .2 before it left",
        statuses.len()
    );
}
