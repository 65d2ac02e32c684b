//! `logit_bias` in every form clients send. OpenAI's routes take OpenAI's
//! form only, a map from token ids (as strings) to biases from -100 to 100;
//! llama-server's `/completion` takes its own forms besides: map keys that are
//! text (each token of the text gets the bias), and `[[id or text, bias], ...]`
//! pairs, where a bias of `false` bans the token and `true` leaves it alone.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::ApiError;

/// Entries at most: each is a token (or a text) checked and biased.
pub const MAX_LOGIT_BIAS: usize = 1024;
/// Bytes of a text entry at most: each is tokenized.
pub const MAX_BIAS_TEXT: usize = 256;
/// Tokens biased at most once the texts are tokenized: the sampler goes over
/// each of them at every step of every choice.
pub const MAX_BIASED_TOKENS: usize = 4096;

/// A request's `logit_bias`, as sent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LogitBias {
    /// `{"50256": -100}`, or llama-server's `{" the": -100}`.
    Map(BTreeMap<String, Bias>),
    /// llama-server's `[[50256, -100], [" the", false]]`.
    Pairs(Vec<(Target, Bias)>),
}

/// What an entry biases.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Target {
    /// A token id.
    Id(u32),
    /// Each token of a text.
    Text(String),
}

/// By how much.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Bias {
    /// Added to the token's logit.
    Value(f32),
    /// llama-server's `false`: never sampled; `true`: no bias.
    Allowed(bool),
}

/// A bias resolved: added to the logit, `-inf` for a ban.
pub type Resolved<T> = Vec<(T, f32)>;

impl LogitBias {
    /// Each entry, map keys that are numbers read as ids.
    fn entries(&self) -> Vec<(Target, Bias)> {
        match self {
            Self::Map(map) => map
                .iter()
                .map(|(k, v)| (k.parse().map_or_else(|_| Target::Text(k.clone()), Target::Id), *v))
                .collect(),
            Self::Pairs(pairs) => pairs.clone(),
        }
    }

    fn len(&self) -> usize {
        match self {
            Self::Map(map) => map.len(),
            Self::Pairs(pairs) => pairs.len(),
        }
    }

    /// Checks OpenAI's form: token ids, biases from -100 to 100.
    pub fn check_openai(&self) -> Result<(), ApiError> {
        let Self::Map(map) = self else {
            return Err(invalid("logit_bias must be an object from token ids to biases"));
        };
        self.check_size()?;
        for (token, bias) in map {
            if token.parse::<u32>().is_err() {
                return Err(invalid(format!("logit_bias keys must be token ids, got `{token}`")));
            }
            check_value(*bias, token)?;
        }
        Ok(())
    }

    /// Checks llama-server's forms: ids or texts of at most
    /// [`MAX_BIAS_TEXT`] bytes, numbers from -100 to 100 or booleans.
    pub fn check_llama_server(&self) -> Result<(), ApiError> {
        self.check_size()?;
        for (target, bias) in self.entries() {
            let name = match &target {
                Target::Id(id) => id.to_string(),
                Target::Text(text) if text.is_empty() || text.len() > MAX_BIAS_TEXT => {
                    return Err(invalid(format!(
                        "logit_bias texts must be 1 to {MAX_BIAS_TEXT} bytes, got {}",
                        text.len()
                    )))
                }
                Target::Text(text) => format!("`{text}`"),
            };
            if let Bias::Value(_) = bias {
                check_value(bias, &name)?;
            }
        }
        Ok(())
    }

    fn check_size(&self) -> Result<(), ApiError> {
        if self.len() > MAX_LOGIT_BIAS {
            return Err(invalid(format!(
                "logit_bias must hold at most {MAX_LOGIT_BIAS} entries, got {}",
                self.len()
            )));
        }
        Ok(())
    }

    /// The entries that bias token ids, and those that bias texts, with
    /// their biases (`true` entries dropped).
    pub fn resolve(&self) -> (Resolved<i32>, Resolved<String>) {
        let (mut ids, mut texts) = (Vec::new(), Vec::new());
        for (target, bias) in self.entries() {
            let value = match bias {
                Bias::Value(v) => v,
                Bias::Allowed(false) => f32::NEG_INFINITY,
                Bias::Allowed(true) => continue,
            };
            match target {
                Target::Id(id) => ids.push((i32::try_from(id).unwrap_or(i32::MAX), value)),
                Target::Text(text) => texts.push((text, value)),
            }
        }
        (ids, texts)
    }
}

fn check_value(bias: Bias, token: &str) -> Result<(), ApiError> {
    match bias {
        Bias::Value(v) if (-100.0..=100.0).contains(&v) => Ok(()),
        Bias::Value(v) => Err(invalid(format!(
            "logit_bias values must be between -100 and 100, got {v} for token {token}"
        ))),
        Bias::Allowed(_) => Err(invalid(format!(
            "logit_bias values must be numbers between -100 and 100, got a boolean for token {token}"
        ))),
    }
}

fn invalid(message: impl Into<String>) -> ApiError {
    ApiError::invalid("logit_bias", message)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn bias(value: serde_json::Value) -> LogitBias {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn openai_routes_take_token_ids_only() {
        assert!(bias(json!({"50256": -100, "7": 2.5})).check_openai().is_ok());
        for refused in [json!({"abc": 1}), json!({"5": 101}), json!([[5, -1]]), json!({"5": false})]
        {
            let err = bias(refused.clone()).check_openai().unwrap_err();
            assert_eq!(err.param.as_deref(), Some("logit_bias"), "{refused}");
        }
    }

    #[test]
    fn llama_servers_forms_resolve_to_ids_and_texts() {
        let pairs = bias(json!([[5, -100], [" the", false], ["x", true], [9, 3]]));
        assert!(pairs.check_llama_server().is_ok());
        let (ids, texts) = pairs.resolve();
        assert_eq!(ids, [(5, -100.0), (9, 3.0)]);
        assert_eq!(texts, [(" the".to_owned(), f32::NEG_INFINITY)]);
        let map = bias(json!({" the": -100, "12": 1}));
        assert!(map.check_llama_server().is_ok());
        assert_eq!(map.resolve(), (vec![(12, 1.0)], vec![(" the".to_owned(), -100.0)]));
        let long = "x".repeat(MAX_BIAS_TEXT + 1);
        assert!(bias(json!({ long: 1 })).check_llama_server().is_err());
        assert!(bias(json!([["", 1]])).check_llama_server().is_err());
        assert!(bias(json!([[1, 500]])).check_llama_server().is_err());
        let many: BTreeMap<String, i32> =
            (0..=MAX_LOGIT_BIAS).map(|i| (i.to_string(), 1)).collect();
        assert!(bias(json!(many)).check_llama_server().is_err());
    }
}
