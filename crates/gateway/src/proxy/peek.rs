//! What the gateway reads of a request body; the rest is forwarded untouched.

use axum::http::HeaderMap;
use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use slotgate_protocol::validate::MAX_N;
use slotgate_protocol::ApiError;

use crate::fleet::affinity::{Opening, PromptHead, Said};
use crate::proxy::bounded::{Scalar, StreamOptions};

/// The fields routing needs.
#[derive(Debug)]
pub struct Peek {
    /// The model asked for.
    pub model: String,
    /// Whether the answer is streamed.
    pub stream: bool,
    /// The affinity key for `cache_aware` routing.
    pub affinity: Option<u64>,
    /// Whether a stream asked for its usage (`stream_options.include_usage`).
    pub usage_asked: bool,
    /// The stored response a Responses request continues.
    pub previous: Option<String>,
}

/// The two fields every policy needs; the rest of the body is checked to be
/// JSON and skipped without building it.
#[derive(Deserialize)]
struct BodyHead {
    model: Option<Scalar>,
    stream: Option<Scalar>,
    stream_options: Option<StreamOptions>,
    n: Option<Scalar>,
    previous_response_id: Option<Scalar>,
}

/// [`BodyHead`] and what the affinity key is derived from ([`Said`]): of a chat,
/// only its opening messages are read, their text borrowed from the body.
/// `Said`'s fields are listed again rather than `#[serde(flatten)]`ed: flatten
/// buffers every other field of the body, the cost this pass exists to avoid.
#[derive(Deserialize)]
struct Keyed<'a> {
    model: Option<Scalar>,
    stream: Option<Scalar>,
    stream_options: Option<StreamOptions>,
    n: Option<Scalar>,
    previous_response_id: Option<Scalar>,
    prompt_cache_key: Option<Scalar>,
    #[serde(borrow)]
    messages: Option<Opening<'a>>,
    prompt: Option<PromptHead>,
}

/// Reads `body`, or says why it cannot be routed, in one pass that builds only
/// the fields it reads: a whole body as a `serde_json::Value` was the largest
/// cost of the proxy's own work. The affinity key is derived only when
/// `affinity` is asked for. A missing model is left empty, for the caller to
/// fill in when only one model is served.
pub fn peek(body: &[u8], headers: &HeaderMap, affinity: bool) -> Result<Peek, ApiError> {
    let (model, stream, options, n, previous, keyed) = if affinity {
        let k: Keyed = slotgate_protocol::parse_json(body)?;
        let said = Said {
            prompt_cache_key: k.prompt_cache_key.map(|s| s.0),
            messages: k.messages,
            prompt: k.prompt,
        };
        (k.model, k.stream, k.stream_options, k.n, k.previous_response_id, Some(said))
    } else {
        let h: BodyHead = slotgate_protocol::parse_json(body)?;
        (h.model, h.stream, h.stream_options, h.n, h.previous_response_id, None)
    };
    // Refused before a slot is claimed for it; the backend checks the rest.
    if let Some(n) = n.and_then(|n| n.0.as_u64()).filter(|&n| n > u64::from(MAX_N)) {
        return Err(ApiError::invalid("n", format!("n must be at most {MAX_N}, got {n}")));
    }
    let model = match model.map(|s| s.0) {
        Some(Value::String(m)) => m,
        Some(_) => return Err(ApiError::invalid("model", "model must be a string")),
        None => String::new(),
    };
    let affinity = keyed.and_then(|said| crate::fleet::affinity::key(&model, &said, headers));
    let stream = stream.and_then(|s| s.0.as_bool()).unwrap_or(false);
    let usage_asked = options.and_then(|o| o.include_usage).and_then(|u| u.as_bool()) == Some(true);
    let previous = match previous.map(|s| s.0) {
        Some(Value::String(id)) => Some(id),
        Some(Value::Null) | None => None,
        Some(_) => {
            return Err(ApiError::invalid(
                "previous_response_id",
                "previous_response_id must be a string",
            ))
        }
    };
    Ok(Peek { model, stream, affinity, usage_asked, previous })
}

/// What a forwarded body must say that its client's may not.
#[derive(Debug, Clone, Copy, Default)]
pub struct Changes<'a> {
    /// The backend's name of the model (an alias resolved).
    pub model: Option<&'a str>,
    /// `stream_options.include_usage` set.
    pub ask_usage: bool,
    /// The key's `cache_salt`: a salt the client sent is kept only salted again
    /// with it, so that no client can name another key's salt (or an unkeyed
    /// request's lack of one).
    pub salt: Option<&'a str>,
    /// A body without a salt of its own carries the key's.
    pub isolate: bool,
}

impl Changes<'_> {
    /// Whether the body may change at all; a salt changes it only when the
    /// client sent one, or with `isolate`.
    pub fn any(&self, body: &[u8]) -> bool {
        let salts = self.salt.is_some()
            && (self.isolate || memchr::memmem::find(body, b"cache_salt").is_some());
        self.model.is_some() || self.ask_usage || salts
    }
}

/// `body` with `changes` made; the rest of the body is kept as sent, byte for
/// byte: its fields are copied as the raw text they were, never built as JSON
/// values (see [`crate::proxy::bounded`]).
pub fn rewrite(body: &axum::body::Bytes, changes: &Changes) -> Result<axum::body::Bytes, ApiError> {
    let Changes { model, ask_usage, salt, isolate } = *changes;
    let fields: Fields = slotgate_protocol::parse_json(body)?;
    let json = |text: &str| serde_json::to_string(text).unwrap_or_default();
    let mut out = Vec::with_capacity(body.len() + 64);
    let mut first = true;
    let mut put = |out: &mut Vec<u8>, key: &str, value: &[u8]| {
        out.push(if first { b'{' } else { b',' });
        first = false;
        out.extend_from_slice(json(key).as_bytes());
        out.push(b':');
        out.extend_from_slice(value);
    };
    let (mut has_model, mut has_options, mut has_salt) = (false, false, false);
    for (key, raw) in &fields.0 {
        match (key.as_ref(), model) {
            ("model", Some(model)) => {
                has_model = true;
                put(&mut out, key, json(model).as_bytes());
            }
            ("cache_salt", _) if salt.is_some() => {
                has_salt = true;
                // What is no string is kept, for the backend to refuse.
                match (salt, serde_json::from_str::<String>(raw.get())) {
                    (Some(salt), Ok(own)) => {
                        put(&mut out, key, json(&salted(salt, &own)).as_bytes())
                    }
                    _ => put(&mut out, key, raw.get().as_bytes()),
                }
            }
            ("stream_options", _) if ask_usage => {
                has_options = true;
                let options = with_usage(raw)?;
                put(&mut out, key, &options);
            }
            _ => put(&mut out, key, raw.get().as_bytes()),
        }
    }
    if let (Some(model), false) = (model, has_model) {
        put(&mut out, "model", json(model).as_bytes());
    }
    if ask_usage && !has_options {
        put(&mut out, "stream_options", br#"{"include_usage":true}"#);
    }
    if let (Some(salt), false, true) = (salt, has_salt, isolate) {
        put(&mut out, "cache_salt", json(salt).as_bytes());
    }
    if first {
        out.push(b'{');
    }
    out.push(b'}');
    Ok(axum::body::Bytes::from(out))
}

/// A client's own salt under its key's: the two hashed together, in hex. An
/// empty one stays empty, for the backend to refuse as it would have.
fn salted(key_salt: &str, own: &str) -> String {
    if own.is_empty() {
        return String::new();
    }
    let mut input = Vec::with_capacity(key_salt.len() + own.len() + 1);
    input.extend_from_slice(key_salt.as_bytes());
    input.push(0);
    input.extend_from_slice(own.as_bytes());
    crate::tenancy::digest(&input).iter().map(|b| format!("{b:02x}")).collect()
}

/// `stream_options` with `include_usage: true`, its other fields kept; what is
/// no object becomes `{"include_usage":true}`.
fn with_usage(raw: &RawValue) -> Result<Vec<u8>, ApiError> {
    let mut out = Vec::from(&b"{"[..]);
    if let Ok(fields) = serde_json::from_str::<Fields>(raw.get()) {
        for (key, value) in fields.0.iter().filter(|(k, _)| k != "include_usage") {
            out.extend_from_slice(
                serde_json::to_string(key).map_err(|_| ApiError::internal())?.as_bytes(),
            );
            out.push(b':');
            out.extend_from_slice(value.get().as_bytes());
            out.push(b',');
        }
    }
    out.extend_from_slice(br#""include_usage":true}"#);
    Ok(out)
}

/// A JSON object's fields as their raw text, in order; a field repeated keeps its
/// first place and its last value, as a parsed object does.
struct Fields<'a>(Vec<(Cow<'a, str>, &'a RawValue)>);

impl<'de: 'a, 'a> Deserialize<'de> for Fields<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for V<'a> {
            type Value = Fields<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Fields<'a>, A::Error> {
                let mut fields: Vec<(Cow<'a, str>, &'a RawValue)> = Vec::new();
                let mut at: std::collections::HashMap<Cow<'a, str>, usize> =
                    std::collections::HashMap::new();
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    let value: &'de RawValue = map.next_value()?;
                    match at.get(&key) {
                        Some(&i) => fields[i].1 = value,
                        None => {
                            at.insert(key.clone(), fields.len());
                            fields.push((key, value));
                        }
                    }
                }
                Ok(Fields(fields))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn peek_reads_model_and_stream_only() {
        let h = HeaderMap::new();
        for affinity in [false, true] {
            let body = br#"{"model":"m","stream":true,"extra":{"kept":1},"prompt":"p"}"#;
            let p = peek(body, &h, affinity).unwrap();
            assert_eq!((p.model.as_str(), p.stream, p.affinity.is_some()), ("m", true, affinity));
            let p = peek(br#"{"model":"m","stream":"yes"}"#, &h, affinity).unwrap();
            assert!(!p.stream, "a stream that is not a boolean is not a stream");
            let missing = peek(br#"{"stream":true}"#, &h, affinity).unwrap();
            assert_eq!(missing.model, "", "left for the pool's only model");
            let wrong = peek(br#"{"model":5}"#, &h, affinity).unwrap_err();
            assert_eq!(wrong.param.as_deref(), Some("model"));
            // Broken JSON after the two fields is still refused, not skipped.
            assert_eq!(peek(br#"{"model":"m","x":[1,}"#, &h, affinity).unwrap_err().status(), 400);
            assert_eq!(peek(b"{", &h, affinity).unwrap_err().status(), 400);
            let many = peek(br#"{"model":"m","n":129}"#, &h, affinity).unwrap_err();
            assert_eq!((many.status(), many.param.as_deref()), (400, Some("n")));
            assert!(peek(br#"{"model":"m","n":128}"#, &h, affinity).is_ok());
        }
    }

    /// The rewritten body is what the old rewrite (the body built as JSON, then
    /// changed) gave, whatever the body holds.
    #[test]
    fn a_rewrite_changes_only_what_it_must() {
        let parsed = |b: &axum::body::Bytes| serde_json::from_slice::<Value>(b).unwrap();
        let body = |v: Value| axum::body::Bytes::from(v.to_string());
        let cases = [
            json!({"model": "alias", "x": [1, {"y": "z"}], "stream": true}),
            json!({"x": 1}),
            json!({"model": "a", "stream_options": {"other": [1], "include_usage": false}}),
            json!({"stream_options": [1, 2], "model": 7}),
            json!({"stream_options": null, "text": "é \"quoted\"\n"}),
            json!({}),
        ];
        for case in cases {
            for (model, ask) in [(Some("real"), false), (None, true), (Some("real"), true)] {
                let mut expected = case.clone();
                let object = expected.as_object_mut().unwrap();
                if let Some(model) = model {
                    object.insert("model".into(), json!(model));
                }
                if ask {
                    let options = object.entry("stream_options").or_insert_with(|| json!({}));
                    if !options.is_object() {
                        *options = json!({});
                    }
                    options["include_usage"] = json!(true);
                }
                let changes = Changes { model, ask_usage: ask, ..Changes::default() };
                let got = rewrite(&body(case.clone()), &changes).unwrap();
                assert_eq!(parsed(&got), expected, "{case} {model:?} {ask}");
            }
        }
        let repeated = axum::body::Bytes::from_static(br#"{"a":1,"model":"x","a":2}"#);
        let changes = Changes { model: Some("m"), ..Changes::default() };
        let got = rewrite(&repeated, &changes).unwrap();
        assert_eq!(&got[..], br#"{"a":2,"model":"m"}"#);
    }

    /// A key's salt is set, or salts the client's own; the client can never
    /// send a salt that reaches the backend unchanged.
    #[test]
    fn a_keys_salt_is_added_or_salts_the_clients() {
        let rewritten = |body: &'static [u8], isolate: bool| {
            let changes = Changes { salt: Some("k"), isolate, ..Changes::default() };
            assert!(changes.any(body) || !isolate && body == b"{}");
            let got = rewrite(&axum::body::Bytes::from_static(body), &changes).unwrap();
            serde_json::from_slice::<Value>(&got).unwrap()["cache_salt"].clone()
        };
        let salt_of = |body| rewritten(body, true);
        assert_eq!(salt_of(br#"{"model":"m"}"#), json!("k"));
        assert_eq!(rewritten(b"{}", false), Value::Null, "no salt without isolation");
        let shared = rewritten(br#"{"cache_salt":"user-1"}"#, false);
        let own = salt_of(br#"{"cache_salt":"user-1"}"#);
        assert!(own.as_str().is_some_and(|s| s.len() == 64 && s != "user-1"), "{own}");
        assert_ne!(own, salt_of(br#"{"cache_salt":"user-2"}"#));
        assert_eq!(own, salt_of(br#"{"cache_salt":"user-1"}"#), "stable");
        assert_eq!(own, shared, "isolated or not, a client's salt is salted by its key");
        // Whatever the backend would refuse, it still refuses.
        assert_eq!(salt_of(br#"{"cache_salt":""}"#), json!(""));
        assert_eq!(salt_of(br#"{"cache_salt":7}"#), json!(7));
        let none = rewrite(&axum::body::Bytes::from_static(b"{}"), &Changes::default()).unwrap();
        assert_eq!(&none[..], b"{}");
    }

    fn any_json() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            ".{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(5, 48, 5, |inner| {
            let key = prop::sample::select(vec![
                "model",
                "stream",
                "stream_options",
                "include_usage",
                "n",
                "prompt",
                "prompt_cache_key",
                "messages",
                "role",
                "content",
                "x",
            ]);
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::btree_map(key, inner, 0..5).prop_map(|m| {
                    Value::Object(m.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
                }),
            ]
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 1000, ..Default::default() })]
        /// Any body is read, and rewritten, without a panic; a rewrite is JSON.
        #[test]
        fn any_body_is_peeked_and_rewritten(body in any_json()) {
            let bytes = axum::body::Bytes::from(body.to_string());
            for affinity in [false, true] {
                let _ = peek(&bytes, &HeaderMap::new(), affinity);
            }
            if body.is_object() {
                let changes =
                    Changes { model: Some("m"), ask_usage: true, salt: Some("s"), isolate: true };
                let out = rewrite(&bytes, &changes).unwrap();
                proptest::prop_assert!(serde_json::from_slice::<Value>(&out).is_ok());
            }
        }
    }

    /// The key comes from the body's opening: the same conversation with later
    /// turns keeps it, another one does not.
    #[test]
    fn the_key_is_read_from_the_opening() {
        let h = HeaderMap::new();
        let turn1 = br#"{"model":"m","messages":[{"role":"user","content":"Paris?"}]}"#;
        let turn2 = br#"{"model":"m","messages":[{"role":"user","content":"Paris?"},
            {"role":"assistant","content":"A city."},{"role":"user","content":"Rome?"}]}"#;
        let other = br#"{"model":"m","messages":[{"role":"user","content":"Oslo?"}]}"#;
        let key = |body: &[u8]| peek(body, &h, true).unwrap().affinity;
        assert!(key(turn1).is_some());
        assert_eq!(key(turn1), key(turn2));
        assert_ne!(key(turn1), key(other));
    }
}
