//! JSON read without building what the gateway does not use: a field that
//! should hold a scalar keeps it, and a list or object there (which no valid
//! request has) is checked to be JSON and skipped. Built as `serde_json::Value`,
//! a 16 MiB body of nested junk under a known field took over a gigabyte.

use std::fmt;

use serde::de::{self, value::MapAccessDeserializer, value::SeqAccessDeserializer, IgnoredAny};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// A scalar field: its value, or `null` where a list or object was.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scalar(pub Value);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ScalarVisitor)
    }
}

struct ScalarVisitor;

impl<'de> de::Visitor<'de> for ScalarVisitor {
    type Value = Scalar;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Scalar, E> {
        Ok(Scalar(Value::Bool(v)))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar(Value::from(v)))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Scalar, E> {
        Ok(Scalar(Value::from(v)))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Scalar, E> {
        Ok(Scalar(Value::from(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Scalar, E> {
        Ok(Scalar(Value::String(v.to_owned())))
    }
    fn visit_string<E>(self, v: String) -> Result<Scalar, E> {
        Ok(Scalar(Value::String(v)))
    }
    fn visit_unit<E>(self) -> Result<Scalar, E> {
        Ok(Scalar(Value::Null))
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<Scalar, A::Error> {
        IgnoredAny::deserialize(SeqAccessDeserializer::new(seq))?;
        Ok(Scalar(Value::Null))
    }
    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<Scalar, A::Error> {
        IgnoredAny::deserialize(MapAccessDeserializer::new(map))?;
        Ok(Scalar(Value::Null))
    }
}

/// `stream_options`: only `include_usage` is read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StreamOptions {
    /// `include_usage`, when it is there.
    pub include_usage: Option<Value>,
}

impl<'de> Deserialize<'de> for StreamOptions {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> de::Visitor<'de> for V {
            type Value = StreamOptions;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("stream options")
            }
            fn visit_map<A: de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<StreamOptions, A::Error> {
                let mut out = StreamOptions::default();
                while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
                    if key == "include_usage" {
                        out.include_usage = Some(map.next_value::<Scalar>()?.0);
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(out)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, seq: A) -> Result<StreamOptions, A::Error> {
                IgnoredAny::deserialize(SeqAccessDeserializer::new(seq))?;
                Ok(StreamOptions::default())
            }
            fn visit_bool<E>(self, _: bool) -> Result<StreamOptions, E> {
                Ok(StreamOptions::default())
            }
            fn visit_i64<E>(self, _: i64) -> Result<StreamOptions, E> {
                Ok(StreamOptions::default())
            }
            fn visit_u64<E>(self, _: u64) -> Result<StreamOptions, E> {
                Ok(StreamOptions::default())
            }
            fn visit_f64<E>(self, _: f64) -> Result<StreamOptions, E> {
                Ok(StreamOptions::default())
            }
            fn visit_str<E>(self, _: &str) -> Result<StreamOptions, E> {
                Ok(StreamOptions::default())
            }
            fn visit_unit<E>(self) -> Result<StreamOptions, E> {
                Ok(StreamOptions::default())
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_are_kept_and_lists_and_objects_skipped() {
        let read = |text: &str| serde_json::from_str::<Scalar>(text).unwrap().0;
        assert_eq!(read(r#""m""#), Value::from("m"));
        assert_eq!(read("true"), Value::Bool(true));
        assert_eq!(read("3"), Value::from(3));
        assert_eq!(read("[[1, 2], {\"a\": [3]}]"), Value::Null);
        assert!(serde_json::from_str::<Scalar>("[1,").is_err(), "still checked to be JSON");
        let options: StreamOptions =
            serde_json::from_str(r#"{"junk": [[1]], "include_usage": true}"#).unwrap();
        assert_eq!(options.include_usage, Some(Value::Bool(true)));
        let options: StreamOptions = serde_json::from_str("[1, 2]").unwrap();
        assert_eq!(options.include_usage, None);
    }
}
