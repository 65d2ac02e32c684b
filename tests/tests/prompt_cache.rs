//! Conversations keep their prompt caches: on one engine (slot choice and the
//! host-memory cache) and through the gateway (cache-aware routing), on the real
//! default model.

use serde_json::{json, Value};
use slotgate_tests::*;

/// One conversation: its messages so far.
struct Conversation {
    messages: Vec<Value>,
    /// Prompt tokens of the last turn.
    last_prompt: u64,
}

impl Conversation {
    /// A conversation whose first message is long enough to be worth caching.
    fn new(topic: &str) -> Self {
        let opening = format!(
            "We are planning a trip about {topic}. Write short notes on {topic}: where to \
             go, what to eat, how to travel between places, what it costs, and which months \
             are best for {topic}. Keep each note to one line."
        );
        Self { messages: vec![json!({"role": "user", "content": opening})], last_prompt: 0 }
    }

    /// Sends the whole transcript to `url`, with `extra` fields, and appends the
    /// answer and a follow-up. Returns (prompt tokens, cached tokens).
    async fn turn(&mut self, client: &reqwest::Client, url: &str, extra: &Value) -> (u64, u64) {
        let mut body = json!({"model": MODEL, "messages": self.messages, "max_tokens": 8,
                              "temperature": 0});
        for (k, v) in extra.as_object().into_iter().flatten() {
            body[k] = v.clone();
        }
        let (status, answer) = post(client, &format!("{url}/v1/chat/completions"), &body).await;
        assert_eq!(status, 200, "{answer}");
        let text = answer["choices"][0]["message"]["content"].as_str().unwrap_or_default();
        self.messages.push(json!({"role": "assistant", "content": text}));
        self.messages.push(json!({"role": "user", "content": "Tell me more."}));
        let prompt = answer["usage"]["prompt_tokens"].as_u64().unwrap();
        let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap();
        self.last_prompt = prompt;
        (prompt, cached)
    }
}

/// Takes one turn of `c` and checks that it reused at least the whole of its
/// previous prompt.
async fn warm_turn(c: &mut Conversation, client: &reqwest::Client, url: &str, extra: &Value) {
    let before = c.last_prompt;
    let (prompt, cached) = c.turn(client, url, extra).await;
    assert!(
        cached >= before,
        "a later turn reused {cached} of {prompt} prompt tokens; its previous prompt had {before}"
    );
}

/// The reproduction: two conversations taking turns on two slots. Each
/// keeps its own slot, and the empty slot is taken rather than the warm one.
#[tokio::test]
async fn two_conversations_on_two_slots_each_keep_their_slot() {
    // Without the host cache, only the slot choice can keep them warm.
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "1024", "--cache-ram-mib", "0"]);
    let client = client();
    let (mut a, mut b) = (Conversation::new("Lisbon"), Conversation::new("Kyoto"));
    a.turn(&client, &engine.url, &json!({})).await;
    let (_, cached) = b.turn(&client, &engine.url, &json!({})).await;
    assert!(cached < 16, "a new conversation found {cached} tokens of another one");
    let (_, slots) = get(&client, &format!("{}/slots", engine.url)).await;
    let warm = slots.as_array().unwrap().iter().filter(|s| s["n_cached"].as_u64() > Some(16));
    assert_eq!(warm.count(), 2, "both conversations hold a slot: {slots}");
    for _ in 0..2 {
        warm_turn(&mut a, &client, &engine.url, &json!({})).await;
        warm_turn(&mut b, &client, &engine.url, &json!({})).await;
    }
}

/// More conversations than slots: the one that lost its slot is restored from
/// host memory when it comes back, and only with the host cache on.
#[tokio::test]
async fn the_host_cache_restores_a_conversation_that_lost_its_slot() {
    let cached = engine(&["--n-parallel", "1", "--ctx-len", "1024"]);
    let client = client();
    let (mut a, mut b) = (Conversation::new("Lisbon"), Conversation::new("Kyoto"));
    a.turn(&client, &cached.url, &json!({})).await;
    b.turn(&client, &cached.url, &json!({})).await;
    for _ in 0..2 {
        warm_turn(&mut a, &client, &cached.url, &json!({})).await;
        warm_turn(&mut b, &client, &cached.url, &json!({})).await;
    }
    let text = metrics(&client, &cached.url).await;
    assert_eq!(metric_sum(&text, "slotgate_engine_host_cache_hits_total"), 4.0, "{text}");
    assert!(metric_sum(&text, "slotgate_engine_host_cache_bytes") > 0.0);
    assert_eq!(metric_sum(&text, "slotgate_engine_host_cache_entries"), 1.0);
    let computed = metric_sum(&text, "slotgate_engine_prompt_tokens_computed_total");
    let reused = metric_sum(&text, "slotgate_engine_prompt_tokens_cached_total");
    let total = metric_sum(&text, "slotgate_engine_prompt_tokens_total");
    assert_eq!(computed + reused, total);
    assert!(reused > computed, "reused {reused}, computed {computed}");
    drop(cached);

    // The control: the same work with the host cache off finds only the template.
    let off = engine(&["--n-parallel", "1", "--ctx-len", "1024", "--cache-ram-mib", "0"]);
    let (mut a, mut b) = (Conversation::new("Lisbon"), Conversation::new("Kyoto"));
    let (first, _) = a.turn(&client, &off.url, &json!({})).await;
    b.turn(&client, &off.url, &json!({})).await;
    let (_, reused) = a.turn(&client, &off.url, &json!({})).await;
    assert!(reused < first, "without the host cache turn two reused {reused} tokens");
}

/// The gateway's default policy keeps each conversation on one engine, turn
/// after turn, so each later turn is warm.
#[tokio::test]
async fn the_gateway_keeps_each_conversation_on_one_engine() {
    let args = ["--n-parallel", "4", "--ctx-len", "1024", "--threads", "1", "--cache-ram-mib", "0"];
    let engines = [engine(&args), engine(&args)];
    let client = client();
    let urls: Vec<&str> = engines.iter().map(|e| e.url.as_str()).collect();
    let gateway = gateway(&urls, &[]);
    ready(&client, &gateway, 2).await;
    let mut conversations: Vec<Conversation> =
        ["Lisbon", "Kyoto", "Quito", "Oslo"].iter().map(|t| Conversation::new(t)).collect();
    for c in &mut conversations {
        c.turn(&client, &gateway.url, &json!({})).await;
    }
    for _ in 0..2 {
        for c in &mut conversations {
            warm_turn(c, &client, &gateway.url, &json!({})).await;
        }
    }
    let text = metrics(&client, &gateway.url).await;
    let decisions = "slotgate_routing_decisions_total";
    assert_eq!(metric_sum_where(&text, decisions, "reason=\"affinity\""), 12.0, "{text}");
    let reported = metric_sum(&text, "slotgate_backend_prompt_tokens_cached_total");
    assert!(reported > 0.0, "the gateway counts the reuse its backends report");
}

/// A conversation whose engine is saturated spills to the other one, and stays
/// there, where its newest turn is cached, while that engine has room.
#[tokio::test]
async fn a_saturated_engine_spills_the_conversation() {
    let args = ["--n-parallel", "1", "--ctx-len", "1024", "--threads", "1", "--queue-size", "0"];
    let engines = [engine(&args), engine(&args)];
    let client = client();
    let urls: Vec<&str> = engines.iter().map(|e| e.url.as_str()).collect();
    let gateway = gateway(&urls, &[]);
    ready(&client, &gateway, 2).await;
    let session = json!({"prompt_cache_key": "trip-42"});
    let mut c = Conversation::new("Lisbon");
    c.turn(&client, &gateway.url, &session).await;
    let served = |text: &str| metric_sum(text, "slotgate_engine_requests_total");
    let mut counts = Vec::new();
    for e in &engines {
        counts.push(served(&metrics(&client, &e.url).await));
    }
    let home = if counts[0] > counts[1] { 0 } else { 1 };

    // Hold the home engine's only slot with a long stream of the same key.
    let long = tokio::spawn({
        let (client, url) = (client.clone(), format!("{}/v1/chat/completions", gateway.url));
        async move {
            let body = json!({"model": MODEL, "prompt_cache_key": "trip-42", "stream": true,
                              "messages": [{"role": "user", "content": "Tell a long story."}],
                              "max_tokens": 200, "temperature": 0});
            stream(&client, &url, &body).await
        }
    });
    wait_slot_busy(&client, &engines[home].url).await;
    c.turn(&client, &gateway.url, &session).await;
    let (status, streamed) = long.await.unwrap();
    assert_eq!(status, 200);
    assert!(streamed.done);
    let text = metrics(&client, &gateway.url).await;
    let decisions = "slotgate_routing_decisions_total";
    assert_eq!(metric_sum_where(&text, decisions, "reason=\"spilled\""), 1.0, "{text}");
    let away = served(&metrics(&client, &engines[1 - home].url).await);
    assert_eq!(away, counts[1 - home] + 1.0, "the spilled turn went to the other engine");

    // Room again at home, but the newest turn is cached where it spilled: the
    // conversation stays there, warm.
    warm_turn(&mut c, &client, &gateway.url, &session).await;
    let text = metrics(&client, &gateway.url).await;
    assert_eq!(metric_sum_where(&text, decisions, "reason=\"affinity\""), 3.0, "{text}");
    let again = served(&metrics(&client, &engines[1 - home].url).await);
    assert_eq!(again, away + 1.0, "it stayed where it spilled");
}

/// With `kv_unified`, the slots share one KV cache of `ctx_len × n_parallel`
/// cells: an answer may outgrow `ctx_len` while the others are short, and a
/// request that would overfill the cache waits for room (never more running
/// than fit) instead of failing, so every answer runs to its `max_tokens`.
#[tokio::test]
async fn a_shared_kv_cache_lets_an_answer_outgrow_a_slot_and_the_rest_wait() {
    let engine = engine(&["--n-parallel", "4", "--ctx-len", "64", "--kv-unified", "true"]);
    let client = client();
    let url = format!("{}/v1/completions", engine.url);
    // Each reserves its prompt and 80 tokens, more than a slot's 64: three fit
    // in the 256 cells, the fourth waits. `<eos>` and `<end_of_turn>` are banned.
    let body = json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 80,
                      "logit_bias": {"1": -100, "106": -100}});
    let requests = (0..4).map(|_| {
        let (client, url, body) = (client.clone(), url.clone(), body.clone());
        tokio::spawn(async move { post(&client, &url, &body).await })
    });
    let requests: Vec<_> = requests.collect();
    let mut most_busy = 0;
    let slots = format!("{}/slots", engine.url);
    while !requests.iter().all(tokio::task::JoinHandle::is_finished) {
        let (_, listed) = get(&client, &slots).await;
        let busy = listed
            .as_array()
            .map_or(0, |s| s.iter().filter(|s| s["is_processing"] == Value::Bool(true)).count());
        most_busy = most_busy.max(busy);
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    for request in requests {
        let (status, answer) = request.await.unwrap();
        assert_eq!(status, 200, "{answer}");
        assert_eq!(answer["usage"]["completion_tokens"], 80, "{answer}");
        assert_eq!(answer["choices"][0]["finish_reason"], "length", "{answer}");
    }
    assert!((2..=3).contains(&most_busy), "{most_busy} slots ran at once; 3 fit the cache");
    let (_, props) = get(&client, &format!("{}/props", engine.url)).await;
    assert_eq!(props["default_generation_settings"]["n_ctx"], 256, "{props}");
}
