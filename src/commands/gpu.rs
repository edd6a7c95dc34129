//! `allocsim probe` and `allocsim validate`: the commands that need a GPU.

use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Context;
use gpu_backend::{CudaDevice, ProbeReport};
use sim::DeviceProfile;

use crate::flags::{DeviceArgs, ProbeArgs, ValidateArgs};
use crate::output::{self, Kind, Planned};
use crate::{interrupt, load, Exit};

pub fn probe(args: ProbeArgs) -> anyhow::Result<Exit> {
    if let Some(path) = &args.output {
        output::check(
            &[Planned {
                flag: "-o",
                path,
                kind: Kind::Profile,
            }],
            &[],
        )?;
    }
    if args.fill_only {
        let h = gpu_backend::probe_fill(args.gpu)?;
        println!("{} {}", h.free_at_start_bytes, h.usable_bytes);
        return Ok(Exit::Ran);
    }
    // A probe fills the GPU and places segments (seconds to a minute); a spinner on a
    // terminal only (the other processes' stderr is captured, so they show none).
    let stage = crate::progress::Stage::start(format!("probing GPU {}", args.gpu));
    let report = gpu_backend::probe(args.gpu)?;
    let mut processes = vec![gpu_backend::HoldBack {
        free_at_start_bytes: report.free_at_start_bytes,
        usable_bytes: report.fill.usable_bytes,
    }];
    for i in 1..args.processes {
        crate::progress::Stage::set(
            &stage,
            format!(
                "probing GPU {}: filling it in process {} of {}",
                args.gpu,
                i + 1,
                args.processes
            ),
        );
        processes.push(fill_in_another_process(args.gpu)?);
    }
    drop(stage);
    let (spread, _) = usable_spread(&processes);
    if spread > sim::MAX_USABLE_SPREAD_BYTES {
        anyhow::bail!(
            "--processes: the free memory held back varied by {spread} bytes between processes, \
             more than a driver's variation (64 MiB): was another process using the GPU?"
        );
    }
    let text = profile_yaml(&report, &processes);
    let mut out = output::create(args.output.as_deref())?;
    out.write_all(text.as_bytes())
        .context("writing the profile")?;
    out.finish()?;
    if let Some(path) = &args.output {
        eprintln!("wrote {} (the device profile)", path.display());
    }
    Ok(Exit::Ran)
}

/// Runs `allocsim probe --fill-only` (this binary) and reads its one line.
fn fill_in_another_process(gpu: usize) -> anyhow::Result<gpu_backend::HoldBack> {
    let exe = std::env::current_exe().context("--processes: finding this program")?;
    let out = std::process::Command::new(&exe)
        .args(["probe", "--fill-only", "--gpu", &gpu.to_string()])
        .stdin(std::process::Stdio::null())
        .output()
        .with_context(|| format!("--processes: running {}", exe.display()))?;
    let line = String::from_utf8_lossy(&out.stdout);
    let figures: Vec<u64> = line
        .split_whitespace()
        .map_while(|w| w.parse().ok())
        .collect();
    match (out.status.success(), figures.as_slice()) {
        (true, &[free_at_start_bytes, usable_bytes]) => Ok(gpu_backend::HoldBack {
            free_at_start_bytes,
            usable_bytes,
        }),
        _ => anyhow::bail!(
            "--processes: the fill in another process failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .find(|l| !l.starts_with("mock_libcuda"))
                .unwrap_or("no message")
        ),
    }
}

/// The spread of the driver's hold-back between processes (largest − smallest), and
/// the comment saying what each process measured; `None` from one process.
fn usable_spread(processes: &[gpu_backend::HoldBack]) -> (u64, String) {
    if processes.len() < 2 {
        return (
            0,
            "# usable_spread_bytes: not measured (one process; `allocsim probe --processes 8` \
             measures it)\n"
                .to_string(),
        );
    }
    let held: Vec<u64> = processes.iter().map(|h| h.held_back_bytes()).collect();
    let spread = held.iter().max().unwrap_or(&0) - held.iter().min().unwrap_or(&0);
    let list: Vec<String> = held.iter().map(u64::to_string).collect();
    (
        spread,
        format!(
            "# usable_spread_bytes: held back of the free memory (free at start - usable) in {} \
             processes, this one first: {}\n",
            processes.len(),
            list.join(", ")
        ),
    )
}

/// The device profile a probe measured (with the usable memory of `processes`, this
/// one's first), with the raw measurements as comments.
pub fn profile_yaml(r: &ProbeReport, processes: &[gpu_backend::HoldBack]) -> String {
    let (usable_spread_bytes, spread_comment) = usable_spread(processes);
    let page = r
        .sizes
        .iter()
        .find(|s| s.size_bytes == 2 << 20)
        .and_then(|s| s.single_free_drop_bytes)
        .filter(|&d| d > 0)
        .map_or(2 << 20, |d| d as u64);
    // Sizes the driver packs: several live allocations cost less than one page each. The
    // probe sees packing up to 1 MiB (two fit a page); validation showed the H100 packs
    // every size below a page (best fit in shared pages), so any packing found means
    // "below a page".
    let packs = r
        .sizes
        .iter()
        .filter(|s| s.size_bytes < page && s.x8_live == gpu_backend::PROBE_BATCH)
        .any(|s| (s.x8_free_drop_bytes as u64) < u64::from(s.x8_live) * page);
    let small_max = if packs { page - 1 } else { 0 };
    let profile = DeviceProfile {
        name: r.device_name.clone(),
        measured: Some(format!(
            "allocsim probe, device {}, compute capability {}.{}",
            r.device_index, r.compute_capability.0, r.compute_capability.1
        )),
        driver_version: u32::try_from(r.driver_version).ok(),
        nominal: false,
        sources: Vec::new(),
        total_bytes: r.total_bytes,
        free_at_start_bytes: r.free_at_start_bytes,
        usable_bytes: r.fill.usable_bytes,
        page_bytes: page,
        small_alloc_max_bytes: small_max,
        small_alloc_align_bytes: 512,
        vmm_granularity_bytes: r.vmm_granularity_min_bytes.unwrap_or(page),
        va_chunk_bytes: r
            .placement
            .chunk_bytes
            .filter(|&c| c > 0 && c % (2 << 20) == 0)
            .unwrap_or(sim::address::DEFAULT_CHUNK_BYTES),
        usable_spread_bytes,
    };
    let mut text = String::from("# allocsim device profile, measured by `allocsim probe`.\n");
    text.push_str(&format!(
        "# context and other processes: {} bytes; warm-up alloc {} ns; fill: {} x 1 GiB + {} bytes in {} ms; returned to start: {}\n",
        r.context_bytes,
        r.warmup_alloc_ns,
        r.fill.big_chunks,
        r.fill.tail_bytes,
        r.fill.fill_ns / 1_000_000,
        r.returned_to_start
    ));
    text.push_str("# size: free drop for 1 live / 8 live allocations, alloc ns, free ns\n");
    for s in &r.sizes {
        let opt = |v: Option<i64>| v.map_or("-".to_string(), |x| x.to_string());
        let ns = |v: Option<u64>| v.map_or("-".to_string(), |x| x.to_string());
        text.push_str(&format!(
            "#   {}: {} / {} ({} live), {} ns, {} ns\n",
            s.size_bytes,
            opt(s.single_free_drop_bytes),
            s.x8_free_drop_bytes,
            s.x8_live,
            ns(s.alloc_ns),
            ns(s.free_ns)
        ));
    }
    text.push_str(&placement_comments(&r.placement, profile.va_chunk_bytes));
    text.push_str(&spread_comment);
    text.push_str(&profile.to_yaml());
    text
}

/// The placement probe's calls and addresses as comments, with how many of the
/// allocations the simulated device's address model places as the driver did.
fn placement_comments(p: &gpu_backend::PlacementProbe, chunk: u64) -> String {
    use gpu_backend::PlacementCall;
    let ops: Vec<sim::address::RecordedPlacement> = p
        .records
        .iter()
        .filter(|r| matches!(r.call, PlacementCall::Alloc | PlacementCall::Free))
        .map(|r| sim::address::RecordedPlacement {
            alloc: r.call == PlacementCall::Alloc,
            addr: r.addr,
            size: r.size_bytes,
        })
        .collect();
    let check = sim::address::check_placements(&ops, chunk);
    let mut text = format!(
        "# placement: {} calls{}; the address model (chunks of {chunk} bytes) places {} of {} allocations exactly, given the earlier ones, and {} in the right order\n",
        p.records.len(),
        if p.out_of_memory { " (out of memory before the end)" } else { "" },
        check.exact_right,
        check.segments,
        check.order_right
    );
    for r in &p.records {
        text.push_str(&format!(
            "#   {} {} -> {:#x}\n",
            r.call.name(),
            r.size_bytes,
            r.addr
        ));
    }
    text
}

/// The GPU `validate` runs on and the model its predictions use.
struct Gpu {
    device: CudaDevice,
    model: sim::SimDeviceOptions,
}

thread_local! {
    /// `validate`'s GPU, opened by the first run on the GPU's thread (a `CudaDevice`
    /// stays on the thread that opened it), taken and closed there at the end.
    static GPU: std::cell::RefCell<Option<Gpu>> = const { std::cell::RefCell::new(None) };
}

/// Opens the GPU `args` names, with the model predictions use on it: the flags' model
/// `model` when they name a profile, else the GPU's own measured profile when there is
/// one (its driver's reserve of free memory decides the capacity near the limit), else
/// the H100's, with a note saying so.
fn open_gpu(
    args: &ValidateArgs,
    model: &sim::SimDeviceOptions,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<Gpu> {
    let device = CudaDevice::open(args.gpu)?;
    let mut model = model.clone();
    if args.device.gpu_profile.is_none() {
        match DeviceProfile::measured_for_gpu(&device.info().name) {
            Some(profile) => model = profile.to_options(),
            None => bar.suspend(|| {
                eprintln!(
                    "note: predicting with the built-in H100 model on a {}; `allocsim probe -o p.yaml` and --gpu-profile p.yaml model this GPU",
                    device.info().name
                )
            }),
        }
    }
    Ok(Gpu { device, model })
}

pub fn validate(args: ValidateArgs) -> anyhow::Result<Exit> {
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
    // validate's capacities are the free memory the ballast leaves on the GPU
    // (`gpu_backend::validate_one`), not a card's total: no total is derived from them, so
    // a capacity below a profile's context and driver reserve is a valid run.
    let device = DeviceArgs {
        capacity: Vec::new(),
        ..args.device.clone()
    };
    let mut setup = load::device_setup(&device)?;
    if args.device.gpu_profile.is_none() {
        // Predict with the measured H100 model unless told otherwise.
        setup.options = DeviceProfile::builtin("h100")
            .expect("built-in")
            .to_options();
    }
    let specs = load::policies(&args.policies, &setup.caching)?;
    let capacities: Vec<Option<u64>> = match args.device.capacity.as_slice() {
        [] => vec![None],
        list => list.iter().map(|&c| Some(c)).collect(),
    };
    // Every (trace, policy, capacity), in the rows' order: `jobs` names each by its
    // index in `runs`.
    let runs: Vec<(usize, usize, usize)> = (0..args.traces.len())
        .flat_map(|t| {
            let capacities = capacities.len();
            (0..specs.len()).flat_map(move |p| (0..capacities).map(move |c| (t, p, c)))
        })
        .collect();
    let jobs: Vec<(usize, usize)> = runs.iter().enumerate().map(|(k, r)| (r.0, k)).collect();
    let bar = crate::progress::jobs_bar(jobs.len() as u64);
    // Ctrl-C stops the replay at the next event, and loading before the next trace;
    // everything allocated is then freed.
    let in_order = interrupt::in_order();
    // The traces are read for the model the flags name (a recorded run's addresses
    // become hints for it), before the GPU's own profile replaces it for predictions.
    let batch = load::Batch::new(&args.traces, &args.input, &setup.options, &bar);
    let load = |i: usize| batch.load(i);
    // After a failure (the GPU does not open, a run fails), the jobs after it in input
    // order do not run: the error is the first in input order, as when they ran one
    // after another. A failed load comes first, whichever failed first in time.
    let failed = AtomicUsize::new(usize::MAX);
    let cost = |_: &usize, _: &sim::CompareInput| 0.0;
    let run = |&k: &usize, input: &sim::CompareInput| {
        let (_, p, c) = runs[k];
        if failed.load(Ordering::Relaxed) < k {
            return None;
        }
        let v = GPU.with(|cell| -> anyhow::Result<sim::validation::Validation> {
            let mut cell = cell.borrow_mut();
            if cell.is_none() {
                *cell = Some(open_gpu(&args, &setup.options, &bar)?);
            }
            let gpu = cell.as_mut().expect("opened");
            Ok(gpu_backend::validate_one(
                &mut gpu.device,
                input,
                &specs[p],
                capacities[c],
                &gpu.model,
                Some(interrupt::flag()),
            )?)
        });
        match &v {
            Ok(v) => bar.suspend(|| eprintln!("{}", sim::validation::summary_line(v))),
            Err(_) => {
                failed.fetch_min(k, Ordering::Relaxed);
            }
        }
        bar.inc(1);
        Some(v)
    };
    let work = sim::compare::Work {
        load: &load,
        cost: &cost,
        run: &run,
    };
    // One thread, the GPU's (a `CudaDevice` stays on the thread that opened it): a
    // trace is read, its runs go to the GPU one after another, it is freed, then the
    // next is read (`load_and_run` on one thread). Equal sizes: in input order, as the
    // rows.
    let sizes = vec![0; args.traces.len()];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .context("starting the GPU's thread")?;
    let ran = pool.install(|| sim::compare::load_and_run(&sizes, &jobs, &work, false));
    // The GPU is closed on its thread, everything it allocated freed.
    let model = pool.install(|| GPU.with(|cell| cell.borrow_mut().take().map(|g| g.model)));
    drop(pool);
    drop(in_order);
    bar.finish_and_clear();
    let mut rows = Vec::with_capacity(jobs.len());
    for v in ran?.results.into_iter().flatten() {
        rows.push(v?);
    }
    // The model predictions ran with (the GPU's own profile, or the flags').
    if let Some(model) = model {
        setup.options = model;
    }
    let mut out = output::create(args.output.as_deref())?;
    sim::validation::write_validation_csv(&rows, &mut out).context("writing the CSV")?;
    out.finish()?;
    if let Some(path) = &args.output {
        eprintln!("wrote {} ({} rows)", path.display(), rows.len());
    }
    // Agree: reserved peak equal, OOM at the same event, charged peak within a page per
    // segment. Within the driver's variation: they differ, but a prediction at a capacity
    // within the profile's spread of usable memory between processes agrees.
    eprintln!(
        "{} (spread of usable memory between processes: {})",
        sim::validation::VerdictCounts::of(&rows),
        workloads::size::format_size_human(setup.options.usable_spread_bytes)
    );
    Ok(Exit::Ran)
}
