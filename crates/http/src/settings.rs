//! The start both binaries' settings share: their defaults, then the TOML file
//! named by `--config`, as figment layers; the environment and the flags go on
//! top in each binary, which know their own.

use std::path::Path;

use figment::providers::{Format, Serialized, Toml};
use figment::Figment;
use serde::Serialize;

/// `defaults`, with the TOML file at `file` merged over them; a `file` that is
/// not a readable file is an error naming it.
pub fn defaults_and_file<T: Serialize>(
    defaults: &T,
    file: Option<&Path>,
) -> Result<Figment, String> {
    let figment = Figment::from(Serialized::defaults(defaults));
    match file {
        None => Ok(figment),
        Some(path) if path.is_file() => Ok(figment.merge(Toml::file(path))),
        Some(path) => Err(format!("config: {} is not a readable file", path.display())),
    }
}

/// The top-level keys of `T`, as its default value serializes: derived from
/// the type, so that a new field is never missing from a list kept by hand.
pub fn field_names<T: Serialize + Default>() -> Vec<String> {
    match serde_json::to_value(T::default()) {
        Ok(serde_json::Value::Object(fields)) => fields.into_iter().map(|(key, _)| key).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize, Default)]
    struct Two {
        one: u32,
        maybe: Option<String>,
    }

    #[test]
    fn every_field_is_named_and_a_missing_file_is_refused() {
        let mut names = field_names::<Two>();
        names.sort();
        assert_eq!(names, ["maybe", "one"]);
        let missing = defaults_and_file(&Two::default(), Some(Path::new("/nonexistent.toml")));
        assert!(missing.unwrap_err().contains("/nonexistent.toml"));
        let figment = defaults_and_file(&Two { one: 7, maybe: None }, None).unwrap();
        assert_eq!(figment.extract_inner::<u32>("one").unwrap(), 7);
    }
}
