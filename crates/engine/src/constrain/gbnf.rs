//! Pieces of GBNF text (llama.cpp's grammar language): the rules every grammar
//! shares, literals, alternatives and rule names.

/// The rules every grammar shares: any JSON value, compact.
pub const PRIMITIVES: &str = r#"ws ::= " "?
char ::= [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
string ::= "\"" char* "\""
int ::= "-"? ([0-9] | [1-9] [0-9]{1,15})
uint ::= [0-9] | [1-9] [0-9]{1,15}
number ::= int ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?
unumber ::= uint ("." [0-9]{1,16})? ([eE] [-+]? [0-9]{1,3})?
boolean ::= "true" | "false"
null ::= "null"
value ::= object | array | string | number | boolean | null
object ::= "{" ws (string ws ":" ws value ws ("," ws string ws ":" ws value ws)*)? "}"
array ::= "[" ws (value ws ("," ws value ws)*)? "]"
date ::= [0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [1-2] [0-9] | "3" [0-1])
time ::= ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])
hex ::= [0-9a-fA-F]
uuid ::= hex{8} "-" hex{4} "-" hex{4} "-" hex{4} "-" hex{12}
"#;

/// The grammar of any JSON object (`response_format: json_object`).
pub fn any_object() -> String {
    format!("root ::= object\n{PRIMITIVES}")
}

/// A GBNF string literal matching exactly `text`.
pub fn literal(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\x{:02X}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Alternatives as one expression, in parentheses when there are several.
pub fn group(alternatives: &[String]) -> String {
    if alternatives.len() == 1 {
        alternatives[0].clone()
    } else {
        format!("({})", alternatives.join(" | "))
    }
}

/// `text` as a rule name: letters, digits and dashes.
pub fn sanitize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c);
        } else if !out.ends_with('-') {
            out.push('-');
        }
    }
    out.trim_matches('-').to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_escape_what_gbnf_reads_specially() {
        assert_eq!(literal("a\"b\\c\nd"), r#""a\"b\\c\nd""#);
        assert_eq!(literal("\u{1}"), r#""\x01""#);
        assert_eq!(sanitize("/$defs/My Thing"), "defs-My-Thing");
    }
}
