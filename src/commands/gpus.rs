//! `allocsim gpus`: the built-in GPU profiles, measured and nominal.

use std::io::Write as _;

use anyhow::Context;
use serde::Serialize;
use sim::DeviceProfile;
use workloads::size::format_size_human;

use crate::flags::GpusArgs;
use crate::table::{OutputFormat, Table};
use crate::Exit;

/// One row of `allocsim gpus --format csv`.
#[derive(Debug, Default, Serialize)]
pub struct GpuRecord {
    /// The name `--gpu-profile` and `--gpus` take.
    pub gpu: String,
    /// The card's name as the driver reports it.
    pub card: String,
    /// Total memory as `cudaMemGetInfo` reports it.
    pub total_bytes: u64,
    /// What a program can allocate: total − context − the driver's unusable tail.
    pub usable_bytes: u64,
    /// How much the usable memory varies between processes on the card (0: not
    /// measured, or none).
    pub usable_spread_bytes: u64,
    /// `measured` (by `allocsim probe`) or `nominal` (published figures).
    pub kind: &'static str,
    /// Where the figures come from.
    pub source: String,
}

/// The rows, in the catalog's order.
pub fn records() -> Vec<GpuRecord> {
    DeviceProfile::builtins()
        .into_iter()
        .map(|(name, p)| GpuRecord {
            gpu: name.to_string(),
            card: p.name.clone(),
            total_bytes: p.total_bytes,
            usable_bytes: p.usable_bytes,
            usable_spread_bytes: p.usable_spread_bytes,
            kind: if p.nominal { "nominal" } else { "measured" },
            source: p.source(),
        })
        .collect()
}

pub fn run(args: GpusArgs) -> anyhow::Result<Exit> {
    let rows = records();
    let mut out = crate::output::create(None)?;
    match OutputFormat::resolve(args.format, false) {
        OutputFormat::Csv => {
            sim::report::write_records(rows, &mut out).context("writing the CSV")?
        }
        OutputFormat::Table => {
            let mut t = Table::new(
                &[
                    "gpu",
                    "card",
                    "total",
                    "usable",
                    "varies by",
                    "kind",
                    "source",
                ],
                &[false, false, true, true, true, false, false],
            );
            for r in &rows {
                let source = r.source.strip_prefix("total_bytes: ").unwrap_or(&r.source);
                t.row(vec![
                    r.gpu.clone(),
                    r.card.clone(),
                    format_size_human(r.total_bytes),
                    format_size_human(r.usable_bytes),
                    match r.usable_spread_bytes {
                        0 => "-".to_string(),
                        b => format_size_human(b),
                    },
                    r.kind.to_string(),
                    source.to_string(),
                ]);
            }
            write!(out, "{}", t.render())?;
            writeln!(
                out,
                "\nnominal: total memory from published figures, context and page model \
                 assumed as measured on the H100; `allocsim probe -o card.yaml` measures a card \
                 (`--gpu-profile card.yaml`). The figures' sources: sim/profiles/NAME.yaml.\n\
                 varies by: how much the usable memory differs between processes on the card \
                 (measured by `allocsim probe --processes N`; `-`: not measured); runs that fit \
                 or run out by less are marked marginal."
            )?;
        }
    }
    out.finish()?;
    Ok(Exit::Ran)
}
