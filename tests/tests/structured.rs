//! What today's OpenAI clients send beyond plain chat, on the real default model:
//! structured output (a grammar from a JSON schema), llama.cpp's own `grammar`.

use serde_json::{json, Value};
use slotgate_tests::*;

fn completion(body: Value) -> Value {
    let mut body = body;
    body["model"] = json!(MODEL);
    body
}

/// `response_format` with a JSON schema, through OpenAI's SDK (`parse` with a
/// Pydantic model, then 20 seeds streamed and not, four at a time): every answer
/// validates against its schema.
#[tokio::test]
async fn json_schema_answers_validate_for_every_seed() {
    let engine = engine(&["--n-parallel", "4", "--ctx-len", "1024"]);
    let out = tokio::task::spawn_blocking(move || {
        let out = python_client("structured_output.py", &[&engine.url, MODEL]);
        drop(engine);
        out
    })
    .await
    .unwrap();
    assert!(out.contains("structured output: ok"), "{out}");
}

/// llama.cpp's `grammar` field constrains text completions; a grammar it cannot
/// parse, a schema the converter cannot enforce and two constraints at once are
/// each a 400 that names the field.
#[tokio::test]
async fn grammars_constrain_and_bad_ones_are_named() {
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "256"]);
    let client = client();
    let url = format!("{}/v1/completions", engine.url);
    for seed in 0..4 {
        let body = completion(json!({"prompt": "The weather today is", "max_tokens": 8,
            "grammar": "root ::= (\"sunny\" | \"rainy\") \".\"", "seed": seed, "temperature": 1.5}));
        let (status, answer) = post(&client, &url, &body).await;
        assert_eq!(status, 200, "{answer}");
        let text = answer["choices"][0]["text"].as_str().unwrap();
        assert!(["sunny.", "rainy."].contains(&text), "{text:?}");
        assert_eq!(answer["choices"][0]["finish_reason"], "stop");
    }
    // llama-server's `schema` beside `json_object` shapes the object.
    let body = completion(json!({"prompt": "The answer is", "max_tokens": 8, "temperature": 1.0,
        "response_format": {"type": "json_object", "schema": {"const": "42"}}}));
    let (status, answer) = post(&client, &url, &body).await;
    assert_eq!((status, answer["choices"][0]["text"].as_str()), (200, Some("\"42\"")), "{answer}");
    let cases = [
        (
            json!({"response_format": {"type": "json_object", "schema": 123}}),
            "response_format.schema",
        ),
        (json!({"grammar": "root ::= (\"a\""}), "grammar"),
        (json!({"json_schema": {"type": "string", "format": "email"}}), "json_schema"),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema":
                {"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}}}}}),
            "response_format.json_schema.schema.properties.n",
        ),
        (json!({"grammar": "root ::= \"a\"", "json_schema": {}}), "json_schema"),
        (json!({"response_format": {"type": "yaml"}}), "response_format.type"),
    ];
    for (fields, param) in cases {
        let mut body = completion(json!({"prompt": "x", "max_tokens": 2}));
        body.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
        let (status, answer) = post(&client, &url, &body).await;
        assert_eq!(status, 400, "{body}: {answer}");
        assert_eq!(answer["error"]["param"], param, "{answer}");
    }
    // The engine still serves after every refusal.
    let (status, _) =
        post(&client, &url, &completion(json!({"prompt": "x", "max_tokens": 2}))).await;
    assert_eq!(status, 200);
}

/// Log probabilities, chat and text completions, streamed and not: one entry per
/// generated token, whose texts make up the answer; greedy decoding picks the most
/// likely token, so each token is its own first alternative.
#[tokio::test]
async fn logprobs_cover_every_token_streamed_and_not() {
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "256"]);
    let client = client();
    let url = format!("{}/v1/chat/completions", engine.url);
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Name three colours."}],
        "max_tokens": 8, "temperature": 0, "logprobs": true, "top_logprobs": 3, "cache_prompt": false});
    let (status, answer) = post(&client, &url, &body).await;
    assert_eq!(status, 200, "{answer}");
    let choice = &answer["choices"][0];
    let content = choice["logprobs"]["content"].as_array().unwrap();
    assert_eq!(
        content.len() as u64,
        answer["usage"]["completion_tokens"].as_u64().unwrap(),
        "{answer}"
    );
    let joined: String = content.iter().map(|t| t["token"].as_str().unwrap()).collect();
    assert_eq!(joined, choice["message"]["content"].as_str().unwrap());
    for token in content {
        let top = token["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{token}");
        assert_eq!(top[0]["token"], token["token"], "greedy picks the best: {token}");
        assert!(token["logprob"].as_f64().unwrap() <= 0.0);
        let bytes: Vec<u8> =
            token["bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap() as u8).collect();
        assert_eq!(String::from_utf8_lossy(&bytes), token["token"].as_str().unwrap());
    }

    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let (status, streamed) = stream(&client, &url, &streamed_body).await;
    assert_eq!(status, 200);
    let entries: Vec<Value> = streamed
        .chunks
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array())
        .flatten()
        .cloned()
        .collect();
    assert_eq!(&entries, content, "the stream carries the same entries");

    let url = format!("{}/v1/completions", engine.url);
    let body = json!({"model": MODEL, "prompt": "One, two, three,", "max_tokens": 6,
        "temperature": 0, "logprobs": 2});
    let (status, answer) = post(&client, &url, &body).await;
    assert_eq!(status, 200, "{answer}");
    let logprobs = &answer["choices"][0]["logprobs"];
    let tokens: Vec<&str> =
        logprobs["tokens"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    assert_eq!(tokens.concat(), answer["choices"][0]["text"].as_str().unwrap());
    let offsets: Vec<u64> =
        logprobs["text_offset"].as_array().unwrap().iter().map(|o| o.as_u64().unwrap()).collect();
    assert_eq!(offsets[0], 0);
    assert_eq!(offsets[1], tokens[0].chars().count() as u64);
    assert!(logprobs["top_logprobs"].as_array().unwrap().iter().all(|m| m
        .as_object()
        .unwrap()
        .len()
        == 2));

    for (path, fields, param) in [
        ("chat/completions", json!({"logprobs": true, "top_logprobs": 21}), "top_logprobs"),
        ("chat/completions", json!({"top_logprobs": 2}), "top_logprobs"),
        ("completions", json!({"logprobs": 6}), "logprobs"),
    ] {
        let mut body = if path == "completions" {
            json!({"model": MODEL, "prompt": "x", "max_tokens": 2})
        } else {
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
        };
        body.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
        let (status, answer) = post(&client, &format!("{}/v1/{path}", engine.url), &body).await;
        assert_eq!((status, answer["error"]["param"].as_str()), (400, Some(param)), "{answer}");
    }
}

/// Tools through OpenAI's SDK on a model whose template has no tool section
/// (llama-server's generic form): required, streamed, named, and a conversation
/// that carries a call and its result; and logprobs per token.
#[tokio::test]
async fn openai_sdk_calls_tools_on_the_default_model() {
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "1024"]);
    let out = tokio::task::spawn_blocking(move || {
        let out = python_client("tools.py", &[&engine.url, MODEL]);
        drop(engine);
        out
    })
    .await
    .unwrap();
    assert!(out.contains("tools: ok"), "{out}");
}

fn fixture(name: &str) -> String {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/templates")
        .join(name)
        .display()
        .to_string()
}

/// A Jinja template with a tool section (the Qwen 2.5-style fixture) is given
/// the tools: a required call comes in its `<tool_call>` tags, constrained by a
/// grammar, and is read back into `tool_calls`; `/props` and `/apply-template`
/// show that template. A template's own `raise_exception` is a 400.
#[tokio::test]
async fn a_jinja_template_with_tools_writes_calls_in_its_own_format() {
    let qwen = fixture("qwen2.5-tools.jinja");
    let engine = engine(&["--n-parallel", "2", "--ctx-len", "1024", "--chat-template-file", &qwen]);
    let client = client();
    let (_, props) = get(&client, &format!("{}/props", engine.url)).await;
    assert_eq!(props["chat_template_name"], "jinja", "{props}");
    assert_eq!(props["chat_template"], std::fs::read_to_string(&qwen).unwrap());
    let (status, applied) = post(
        &client,
        &format!("{}/apply-template", engine.url),
        &json!({"messages": [{"role": "user", "content": "Hi"}]}),
    )
    .await;
    assert_eq!(status, 200, "{applied}");
    assert!(applied["prompt"]
        .as_str()
        .unwrap()
        .ends_with("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));

    let url = format!("{}/v1/chat/completions", engine.url);
    let tools = json!([{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"]}}}]);
    for seed in 0..3 {
        let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": tools, "tool_choice": "required", "max_tokens": 40, "seed": seed});
        let (status, answer) = post(&client, &url, &body).await;
        assert_eq!(status, 200, "{answer}");
        let choice = &answer["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls", "{answer}");
        let call = &choice["message"]["tool_calls"][0]["function"];
        assert_eq!(call["name"], "get_weather");
        let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
        assert!(["Paris", "Oslo"].contains(&arguments["city"].as_str().unwrap()), "{arguments}");
    }
    drop(engine);

    let llama = slotgate_tests::engine(&[
        "--n-parallel",
        "1",
        "--ctx-len",
        "256",
        "--chat-template-file",
        &fixture("llama3.jinja"),
    ]);
    let url = format!("{}/v1/chat/completions", llama.url);
    let body = json!({"model": MODEL, "messages": [{"role": "developer", "content": "x"}], "max_tokens": 2});
    let (status, answer) = post(&client, &url, &body).await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]["message"].as_str().unwrap().contains("Conversation roles must be"),
        "{answer}"
    );
    let body =
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
    assert_eq!(post(&client, &url, &body).await.0, 200, "the engine serves on");
}

/// `aliases` map other names (what clients written for OpenAI send) to a served
/// model, in the engine and in the gateway: listed in `/v1/models`, answered as
/// the model; an unknown name stays a 404.
#[tokio::test]
async fn aliases_name_a_served_model_in_the_engine_and_the_gateway() {
    let engine = engine(&["--n-parallel", "1", "--ctx-len", "256", "--alias", "gpt-4o-mini"]);
    let client = client();
    let (_, models) = get(&client, &format!("{}/v1/models", engine.url)).await;
    let ids: Vec<&str> =
        models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec![MODEL, "gpt-4o-mini"]);
    let chat = |model: &str| json!({"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2});
    let url = format!("{}/v1/chat/completions", engine.url);
    let (status, answer) = post(&client, &url, &chat("gpt-4o-mini")).await;
    assert_eq!((status, answer["model"].as_str()), (200, Some(MODEL)), "{answer}");
    assert_eq!(post(&client, &url, &chat("gpt-5")).await.0, 404);

    // The gateway's own alias, for an engine that knows no such name: the body
    // reaches the engine under the model's name.
    let plain = slotgate_tests::engine(&["--n-parallel", "1", "--ctx-len", "256"]);
    let config = std::env::temp_dir().join(format!("slotgate-aliases-{}.toml", std::process::id()));
    std::fs::write(
        &config,
        format!("[aliases]\n\"team-default\" = \"{MODEL}\"\n\"elsewhere\" = \"missing\"\n"),
    )
    .unwrap();
    let gateway = Process::start_with_env(
        &binary("slotgate"),
        &["--listen", "127.0.0.1:0", "--backend", &plain.url, "--config", config.to_str().unwrap()],
        &[
            ("SLOTGATE_ROUTING__HEALTH_INTERVAL_MS", "100"),
            ("SLOTGATE_ROUTING__HEALTHY_THRESHOLD", "1"),
            ("SLOTGATE_AUTH__ADMIN_LOOPBACK", "true"),
        ],
    );
    ready(&client, &gateway, 1).await;
    let _ = std::fs::remove_file(&config);
    let (_, models) = get(&client, &format!("{}/v1/models", gateway.url)).await;
    let ids: Vec<&str> =
        models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, vec![MODEL, "team-default"], "an alias of nothing served is not listed");
    let url = format!("{}/v1/chat/completions", gateway.url);
    let (status, answer) = post(&client, &url, &chat("team-default")).await;
    assert_eq!((status, answer["model"].as_str()), (200, Some(MODEL)), "{answer}");
    assert_eq!(post(&client, &url, &chat("elsewhere")).await.0, 404);

    // llama-server's `/props`, through the gateway, from a backend serving the model.
    for query in ["", "?model=team-default"] {
        let (status, props) = get(&client, &format!("{}/props{query}", gateway.url)).await;
        assert_eq!(status, 200, "{props}");
        assert_eq!(props["total_slots"], 1, "{props}");
    }
    let (status, _) = get(&client, &format!("{}/props?model=gpt-5", gateway.url)).await;
    assert_eq!(status, 404);
}
