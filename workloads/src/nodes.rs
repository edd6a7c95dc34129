//! A small YAML file (a sweep, a generator spec) as a tree of nodes, each with its
//! line, so that every message can name the key and the line it is about.
//!
//! `serde_yaml` (which the device profiles use) gives a line only for the errors it
//! finds itself; the errors of a sweep or a generator spec are mostly found later (an
//! unknown option, a value a policy or generator does not take), so the file is read
//! with `saphyr-parser`'s events, as the trace reader does, into nodes that keep their
//! place. The one reader of such files: `sim`'s sweeps and the generator specs
//! ([`crate::generate::spec`]) both go through [`parse`].

use saphyr_parser::{Event, Parser, ScalarStyle};

/// Deepest nesting read: a sweep file or a generator spec is three or four levels deep;
/// the bound keeps a hostile file from exhausting the stack.
const MAX_NESTING: usize = 32;

/// A YAML node and its line (1-based).
#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// The line its first token is on (1-based).
    pub line: usize,
    /// What it holds.
    pub value: Value,
}

/// A node's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A scalar and whether it was plain (unquoted, untagged): only a plain scalar can
    /// be a null, a boolean or a number.
    Scalar {
        /// The text, as read (quotes and escapes resolved).
        text: String,
        /// Whether it was written plain.
        plain: bool,
    },
    /// A sequence.
    Seq(Vec<Node>),
    /// A mapping, its entries in the order written.
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// Whether this is `null`, `~` or nothing.
    pub fn is_null(&self) -> bool {
        matches!(&self.value, Value::Scalar { text, plain: true }
            if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL"))
    }

    /// The scalar's text, if this is a scalar.
    pub fn scalar(&self) -> Option<&str> {
        match &self.value {
            Value::Scalar { text, .. } => Some(text),
            _ => None,
        }
    }

    /// The scalar's text if it is a plain boolean (`true`, `False`, ...).
    pub fn plain_bool(&self) -> Option<bool> {
        match &self.value {
            Value::Scalar { text, plain: true } => match text.as_str() {
                "true" | "True" | "TRUE" => Some(true),
                "false" | "False" | "FALSE" => Some(false),
                _ => None,
            },
            _ => None,
        }
    }

    /// A short description for messages: the scalar, or `a list`, `a mapping`.
    pub fn describe(&self) -> String {
        match &self.value {
            Value::Scalar { text, .. } => format!("'{text}'"),
            Value::Seq(_) => "a list".to_string(),
            Value::Map(_) => "a mapping".to_string(),
        }
    }
}

/// Reads one YAML document. Errors are (line, message).
///
/// # Errors
/// Text that is not YAML, a second document, an alias, a key given twice in one
/// mapping, nesting deeper than 32, an empty file.
pub fn parse(text: &str) -> Result<Node, (usize, String)> {
    let mut reader = Reader {
        parser: Parser::new_from_str(text),
        line: 1,
    };
    let mut root = None;
    loop {
        let (event, line) = reader.next()?;
        match event {
            Event::StreamStart | Event::DocumentStart(_) | Event::DocumentEnd | Event::Nothing => {}
            Event::StreamEnd => break,
            other => {
                if root.is_some() {
                    return Err((
                        line,
                        "the file holds one YAML document, found a second".into(),
                    ));
                }
                root = Some(reader.node(other, line, 0)?);
            }
        }
    }
    root.ok_or((1, "the file is empty".to_string()))
}

struct Reader<'a> {
    parser: Parser<'a, saphyr_parser::StrInput<'a>>,
    line: usize,
}

impl<'a> Reader<'a> {
    fn next(&mut self) -> Result<(Event<'a>, usize), (usize, String)> {
        match self.parser.next_event() {
            Some(Ok((event, span))) => {
                self.line = span.start.line();
                Ok((event, self.line))
            }
            Some(Err(e)) => Err((e.marker().line(), format!("not YAML: {}", e.info()))),
            None => Err((self.line, "the file ends inside the document".into())),
        }
    }

    fn node(
        &mut self,
        event: Event<'a>,
        line: usize,
        depth: usize,
    ) -> Result<Node, (usize, String)> {
        if depth > MAX_NESTING {
            return Err((
                line,
                format!("collections nested more than {MAX_NESTING} deep"),
            ));
        }
        let value = match event {
            Event::Scalar(text, style, _, tag) => Value::Scalar {
                plain: style == ScalarStyle::Plain && tag.is_none(),
                text: text.into_owned(),
            },
            Event::Alias(_) => return Err((line, "aliases (*name) are not supported here".into())),
            Event::SequenceStart(..) => {
                let mut items = Vec::new();
                loop {
                    let (event, line) = self.next()?;
                    if matches!(event, Event::SequenceEnd) {
                        break;
                    }
                    items.push(self.node(event, line, depth + 1)?);
                }
                Value::Seq(items)
            }
            Event::MappingStart(..) => {
                let mut entries: Vec<(Node, Node)> = Vec::new();
                loop {
                    let (event, line) = self.next()?;
                    if matches!(event, Event::MappingEnd) {
                        break;
                    }
                    let key = self.node(event, line, depth + 1)?;
                    if let (Some(k), Some((first, _))) = (
                        key.scalar(),
                        entries
                            .iter()
                            .find(|(e, _)| e.scalar().is_some() && e.scalar() == key.scalar()),
                    ) {
                        return Err((
                            key.line,
                            format!("{k}: given twice (first on line {})", first.line),
                        ));
                    }
                    let (event, line) = self.next()?;
                    let value = self.node(event, line, depth + 1)?;
                    entries.push((key, value));
                }
                Value::Map(entries)
            }
            _ => return Err((line, "unexpected YAML structure".into())),
        };
        Ok(Node { line, value })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Nodes keep their lines; plain and quoted scalars are told apart; duplicate keys,
    /// aliases, second documents and deep nesting are refused with their line.
    #[test]
    fn nodes_and_lines() {
        let n = parse("a: [1, '2']\nb:\n  c: ~\n").unwrap();
        let Value::Map(entries) = &n.value else {
            panic!("{n:?}")
        };
        assert_eq!(entries[0].0.scalar(), Some("a"));
        let Value::Seq(items) = &entries[0].1.value else {
            panic!()
        };
        assert_eq!(
            items[1].value,
            Value::Scalar {
                text: "2".into(),
                plain: false
            }
        );
        let Value::Map(inner) = &entries[1].1.value else {
            panic!()
        };
        assert_eq!(inner[0].0.line, 3);
        assert!(inner[0].1.is_null());
        for (text, line, what) in [
            ("a: 1\nb: 2\na: 3\n", 3, "given twice (first on line 1)"),
            ("a: &x 1\nb: *x\n", 2, "aliases"),
            ("a: 1\n---\nb: 2\n", 3, "second"),
            ("a: [1,\n", 2, "not YAML"),
        ] {
            let (l, m) = parse(text).unwrap_err();
            assert_eq!(l, line, "{text}: {m}");
            assert!(m.contains(what), "{text}: {m}");
        }
        let deep = format!("{}{}", "[".repeat(100), "]".repeat(100));
        assert!(parse(&deep).unwrap_err().1.contains("nested"));
    }
}
