//! A grammar's cost, bounded before llama.cpp sees it.
//!
//! llama.cpp compiles a grammar on the scheduler thread, once per choice, and
//! parts of that are unbounded: its parser recurses once per nested group (a
//! 100 000-deep group overflows the stack and aborts the engine), its
//! left-recursion check re-explores shared rules without a memo (60 rules
//! `aN ::= aN+1 "x" | aN+1 "y"` take 2^60 calls), and the parse stacks it keeps
//! for every leftmost derivation can be as many (the same grammar again, and
//! `anyOf` of two `$ref`s to one definition through a schema). So every grammar
//! is read here first, on the request's own thread, by a parser that builds the
//! same rules as llama.cpp's (`llama-grammar.cpp`, `llama_grammar_parser`), and
//! what llama.cpp would do with them is counted, with memos, against the limits
//! below. A grammar over a limit is the request's 400; one within them costs
//! llama.cpp a bounded amount of work.

mod leftmost;
mod parse;
mod stacks;

use std::collections::HashMap;

use leftmost::Leftmost;
use parse::Parser;
use stacks::stacks;

/// Groups nested in groups, at most (llama.cpp's parser recurses once per level).
pub const MAX_NESTING: usize = 64;
/// Elements of all rules together, after repetitions are written out.
pub const MAX_ELEMENTS: usize = 1 << 20;
/// Rules, named and synthesized (groups and repetitions make rules of their own).
pub const MAX_RULES: usize = 1 << 16;
/// Rules a leftmost derivation may pass through (llama.cpp's left-recursion check
/// recurses once per rule on it).
pub const MAX_DEPTH: usize = 512;
/// Calls llama.cpp's left-recursion check would make.
pub const MAX_CHECK_CALLS: u64 = 1_000_000;
/// Parse stacks one step of llama.cpp's matcher may hold: the leftmost derivations
/// from any point of the grammar. Each is matched against the vocabulary when a
/// drawn token breaks the grammar, and de-duplicated in quadratic time.
pub const MAX_STACKS: u64 = 1024;

/// llama.cpp's limit on written-out repetitions (`MAX_REPETITION_THRESHOLD`).
const MAX_REPETITION: u64 = 2000;

/// Why a grammar is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused(pub String);

/// One element of a rule, as llama.cpp stores it (a character set counts once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum El {
    /// End of the rule's last alternative.
    End,
    /// End of an alternative with another after it.
    Alt,
    /// A reference to rule number `.0`.
    Ref(u32),
    /// Anything matched against input: a character, a set, `.`, a token.
    Term,
}

/// Checks `text` (GBNF, root rule `root`) against every limit above.
pub fn check(text: &str) -> Result<(), Refused> {
    let rules = Parser::default().parse(text.as_bytes())?;
    let n = rules.rules.len();
    if n > MAX_RULES {
        return Err(Refused(format!("the grammar has {n} rules; at most {MAX_RULES} are allowed")));
    }
    if !rules.ids.contains_key("root") {
        return Err(Refused("the grammar has no `root` rule".into()));
    }
    for (name, &id) in &rules.ids {
        if rules.rules.get(id as usize).is_none_or(Vec::is_empty) {
            return Err(Refused(format!("the rule `{name}` is used but never defined")));
        }
    }
    let graph = Leftmost::of(&rules.rules);
    graph.check(&rules)?;
    stacks(&rules.rules)?;
    Ok(())
}

/// The rules as llama.cpp's parser makes them, and the names of the named ones.
#[derive(Default)]
struct Rules {
    rules: Vec<Vec<El>>,
    ids: HashMap<String, u32>,
    /// Elements in all rules so far.
    elements: usize,
}

impl Rules {
    /// The id of `name`, made on first use (`get_symbol_id`).
    fn symbol(&mut self, name: &[u8]) -> u32 {
        let next = self.ids.len() as u32;
        *self.ids.entry(String::from_utf8_lossy(name).into_owned()).or_insert(next)
    }

    /// A fresh id for a synthesized rule (`generate_symbol_id`): synthesized names
    /// carry a `_`, which no named rule can, so they never clash.
    fn synthesized(&mut self) -> u32 {
        let next = self.ids.len() as u32;
        self.ids.insert(format!("_{next}"), next);
        next
    }

    fn add(&mut self, id: u32, rule: Vec<El>) -> Result<(), Refused> {
        self.grow(rule.len())?;
        let id = id as usize;
        if self.rules.len() <= id {
            if id >= MAX_RULES {
                return Err(Refused(format!("the grammar has over {MAX_RULES} rules")));
            }
            self.rules.resize(id + 1, Vec::new());
        }
        self.rules[id] = rule;
        Ok(())
    }

    fn grow(&mut self, by: usize) -> Result<(), Refused> {
        self.elements = self.elements.saturating_add(by);
        if self.elements > MAX_ELEMENTS {
            return Err(Refused(format!(
                "the grammar is too large once its repetitions are written out \
                 (over {MAX_ELEMENTS} elements)"
            )));
        }
        Ok(())
    }
}

impl Rules {
    /// A rule's name for messages: its own, or the rule whose group made it.
    fn name(&self, id: usize) -> String {
        self.ids
            .iter()
            .find(|(_, &v)| v as usize == id)
            .map_or_else(|| format!("#{id}"), |(k, _)| k.clone())
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use proptest::prelude::*;
    use serde_json::json;

    use super::*;

    fn refused(grammar: &str) -> String {
        match check(grammar) {
            Err(Refused(why)) => why,
            Ok(()) => panic!("accepted: {grammar:.200}"),
        }
    }

    /// `aN ::= aN+1 "x" | aN+1 "y"`, `n` rules deep: 2^n leftmost derivations.
    fn doubling(n: usize) -> String {
        let mut g = String::from("root ::= a0\n");
        for i in 0..n {
            g.push_str(&format!("a{i} ::= a{} \"x\" | a{} \"y\"\n", i + 1, i + 1));
        }
        g.push_str(&format!("a{n} ::= \"z\"\n"));
        g
    }

    #[test]
    fn the_grammars_the_engine_makes_pass() {
        check(&super::super::gbnf::any_object()).unwrap();
        let schema = json!({
            "type": "object",
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 40},
                "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
                "when": {"type": "string", "format": "date-time"},
                "a": {"type": "integer"}, "b": {"type": "number"}, "c": {"type": "boolean"},
                "d": {"anyOf": [{"type": "string"}, {"type": "null"}]}
            },
            "required": ["name"]
        });
        check(&super::super::schema::to_gbnf(&schema).unwrap()).unwrap();
        check("root ::= [a-z]+ (\" \" [a-z]+){0,30} | \"x\"{2000}\n").unwrap();
        // Right recursion is ordinary, however long the chain.
        let mut chain = String::from("root ::= r0\n");
        for i in 0..2000 {
            chain.push_str(&format!("r{i} ::= \"x\" r{}\n", i + 1));
        }
        chain.push_str("r2000 ::= \"y\"\n");
        check(&chain).unwrap();
        check(&doubling(8)).unwrap();
    }

    #[test]
    fn exponential_leftmost_derivations_are_refused_at_once() {
        let started = Instant::now();
        let why = refused(&doubling(60));
        assert!(why.contains("steps"), "{why}");
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    /// The matcher's stacks are bounded on their own, whatever the check made of
    /// the grammar first.
    #[test]
    fn the_stacks_of_one_point_are_bounded() {
        let parsed = |g: &str| Parser::default().parse(g.as_bytes()).unwrap();
        stacks(&parsed(&doubling(9)).rules).unwrap();
        let Refused(why) = stacks(&parsed(&doubling(11)).rules).unwrap_err();
        assert!(why.contains("ways to go on"), "{why}");
        // Empty alternatives that lead to the same place count once.
        let optional = format!(
            "root ::= {}\"z\"\na ::= b | c\nb ::= \"\" | \"x\"\nc ::= \"\" | \"y\"",
            "a ".repeat(40)
        );
        check(&optional).unwrap();
    }

    #[test]
    fn deep_nesting_long_leftmost_chains_and_left_recursion_are_refused() {
        let deep = format!("root ::= {}\"a\"{}", "(".repeat(100_000), ")".repeat(100_000));
        assert!(refused(&deep).contains("nests"));
        let mut chain = String::from("root ::= r0\n");
        for i in 0..30_000 {
            chain.push_str(&format!("r{i} ::= r{} \"x\"\n", i + 1));
        }
        chain.push_str("r30000 ::= \"y\"\n");
        assert!(refused(&chain).contains("deep"));
        assert!(refused("root ::= root \"x\" | \"y\"").contains("left-recursive"));
        assert!(refused("root ::= a \"x\"\na ::= b\nb ::= root | \"y\"").contains("left-recursive"));
        // Hidden by an empty rule that llama.cpp's check does not follow.
        let hidden = "root ::= e root \"x\" | \"y\"\ne ::= f\nf ::= \"\" | \"z\"";
        assert!(refused(hidden).contains("left-recursive"), "{}", refused(hidden));
    }

    #[test]
    fn big_repetitions_and_bad_syntax_are_refused() {
        assert!(refused("root ::= \"a\"{2001}").contains("repetition"));
        assert!(refused("root ::= (\"a\"{0,100}){0,100}").contains("repetition"));
        check("root ::= (\"a\"{100}){100}").unwrap();
        assert!(refused("root ::= x").contains("never defined"));
        assert!(refused("rot ::= \"x\"").contains("root"));
        assert!(refused("root ::= \"x").contains("parse"));
        assert!(refused("root ::= [a-").contains("parse"));
        assert!(refused("root ::= \"\\q\"").contains("escape"));
        assert!(refused("").contains("no rules"));
    }

    #[test]
    fn a_ref_chain_through_a_schema_is_refused_before_its_grammar_is_built() {
        // anyOf of two $refs to the same definition: 60 deep is too deep for the
        // converter, 25 deep converts into a grammar of 2^25 derivations.
        let doubling = |n: usize| {
            let mut defs = serde_json::Map::new();
            for i in 0..n {
                let next = format!("#/$defs/d{}", i + 1);
                defs.insert(format!("d{i}"), json!({"anyOf": [{"$ref": next}, {"$ref": next}]}));
            }
            defs.insert(format!("d{n}"), json!({"type": "string"}));
            super::super::schema::to_gbnf(&json!({"$ref": "#/$defs/d0", "$defs": defs}))
        };
        assert!(doubling(60).unwrap_err().message.contains("deep"));
        let why = refused(&doubling(25).unwrap());
        assert!(why.contains("ways") || why.contains("steps"), "{why}");
        check(&doubling(4).unwrap()).unwrap();
        // A $ref chain 30 000 long.
        let mut defs = serde_json::Map::new();
        for i in 0..30_000 {
            defs.insert(format!("d{i}"), json!({"$ref": format!("#/$defs/d{}", i + 1)}));
        }
        defs.insert("d30000".into(), json!({"type": "string"}));
        let err = super::super::schema::to_gbnf(&json!({"$ref": "#/$defs/d0", "$defs": defs}))
            .unwrap_err();
        assert!(err.message.contains("deep"), "{err}");
    }

    /// GBNF pieces, shuffled: every input is read without a panic and within a
    /// time bound, whatever it is.
    fn piece() -> impl Strategy<Value = &'static str> {
        prop::sample::select(vec![
            "root",
            " ::= ",
            "a",
            "b",
            " ::= ",
            "\n",
            "(",
            ")",
            "|",
            "\"x\"",
            "\"",
            "[a-z]",
            "[^",
            "]",
            "*",
            "+",
            "?",
            "{2}",
            "{1,3}",
            "{3,}",
            "{",
            "}",
            ".",
            "<x>",
            "!<[1]>",
            "\\",
            "#c\n",
            " ",
            "a ::= a",
            "b ::= \"\" | a",
            "(((",
            ")))",
            "{2000}",
            "\u{e9}",
        ])
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]
        #[test]
        fn any_text_is_judged_quickly_without_a_panic(pieces in prop::collection::vec(piece(), 0..80)) {
            let text: String = pieces.concat();
            let started = Instant::now();
            let _ = check(&text);
            prop_assert!(started.elapsed() < Duration::from_millis(500));
        }

        #[test]
        fn any_bytes_are_judged_without_a_panic(text in ".{0,200}") {
            let _ = check(&text);
        }
    }
}
