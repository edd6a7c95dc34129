//! `allocsim fit`: the smallest GPU memory for each (trace, policy), and the named GPUs
//! each fits on.

use std::io::Write as _;
use std::path::Path;

use anyhow::{bail, Context};
use sim::boundary::Margin;
use sim::fit::FitRecord;
use sim::{DeviceProfile, Fit, FitOptions};
use workloads::size::format_size_human;

use crate::flags::FitArgs;
use crate::output::{self, Kind, Planned};
use crate::table::{OutputFormat, Table};
use crate::{interrupt, load, Exit};

/// One (trace, policy): its fit, and per `--gpus` GPU whether it fits there and its
/// margin against the GPU's variation between processes.
type FitResult = (Fit, Vec<(bool, Margin)>);

/// A named GPU: its name and simulated device.
struct Gpu {
    name: String,
    device: sim::SimDeviceOptions,
}

fn gpus(names: &[String]) -> anyhow::Result<Vec<Gpu>> {
    let mut out = Vec::new();
    for name in names {
        match name.as_str() {
            "none" => {}
            "all" => out.extend(DeviceProfile::builtins().into_iter().map(|(n, p)| Gpu {
                name: n.to_string(),
                device: p.to_options(),
            })),
            _ => out.push(Gpu {
                name: name.clone(),
                device: load::gpu_profile(name)
                    .with_context(|| format!("--gpus {name}"))?
                    .to_options(),
            }),
        }
    }
    Ok(out)
}

pub fn run(args: FitArgs) -> anyhow::Result<Exit> {
    let mut inputs: Vec<&Path> = args.traces.iter().map(|p| p.as_path()).collect();
    inputs.extend(load::profile_file(&args.device));
    if let Some(path) = &args.output {
        output::check(
            &[Planned {
                flag: "-o",
                path,
                kind: Kind::Csv,
            }],
            &inputs,
        )?;
    }
    if !args.device.capacity.is_empty() {
        bail!("--capacity: fit searches the capacity itself; --gpus names GPUs to check");
    }
    if args.device.continue_after_oom {
        bail!("--continue-after-oom: fit looks for the memory that has no out-of-memory");
    }
    let setup = load::device_setup(&args.device)?;
    let specs = load::policies(&args.policies, &setup.caching)?;
    let gpus = gpus(&args.gpus)?;
    let jobs: Vec<(usize, usize)> = (0..args.traces.len())
        .flat_map(|t| (0..specs.len()).map(move |p| (t, p)))
        .collect();
    let bar = crate::progress::jobs_bar(jobs.len() as u64);
    // Ctrl-C stops every replay at its next event, and loading before the next trace;
    // nothing is written then.
    let in_order = interrupt::in_order();
    let batch = load::Batch::new(&args.traces, &args.input, &setup.options, &bar);
    let load = |i: usize| batch.load(i);
    // Longest first (a bisection is a dozen replays of its trace).
    let cost =
        |&p: &usize, input: &sim::CompareInput| sim::replay_cost(&input.trace, &specs[p].config);
    // Fewer bisections than threads: each replays ahead on its share of them.
    let fit_options = FitOptions {
        speculate: sim::fit::speculation_for(jobs.len(), rayon::current_num_threads()),
        ..FitOptions::default()
    };
    let run = |&p: &usize, input: &sim::CompareInput| -> anyhow::Result<FitResult> {
        let _tick = Tick(&bar);
        let config = &specs[p].config;
        let fit = sim::fit(
            &input.trace,
            &input.hints,
            config,
            &setup.options,
            &setup.replay,
            &fit_options,
        )?;
        // Each GPU: whether it fits, and whether that could change in another process
        // (the GPU's spread of usable memory between processes).
        let on = gpus
            .iter()
            .map(|g| {
                let (t, h) = (&input.trace, &input.hints);
                let ok = sim::fits(t, h, config, &g.device, &setup.replay)?;
                let margin = sim::boundary::margin(t, h, config, &g.device, &setup.replay, ok)?;
                Ok((ok, margin))
            })
            .collect::<Result<Vec<(bool, Margin)>, sim::CompareError>>()?;
        Ok((fit, on))
    };
    let work = sim::compare::Work {
        load: &load,
        cost: &cost,
        run: &run,
    };
    // Each trace goes once its last bisection ends; results in input order.
    let ran = sim::compare::load_and_run(&batch.sizes(), &jobs, &work, false);
    drop(in_order);
    bar.finish_and_clear();
    let results = ran?
        .results
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()?;
    let names = batch.names();
    let format = OutputFormat::resolve(args.format, args.output.is_some());
    let mut out = output::create(args.output.as_deref())?;
    match format {
        OutputFormat::Csv => {
            let mut w = csv::WriterBuilder::new()
                .has_headers(false)
                .from_writer(&mut out);
            let mut header = sim::report::columns::<FitRecord<'_>>();
            header.extend(gpus.iter().map(|g| g.name.clone()));
            w.write_record(&header).context("writing the CSV")?;
            for (&(t, p), (fit, on)) in jobs.iter().zip(&results) {
                let marginal: Vec<&str> = gpus
                    .iter()
                    .zip(on)
                    .filter(|(_, (_, m))| m.is_marginal())
                    .map(|(g, _)| g.name.as_str())
                    .collect();
                let fits: Vec<bool> = on.iter().map(|&(ok, _)| ok).collect();
                let record =
                    FitRecord::of(&names[t], &specs[p].label, fit).with_marginal_gpus(&marginal);
                w.serialize((record, fits)).context("writing the CSV")?;
            }
            w.flush().context("writing the CSV")?;
        }
        OutputFormat::Table => {
            let h = |b: Option<u64>| b.map_or("does not fit".to_string(), format_size_human);
            // With a spread of usable memory between processes, the capacity that fits in
            // every process (the minimum plus the spread) gets its own column.
            let spread = setup.options.usable_spread_bytes;
            let mut headers = vec!["trace", "policy", "min capacity"];
            let mut right = vec![false, false, true];
            let with_spread = format!(
                "with {} to spare (driver varies)",
                format_size_human(spread)
            );
            if spread > 0 {
                headers.push(&with_spread);
                right.push(true);
            }
            headers.extend([
                "requested peak",
                "overhead",
                "monotonic",
                "smallest GPU that fits",
            ]);
            right.extend([true, true, false, false]);
            let mut t = Table::new(&headers, &right);
            for (&(ti, p), (fit, on)) in jobs.iter().zip(&results) {
                // The smallest GPU the run fits on in every process; a smaller one on
                // which it fits only in some is named after it.
                let clear = gpus
                    .iter()
                    .zip(on)
                    .filter(|(_, (ok, m))| *ok && !m.is_marginal())
                    .min_by_key(|(g, _)| g.device.total_bytes);
                let marginal = gpus
                    .iter()
                    .zip(on)
                    .filter(|(g, (ok, m))| {
                        *ok && m.is_marginal()
                            && clear
                                .is_none_or(|(c, _)| g.device.total_bytes < c.device.total_bytes)
                    })
                    .min_by_key(|(g, _)| g.device.total_bytes);
                let mut smallest = clear.map_or("none of those checked".to_string(), |(g, _)| {
                    format!("{} ({})", g.name, format_size_human(g.device.total_bytes))
                });
                if let Some((g, (_, m))) = marginal {
                    smallest += &format!(
                        "; {} ({}) fits, but {m}",
                        g.name,
                        format_size_human(g.device.total_bytes)
                    );
                }
                let mut row = vec![
                    names[ti].to_string(),
                    specs[p].label.clone(),
                    h(fit.min_capacity_bytes),
                ];
                if spread > 0 {
                    row.push(fit.min_capacity_with_spread_bytes.map_or_else(
                        || {
                            if fit.min_capacity_bytes.is_some() {
                                "not found".to_string()
                            } else {
                                "does not fit".to_string()
                            }
                        },
                        format_size_human,
                    ));
                }
                row.extend([
                    format_size_human(fit.requested_bytes_peak),
                    match (fit.overhead_bytes(), fit.overhead_pct()) {
                        (Some(o), Some(pct)) => format!("{} ({pct:.1}%)", format_size_human(o)),
                        (Some(o), None) => format_size_human(o),
                        _ => "-".to_string(),
                    },
                    if fit.monotonic {
                        "yes"
                    } else {
                        "no (smallest fit seen)"
                    }
                    .to_string(),
                    smallest,
                ]);
                t.row(row);
            }
            write!(out, "{}", t.render())?;
        }
    }
    out.finish()?;
    if let Some(path) = &args.output {
        eprintln!("wrote {} ({} rows)", path.display(), results.len());
    }
    Ok(Exit::Ran)
}

/// Advances a progress bar when a job ends, however it ends.
struct Tick<'a>(&'a indicatif::ProgressBar);

impl Drop for Tick<'_> {
    fn drop(&mut self) {
        self.0.inc(1);
    }
}
