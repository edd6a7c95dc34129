//! Tables for people: columns padded to their widest cell, numbers right-aligned. CSV is
//! for programs (`--format csv`); this is what a terminal shows by default.

use std::io::IsTerminal as _;

/// How a command that prints a table or a CSV writes: `--format`, or by default a table
/// on a terminal and CSV otherwise (a pipe, a file).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns with sizes in binary units, for people.
    Table,
    /// Comma-separated values with exact integers, for programs (`docs/metrics.md`).
    Csv,
}

impl OutputFormat {
    /// `--format` if given; otherwise a table when stdout is a terminal and nothing is
    /// written to a file, CSV otherwise.
    pub fn resolve(flag: Option<OutputFormat>, to_file: bool) -> OutputFormat {
        match flag {
            Some(f) => f,
            None if !to_file && std::io::stdout().is_terminal() => OutputFormat::Table,
            None => OutputFormat::Csv,
        }
    }
}

/// A table being built: a header and rows of cells.
pub struct Table {
    header: Vec<String>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles; `right` marks the columns aligned right
    /// (numbers and sizes).
    pub fn new(header: &[&str], right: &[bool]) -> Table {
        assert_eq!(header.len(), right.len(), "one alignment per column");
        Table {
            header: header.iter().map(|h| h.to_string()).collect(),
            right: right.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (as many cells as columns).
    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(cells.len(), self.header.len(), "one cell per column");
        self.rows.push(cells);
    }

    /// The table as text: header, a rule, the rows; two spaces between columns, no
    /// trailing spaces.
    pub fn render(&self) -> String {
        let widths: Vec<usize> = (0..self.header.len())
            .map(|c| {
                std::iter::once(&self.header[c])
                    .chain(self.rows.iter().map(|r| &r[c]))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let line = |cells: &[String]| {
            let mut out = String::new();
            for (c, cell) in cells.iter().enumerate() {
                if c > 0 {
                    out.push_str("  ");
                }
                let pad = widths[c] - cell.chars().count();
                if self.right[c] {
                    out.push_str(&" ".repeat(pad));
                    out.push_str(cell);
                } else {
                    out.push_str(cell);
                    out.push_str(&" ".repeat(pad));
                }
            }
            out.trim_end().to_string() + "\n"
        };
        let mut out = line(&self.header);
        let rule: Vec<String> = widths.iter().map(|&w| "-".repeat(w)).collect();
        out.push_str(&line(&rule));
        for r in &self.rows {
            out.push_str(&line(r));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Columns are padded to their widest cell, right-aligned where asked, with no
    /// trailing spaces.
    #[test]
    fn aligns_columns() {
        let mut t = Table::new(&["name", "bytes"], &[false, true]);
        t.row(vec!["a".into(), "1".into()]);
        t.row(vec!["long name".into(), "1000".into()]);
        assert_eq!(
            t.render(),
            "name       bytes\n---------  -----\na              1\nlong name   1000\n"
        );
    }
}
