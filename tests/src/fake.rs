//! A scripted fake backend for fault injection: it speaks just enough HTTP/1.1 to
//! look like an engine (`/health`, `/slots`, `/v1/models`) and answers generation
//! requests from a script ("503 slot_unavailable twice, then reset, then answer").
//! Started as vLLM, it has no `/slots` and shows a settable load in `/metrics`.
//! It is never a stand-in for the real engine: every feature is also tested there.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the fake does with the next generation request.
#[derive(Debug, Clone)]
pub enum Step {
    /// 503 with the `slot_unavailable` envelope.
    SlotUnavailable,
    /// Close the connection without a byte of answer.
    Reset,
    /// Stream `n` chunks then close the connection without `[DONE]`.
    DieMidStream(u32),
    /// Wait, then answer normally.
    Stall(Duration),
    /// Stream `n` chunks, then send nothing more while the connection stays open.
    SilentMidStream(u32),
    /// Answer and keep the connection alive, then close it 20 ms later
    /// without a word: the gateway finds it closed only when it reuses it.
    KeepAliveThenClose,
}

/// A running fake; stops when dropped.
pub struct Fake {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    state: Arc<State>,
    /// Generation requests received.
    pub requests: Arc<AtomicU32>,
    task: tokio::task::JoinHandle<()>,
}

/// What every connection of one fake shares.
struct State {
    script: Mutex<VecDeque<Step>>,
    requests: Arc<AtomicU32>,
    model: String,
    slots: u32,
    /// Shaped like vLLM: no `/slots`, its load in `/metrics`.
    vllm: bool,
    /// `vllm:num_requests_running` and `vllm:num_requests_waiting`.
    load: [AtomicU32; 2],
}

impl Drop for Fake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Fake {
    /// Starts a fake serving `model` with `slots` slots.
    pub async fn start(model: &str, slots: u32) -> Self {
        Self::spawn(model, slots, false).await
    }

    /// Starts a fake shaped like vLLM: `/metrics` instead of `/slots`, its load
    /// set by [`Fake::set_load`].
    pub async fn start_vllm(model: &str) -> Self {
        Self::spawn(model, 0, true).await
    }

    async fn spawn(model: &str, slots: u32, vllm: bool) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let requests = Arc::new(AtomicU32::new(0));
        let state = Arc::new(State {
            script: Mutex::new(VecDeque::new()),
            requests: requests.clone(),
            model: model.to_owned(),
            slots,
            vllm,
            load: [AtomicU32::new(0), AtomicU32::new(0)],
        });
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                let state = shared.clone();
                tokio::spawn(async move {
                    let _ = serve(socket, &state).await;
                });
            }
        });
        Self { url, state, requests, task }
    }

    /// Appends steps to the script; once it is empty, requests are answered normally.
    pub fn push(&self, steps: &[Step]) {
        self.state.script.lock().unwrap_or_else(|e| e.into_inner()).extend(steps.iter().cloned());
    }

    /// Sets the load a vLLM-shaped fake reports: requests running and waiting.
    pub fn set_load(&self, running: u32, waiting: u32) {
        self.state.load[0].store(running, Ordering::SeqCst);
        self.state.load[1].store(waiting, Ordering::SeqCst);
    }
}

async fn serve(mut socket: TcpStream, state: &State) -> std::io::Result<()> {
    let (model, slots) = (state.model.as_str(), state.slots);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let (head_end, length) = loop {
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..i]).to_lowercase();
            let length = head
                .lines()
                .find_map(|l| {
                    l.strip_prefix("content-length:")
                        .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                })
                .unwrap_or(0);
            break (i + 4, length);
        }
    };
    while buf.len() < head_end + length {
        let n = socket.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
    let body = String::from_utf8_lossy(&buf[head_end..]).to_string();
    let stream = body.contains("\"stream\":true");
    let reply = |status: &str, content_type: &str, body: &str| {
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )
    };
    let out = match path.as_str() {
        "/health" => reply("200 OK", "application/json", r#"{"status":"ok"}"#),
        "/metrics" if state.vllm => reply(
            "200 OK",
            "text/plain; version=0.0.4",
            &format!(
                "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{engine=\"0\",model_name=\"{model}\"}} {}.0\n\
                 # TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{engine=\"0\",model_name=\"{model}\"}} {}.0\n",
                state.load[0].load(Ordering::SeqCst),
                state.load[1].load(Ordering::SeqCst),
            ),
        ),
        "/slots" if !state.vllm => {
            let slots: Vec<String> = (0..slots)
                .map(|i| format!(r#"{{"id":{i},"id_task":-1,"n_ctx":512,"is_processing":false}}"#))
                .collect();
            reply("200 OK", "application/json", &format!("[{}]", slots.join(",")))
        }
        "/v1/models" => reply(
            "200 OK",
            "application/json",
            &format!(
                r#"{{"object":"list","data":[{{"id":"{model}","object":"model","created":0,"owned_by":"fake"}}]}}"#
            ),
        ),
        // llama-server's properties, echoing the query; `Stall` delays it too.
        p if p.starts_with("/props") => {
            state.requests.fetch_add(1, Ordering::SeqCst);
            let step = state.script.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
            if let Some(Step::Stall(pause)) = step {
                tokio::time::sleep(pause).await;
            }
            let query = p.split_once('?').map_or("", |(_, q)| q);
            reply("200 OK", "application/json", &format!(r#"{{"model_alias":"{model}","query":"{query}"}}"#))
        }
        // What llama.cpp's server and vLLM answer for anything else, such as
        // slotgate's own `/slots/events`.
        p if !p.starts_with("/v1/") => reply("404 Not Found", "text/plain", "not found"),
        _ => {
            state.requests.fetch_add(1, Ordering::SeqCst);
            let step = state.script.lock().unwrap_or_else(|e| e.into_inner()).pop_front();
            match step {
                Some(Step::SlotUnavailable) => reply(
                    "503 Service Unavailable",
                    "application/json",
                    r#"{"error":{"message":"all slots are busy","type":"unavailable_error","param":null,"code":"slot_unavailable"}}"#,
                ),
                Some(Step::Reset) => return Ok(()),
                Some(step @ (Step::DieMidStream(n) | Step::SilentMidStream(n))) => {
                    socket
                        .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n")
                        .await?;
                    for i in 0..n {
                        let event = format!("data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"t{i}\"}}}}]}}\n\n");
                        socket
                            .write_all(format!("{:x}\r\n{event}\r\n", event.len()).as_bytes())
                            .await?;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    if matches!(step, Step::SilentMidStream(_)) {
                        // Open and silent until the other side closes (or 60 s).
                        let mut rest = [0u8; 64];
                        let _ = tokio::time::timeout(Duration::from_secs(60), socket.read(&mut rest)).await;
                    }
                    // Gone without the terminating chunk.
                    return Ok(());
                }
                Some(Step::KeepAliveThenClose) => {
                    let kept = answer(stream, model).replacen("connection: close\r\n", "", 1);
                    socket.write_all(kept.as_bytes()).await?;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    return Ok(());
                }
                Some(Step::Stall(d)) => {
                    tokio::time::sleep(d).await;
                    answer(stream, model)
                }
                None => answer(stream, model),
            }
        }
    };
    socket.write_all(out.as_bytes()).await?;
    socket.shutdown().await
}

fn answer(stream: bool, model: &str) -> String {
    if stream {
        let body = format!(
            "data: {{\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"{model}\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"ok\"}},\"finish_reason\":null}}]}}\n\n\
             data: {{\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"created\":0,\"model\":\"{model}\",\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]}}\n\ndata: [DONE]\n\n"
        );
        format!("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len())
    } else {
        let body = format!(
            r#"{{"id":"x","object":"chat.completion","created":0,"model":"{model}","choices":[{{"index":0,"message":{{"role":"assistant","content":"ok"}},"logprobs":null,"finish_reason":"stop"}}],"usage":{{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}}}"#
        );
        format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}", body.len())
    }
}
