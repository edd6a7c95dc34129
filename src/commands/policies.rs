//! `allocsim policies`: the registry table ([`policies::POLICIES`]) for people: every
//! policy with what it is, and each option with its value syntax, default and meaning.

use std::io::Write as _;

use policies::options::OptionDoc;
use policies::registry::{self, PolicyEntry};
use policies::spec::SpecError;

use crate::flags::PoliciesArgs;
use crate::Exit;

/// Lines are wrapped to this many columns.
const WIDTH: usize = 100;

pub fn run(args: PoliciesArgs) -> anyhow::Result<Exit> {
    let entries: Vec<&PolicyEntry> = match &args.name {
        Some(name) => vec![
            registry::find(name).ok_or_else(|| SpecError::UnknownPolicy {
                name: name.clone(),
                known: registry::known_names(", "),
            })?,
        ],
        None => registry::POLICIES.iter().collect(),
    };
    let mut out = crate::output::create(None)?;
    write!(out, "{}", render(&entries))?;
    out.finish()?;
    Ok(Exit::Ran)
}

/// The text of `allocsim policies` for these entries.
pub fn render(entries: &[&PolicyEntry]) -> String {
    let mut out = String::new();
    for entry in entries {
        out.push_str(entry.name);
        out.push('\n');
        push_wrapped(&mut out, entry.about, 4);
        out.push('\n');
        let docs = entry.docs();
        if docs.is_empty() {
            out.push_str("    No options.\n");
        }
        for doc in &docs {
            out.push_str(&option_line(doc));
            push_wrapped(&mut out, doc.help, 8);
        }
        out.push('\n');
    }
    push_wrapped(
        &mut out,
        "Write a policy as NAME or NAME:KEY=VALUE,... (sizes as 512, 4KiB, 1.5GiB), e.g. \
         `--policies caching,caching:expandable_segments=True,buddy:segment=256MiB`.",
        0,
    );
    out
}

/// `    key=VALUE  (default: ...)`.
fn option_line(doc: &OptionDoc) -> String {
    format!(
        "    {}={}  (default: {})\n",
        doc.name,
        doc.kind.placeholder(),
        doc.default
    )
}

/// Appends `text` word-wrapped to [`WIDTH`] columns, each line indented by `indent`.
fn push_wrapped(out: &mut String, text: &str, indent: usize) {
    let mut line = String::new();
    for word in text.split_whitespace() {
        if !line.is_empty() && indent + line.len() + 1 + word.len() > WIDTH {
            out.push_str(&format!("{:indent$}{line}\n", ""));
            line.clear();
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.is_empty() {
        out.push_str(&format!("{:indent$}{line}\n", ""));
    }
}
