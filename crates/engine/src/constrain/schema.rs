//! JSON Schema to a GBNF grammar (llama.cpp's grammar language), for structured
//! output and tool arguments.
//!
//! Written here rather than through llama.cpp's converter so that a schema it
//! cannot enforce is refused with the keyword and the place named (llama.cpp's,
//! behind the C shim, only says that it failed). Every output the grammar allows
//! validates against the schema; the converse need not hold: objects carry only
//! their declared properties, in the declared order, and whitespace is at most one
//! space, which also keeps a small model from wandering off into blank lines.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value};

use super::gbnf::{group, literal, sanitize, PRIMITIVES};

/// A schema, or a part of it, that the converter cannot enforce.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaError {
    /// Where, as a dotted path from the schema's root (`properties.age`).
    pub path: String,
    /// What is wrong there.
    pub message: String,
}

impl std::fmt::Display for SchemaError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "at `{}`: {}", self.path, self.message)
        }
    }
}

/// Keywords that constrain a value in ways this converter does not enforce: a
/// schema that uses one is refused rather than quietly loosened.
const UNSUPPORTED: &[&str] = &[
    "pattern",
    "patternProperties",
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "uniqueItems",
    "contains",
    "minContains",
    "maxContains",
    "minProperties",
    "maxProperties",
    "propertyNames",
    "unevaluatedProperties",
    "unevaluatedItems",
    "maximum",
    "exclusiveMaximum",
    "multipleOf",
    "prefixItems",
];

/// Schemas nested in schemas, `$ref`s followed included, at most: the converter
/// recurses once per level, and a `$ref` chain is as deep as it is long however
/// flat its JSON is.
pub const MAX_SCHEMA_DEPTH: usize = 64;

/// The grammar whose root rule matches JSON valid against `schema`.
pub fn to_gbnf(schema: &Value) -> Result<String, SchemaError> {
    let mut builder =
        Builder { root: schema, rules: BTreeMap::new(), refs: BTreeSet::new(), depth: 0 };
    let body = builder.visit(schema, "")?;
    Ok(builder.finish(&body))
}

/// A GBNF literal matching `value` written as compact JSON.
fn json_literal(value: &Value) -> String {
    literal(&value.to_string())
}

struct Builder<'a> {
    root: &'a Value,
    /// Named rules made so far, by name.
    rules: BTreeMap<String, String>,
    /// `$ref`s whose rule is made or being made (recursion ends at the name).
    refs: BTreeSet<String>,
    /// How deep `visit` is now.
    depth: usize,
}

impl Builder<'_> {
    fn finish(self, root: &str) -> String {
        let mut out = format!("root ::= {root}\n");
        for (name, body) in &self.rules {
            out.push_str(&format!("{name} ::= {body}\n"));
        }
        out.push_str(PRIMITIVES);
        out
    }

    /// An expression matching values valid against `schema`, found at `path`.
    fn visit(&mut self, schema: &Value, path: &str) -> Result<String, SchemaError> {
        if self.depth >= MAX_SCHEMA_DEPTH {
            return Err(SchemaError {
                path: path.to_owned(),
                message: format!(
                    "the schema nests (or follows `$ref`s) over {MAX_SCHEMA_DEPTH} levels deep"
                ),
            });
        }
        self.depth += 1;
        let result = self.visit_within(schema, path);
        self.depth -= 1;
        result
    }

    fn visit_within(&mut self, schema: &Value, path: &str) -> Result<String, SchemaError> {
        let err = |message: String| SchemaError { path: path.to_owned(), message };
        let map = match schema {
            Value::Bool(true) => return Ok("value".into()),
            Value::Bool(false) => return Err(err("`false` allows no value at all".into())),
            Value::Object(map) => map,
            _ => return Err(err("a schema must be an object or a boolean".into())),
        };
        if let Some(keyword) = UNSUPPORTED.iter().find(|k| map.contains_key(**k)) {
            return Err(err(format!("`{keyword}` cannot be enforced by a grammar here")));
        }
        if let Some(target) = map.get("$ref") {
            return self.reference(target, path);
        }
        if let Some(value) = map.get("const") {
            return Ok(json_literal(value));
        }
        if let Some(values) = map.get("enum") {
            let values = values.as_array().ok_or_else(|| err("`enum` must be an array".into()))?;
            if values.is_empty() {
                return Err(err("an empty `enum` allows no value".into()));
            }
            let alternatives: Vec<String> = values.iter().map(json_literal).collect();
            return Ok(group(&alternatives));
        }
        for keyword in ["anyOf", "oneOf"] {
            if let Some(options) = map.get(keyword) {
                // oneOf is read as anyOf: the grammar cannot exclude a value that
                // matches two branches, which well-formed tool schemas never have.
                let options = options
                    .as_array()
                    .filter(|o| !o.is_empty())
                    .ok_or_else(|| err(format!("`{keyword}` must be a non-empty array")))?;
                let mut alternatives = Vec::with_capacity(options.len());
                for (i, option) in options.iter().enumerate() {
                    alternatives.push(self.visit(option, &join(path, &format!("{keyword}.{i}")))?);
                }
                return Ok(self.nullable(map, group(&alternatives)));
            }
        }
        if let Some(all) = map.get("allOf") {
            return match all.as_array().map(Vec::as_slice) {
                Some([only]) => self.visit(only, &join(path, "allOf.0")),
                _ => Err(err("`allOf` with more than one schema is not supported".into())),
            };
        }
        let body = match map.get("type") {
            None if map.contains_key("properties") => self.object(map, path)?,
            None if map.contains_key("items") => self.array(map, path)?,
            None => "value".into(),
            Some(Value::String(kind)) => self.typed(kind, map, path)?,
            Some(Value::Array(kinds)) => {
                let mut alternatives = Vec::with_capacity(kinds.len());
                for kind in kinds {
                    let kind = kind.as_str().ok_or_else(|| err("`type` lists strings".into()))?;
                    alternatives.push(self.typed(kind, map, path)?);
                }
                group(&alternatives)
            }
            Some(_) => return Err(err("`type` must be a string or an array of strings".into())),
        };
        Ok(self.nullable(map, body))
    }

    /// OpenAPI's `nullable: true`, which OpenAI's own schemas use.
    fn nullable(&self, map: &Map<String, Value>, body: String) -> String {
        if map.get("nullable") == Some(&Value::Bool(true)) {
            format!("({body} | null)")
        } else {
            body
        }
    }

    fn typed(
        &mut self,
        kind: &str,
        map: &Map<String, Value>,
        path: &str,
    ) -> Result<String, SchemaError> {
        let err = |message: String| SchemaError { path: path.to_owned(), message };
        Ok(match kind {
            "object" => self.object(map, path)?,
            "array" => self.array(map, path)?,
            "string" => string(map).map_err(err)?,
            "integer" => if non_negative(map).map_err(err)? { "uint" } else { "int" }.into(),
            "number" => if non_negative(map).map_err(err)? { "unumber" } else { "number" }.into(),
            "boolean" => "boolean".into(),
            "null" => "null".into(),
            other => return Err(err(format!("unknown type `{other}`"))),
        })
    }

    /// An object with its declared properties, the required ones always present,
    /// in declaration order; without declared properties, any object (or, with an
    /// `additionalProperties` schema, an object of such values).
    fn object(&mut self, map: &Map<String, Value>, path: &str) -> Result<String, SchemaError> {
        let err = |message: String| SchemaError { path: path.to_owned(), message };
        let properties = match map.get("properties") {
            None => None,
            Some(Value::Object(p)) => Some(p),
            Some(_) => return Err(err("`properties` must be an object".into())),
        };
        let required: Vec<&str> = match map.get("required") {
            None => Vec::new(),
            Some(Value::Array(names)) => names.iter().filter_map(Value::as_str).collect(),
            Some(_) => return Err(err("`required` must be an array of names".into())),
        };
        let Some(properties) = properties.filter(|p| !p.is_empty()) else {
            if let Some(name) = required.first() {
                return Err(err(format!("`{name}` is required but has no schema in `properties`")));
            }
            return Ok(match map.get("additionalProperties") {
                Some(Value::Object(values)) if !values.is_empty() => {
                    let value = self.visit(
                        &Value::Object(values.clone()),
                        &join(path, "additionalProperties"),
                    )?;
                    let pair = format!("string ws \":\" ws {value} ws");
                    format!("\"{{\" ws ({pair} (\",\" ws {pair})*)? \"}}\"")
                }
                Some(Value::Bool(false)) => "\"{\" ws \"}\"".into(),
                _ => "object".into(),
            });
        };
        if let Some(name) = required.iter().find(|n| !properties.contains_key(**n)) {
            return Err(err(format!("`{name}` is required but has no schema in `properties`")));
        }
        let mut pairs = Vec::with_capacity(properties.len());
        for (name, schema) in properties {
            let value = self.visit(schema, &join(path, &format!("properties.{name}")))?;
            let pair =
                format!("{} ws \":\" ws {value} ws", json_literal(&Value::String(name.clone())));
            pairs.push((pair, required.contains(&name.as_str())));
        }
        let rule = self.name(path, "obj");
        let (mandatory, optional): (Vec<_>, Vec<_>) = pairs.into_iter().partition(|(_, r)| *r);
        let mandatory: Vec<String> = mandatory.into_iter().map(|(p, _)| p).collect();
        let optional: Vec<String> = optional.into_iter().map(|(p, _)| p).collect();
        // The optional properties as a chain of rules: `tail(i)` is any in-order
        // selection of optional properties from i on, at least one.
        let mut tail = None;
        for (i, pair) in optional.iter().enumerate().rev() {
            let name = format!("{rule}-opt{i}");
            let body = match &tail {
                None => pair.clone(),
                Some(next) => format!("{pair} (\",\" ws {next})? | {next}"),
            };
            self.rules.insert(name.clone(), body);
            tail = Some(name);
        }
        let body = match (mandatory.is_empty(), tail) {
            (true, None) => String::new(),
            (true, Some(tail)) => format!("({tail})?"),
            (false, None) => mandatory.join(" \",\" ws "),
            (false, Some(tail)) => format!("{} (\",\" ws {tail})?", mandatory.join(" \",\" ws ")),
        };
        self.rules.insert(rule.clone(), format!("\"{{\" ws {body} \"}}\""));
        Ok(rule)
    }

    fn array(&mut self, map: &Map<String, Value>, path: &str) -> Result<String, SchemaError> {
        let err = |message: String| SchemaError { path: path.to_owned(), message };
        if let Some(Value::Array(tuple)) = map.get("items") {
            // Drafts 4 to 7's tuple: exactly these items, as llama.cpp's
            // converter reads it, valid whatever `additionalItems` says.
            let items = tuple
                .iter()
                .enumerate()
                .map(|(i, s)| self.visit(s, &join(path, &format!("items[{i}]"))))
                .collect::<Result<Vec<_>, _>>()?;
            return Ok(format!("(\"[\" ws {} ws \"]\")", items.join(" ws \",\" ws ")));
        }
        let item = match map.get("items") {
            None => "value".to_owned(),
            Some(items) => self.visit(items, &join(path, "items"))?,
        };
        let min = count(map, "minItems").map_err(err)?.unwrap_or(0);
        let max = count(map, "maxItems").map_err(err)?;
        if max.is_some_and(|max| max < min) {
            return Err(err("`maxItems` is below `minItems`".into()));
        }
        let more = format!("\",\" ws {item} ws");
        let body = match (min, max) {
            (_, Some(0)) => String::new(),
            (0, None) => format!("({item} ws ({more})*)?"),
            (0, Some(max)) => format!("({item} ws ({more}){{0,{}}})?", max - 1),
            (min, None) => format!("{item} ws ({more}){{{},}}", min - 1),
            (min, Some(max)) => format!("{item} ws ({more}){{{},{}}}", min - 1, max - 1),
        };
        Ok(format!("(\"[\" ws {body} \"]\")"))
    }

    /// The rule of a `$ref` into this schema (`#/$defs/...`, `#/definitions/...`).
    fn reference(&mut self, target: &Value, path: &str) -> Result<String, SchemaError> {
        let err = |message: String| SchemaError { path: path.to_owned(), message };
        let target = target.as_str().ok_or_else(|| err("`$ref` must be a string".into()))?;
        let pointer = target
            .strip_prefix('#')
            .ok_or_else(|| err(format!("`$ref` `{target}` is not inside this schema")))?;
        let name = format!("ref-{}", sanitize(pointer));
        if self.refs.insert(name.clone()) {
            let schema = self
                .root
                .pointer(pointer)
                .ok_or_else(|| err(format!("`$ref` `{target}` points at nothing")))?;
            let body = self.visit(schema, &pointer.trim_start_matches('/').replace('/', "."))?;
            self.rules.insert(name.clone(), body);
        }
        Ok(name)
    }

    /// A rule name for the schema at `path`, unused so far.
    fn name(&self, path: &str, kind: &str) -> String {
        let base =
            if path.is_empty() { kind.to_owned() } else { format!("{kind}-{}", sanitize(path)) };
        let mut name = base.clone();
        let mut n = 1;
        while self.rules.contains_key(&name) {
            n += 1;
            name = format!("{base}{n}");
        }
        name
    }
}

/// A string, with its length limits or its format.
fn string(map: &Map<String, Value>) -> Result<String, String> {
    if let Some(format) = map.get("format").and_then(Value::as_str) {
        let rule = match format {
            "date" => "date",
            "time" => "time",
            "date-time" => "date \"T\" time",
            "uuid" => "uuid",
            other => return Err(format!("string format `{other}` cannot be enforced here")),
        };
        return Ok(format!("(\"\\\"\" {rule} \"\\\"\")"));
    }
    let min = count(map, "minLength")?.unwrap_or(0);
    let max = count(map, "maxLength")?;
    Ok(match (min, max) {
        (0, None) => "string".into(),
        (min, None) => format!("(\"\\\"\" char{{{min},}} \"\\\"\")"),
        (min, Some(max)) if max >= min => format!("(\"\\\"\" char{{{min},{max}}} \"\\\"\")"),
        _ => return Err("`maxLength` is below `minLength`".into()),
    })
}

/// Whether a number's lower bound keeps it at zero or above. Only `minimum: 0`
/// is enforced (no minus sign); other bounds are refused, as a grammar cannot
/// compare magnitudes.
fn non_negative(map: &Map<String, Value>) -> Result<bool, String> {
    if let Some(bound) = map.get("exclusiveMinimum") {
        return Err(format!(
            "`exclusiveMinimum: {bound}` cannot be enforced here (only `minimum: 0`)"
        ));
    }
    match map.get("minimum") {
        None => Ok(false),
        Some(bound) if bound.as_f64() == Some(0.0) => Ok(true),
        Some(bound) => {
            Err(format!("`minimum: {bound}` cannot be enforced here (only `minimum: 0`)"))
        }
    }
}

/// A non-negative integer keyword, if present.
fn count(map: &Map<String, Value>, keyword: &str) -> Result<Option<u64>, String> {
    match map.get(keyword) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("`{keyword}` must be a non-negative integer")),
    }
}

/// `part` below `path`, as a dotted path.
fn join(path: &str, part: &str) -> String {
    if path.is_empty() {
        part.to_owned()
    } else {
        format!("{path}.{part}")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn root(schema: Value) -> String {
        let grammar = to_gbnf(&schema).unwrap();
        grammar.lines().next().unwrap().to_owned()
    }

    #[test]
    fn required_properties_come_first_and_optional_ones_may_be_left_out() {
        let schema = json!({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 8},
            "age": {"type": "integer", "minimum": 0},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}
        }, "required": ["age"]});
        let grammar = to_gbnf(&schema).unwrap();
        assert!(grammar.starts_with("root ::= obj\n"), "{grammar}");
        let rule = |name: &str| {
            grammar
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ::= ")))
                .unwrap()
                .to_owned()
        };
        assert_eq!(rule("obj"), r#""{" ws "\"age\"" ws ":" ws uint ws ("," ws obj-opt0)? "}""#);
        assert_eq!(
            rule("obj-opt0"),
            r#""\"name\"" ws ":" ws ("\"" char{0,8} "\"") ws ("," ws obj-opt1)? | obj-opt1"#
        );
        assert_eq!(
            rule("obj-opt1"),
            r#""\"tags\"" ws ":" ws ("[" ws (("\"a\"" | "\"b\"") ws ("," ws ("\"a\"" | "\"b\"") ws){0,1})? "]") ws"#
        );
    }

    #[test]
    fn references_types_and_nullables() {
        let schema = json!({
            "$defs": {"Node": {"type": "object", "properties": {
                "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}}}},
            "$ref": "#/$defs/Node"
        });
        let grammar = to_gbnf(&schema).unwrap();
        assert!(grammar.starts_with("root ::= ref-defs-Node\n"), "{grammar}");
        assert!(grammar.contains("ref-defs-Node ::= obj-defs-Node\n"), "{grammar}");
        assert!(
            grammar.contains("(ref-defs-Node | null)"),
            "recursion ends at the name: {grammar}"
        );
        assert_eq!(root(json!({"type": ["string", "null"]})), "root ::= (string | null)");
        assert_eq!(root(json!({"type": "number", "nullable": true})), "root ::= (number | null)");
        assert_eq!(root(json!({"const": "x\"y"})), r#"root ::= "\"x\\\"y\"""#);
        assert_eq!(root(json!({})), "root ::= value");
        // The tuple form of `items`: exactly those items, in order.
        assert_eq!(
            root(json!({"items": [{"type": "integer"}, {"const": "x"}]})),
            r#"root ::= ("[" ws int ws "," ws "\"x\"" ws "]")"#
        );
        assert_eq!(
            root(json!({"type": "string", "format": "date"})),
            r#"root ::= ("\"" date "\"")"#
        );
    }

    #[test]
    fn what_cannot_be_enforced_is_refused_with_its_place() {
        let cases = [
            (json!({"type": "string", "pattern": "^a+$"}), "", "`pattern`"),
            (
                json!({"type": "object", "properties": {"n": {"type": "integer", "maximum": 9}}}),
                "properties.n",
                "`maximum`",
            ),
            (
                json!({"properties": {"when": {"type": "string", "format": "email"}}}),
                "properties.when",
                "`email`",
            ),
            (json!({"type": "object", "required": ["x"], "properties": {"y": {}}}), "", "`x`"),
            (json!({"$ref": "#/$defs/Missing"}), "", "points at nothing"),
            (json!({"type": "array", "items": {"type": "integr"}}), "items", "`integr`"),
            (json!({"type": "integer", "minimum": 3}), "", "`minimum: 3`"),
            (json!(false), "", "no value"),
        ];
        for (schema, path, needle) in cases {
            let err = to_gbnf(&schema).unwrap_err();
            assert_eq!(err.path, path, "{schema}: {err}");
            assert!(err.message.contains(needle), "{schema}: {err}");
        }
    }
}
