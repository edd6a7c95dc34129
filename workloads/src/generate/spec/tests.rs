use std::path::{Path, PathBuf};

use super::*;
use crate::validate::{validate, Severity};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn csv_bytes(t: &Trace) -> Vec<u8> {
    let mut out = Vec::new();
    crate::csv::write_csv(t, &mut out).unwrap();
    out
}

fn spec(text: &str) -> Result<Generator, String> {
    read_spec(Some((text, Path::new("g.yaml"))), None, &[])
        .map(|(g, _)| g)
        .map_err(|e| e.to_string())
}

/// Live bytes after each event, and their peak.
fn peak_live(t: &Trace) -> u64 {
    let mut live = std::collections::HashMap::new();
    let (mut now, mut peak) = (0u64, 0u64);
    for e in &t.events {
        match e {
            Event::Alloc { id, size_bytes, .. } => {
                live.insert(*id, *size_bytes);
                now += size_bytes;
                peak = peak.max(now);
            }
            Event::Free { id } => now -= live.remove(id).unwrap(),
            _ => {}
        }
    }
    assert!(live.is_empty(), "{} allocations left live", live.len());
    peak
}

/// Every bundled spec reads, generates a valid trace that frees everything, twice
/// byte for byte, and another seed gives another trace.
#[test]
fn bundled_specs_generate_valid_deterministic_traces() {
    let dir = repo().join("examples/generators");
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let (g, _) = read_spec(Some((&text, &path)), None, &[]).unwrap();
        let t = g.generate().unwrap();
        let errors: Vec<_> = validate(&t)
            .into_iter()
            .filter(|i| i.severity == Severity::Error)
            .collect();
        assert!(errors.is_empty(), "{}: {:?}", path.display(), errors);
        peak_live(&t);
        assert_eq!(csv_bytes(&t), csv_bytes(&g.generate().unwrap()));
        let streamed: Vec<Event> = g.events().unwrap().collect();
        assert_eq!(streamed, t.events, "the iterator gives the trace");
        let other = g.with_seed(g.seed() + 1).generate().unwrap();
        // The specs of recorded shapes draw nothing: every seed gives their trace.
        let draws = ["transformer.yaml", "inference.yaml"]
            .iter()
            .any(|f| path.ends_with(f));
        assert_eq!(draws, t.events != other.events, "{}", path.display());
        n += 1;
    }
    assert!(n >= 3, "{n} specs");
}

/// The MLP spec's trace is the training loop as specified: parameters at setup, a
/// mark per step, Adam's two moments allocated once, gradients and the foreach
/// temporaries every step, and everything freed at the end.
#[test]
fn training_structure() {
    let text = std::fs::read_to_string(repo().join("examples/generators/mlp_train.yaml")).unwrap();
    let g = spec(&text).unwrap();
    let t = g.generate().unwrap();
    assert_eq!(t.name, "training-seed0");
    let marks: Vec<&str> = t
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Mark { label } => Some(label.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(
        marks,
        ["iteration 0", "iteration 1", "iteration 2", "iteration 3"]
    );
    // The 256 MiB weight is allocated once (parameter), as its gradient each step,
    // twice as state at the first step, and as a temporary each step: 1 + 4 + 2 + 4.
    let big = t
        .events
        .iter()
        .filter(|e| matches!(e, Event::Alloc { size_bytes, .. } if *size_bytes == 256 << 20))
        .count();
    assert_eq!(big, 11);
    // At the optimizer step: the weights (512 MiB) as parameters, gradients, two
    // moments and temporaries, the biases (80 KiB) five times too, and the input
    // (2048 × 4096 × 4 = 32 MiB).
    assert_eq!(
        peak_live(&t),
        5 * (512 << 20) + 5 * 4 * (8192 + 8192 + 4096) + (32 << 20)
    );
}

/// Checkpointing keeps less live during the step; SGD keeps no state; keep_grads keeps
/// the gradients from one step to the next.
#[test]
fn training_options_change_memory() {
    let base = "generate: training\ninput: 1024\nlayers:\n  - {params: [1024x1024], activations: [4096, 4096, 1024], repeat: 4}\n";
    let peak_of = |batch: u64, extra: &str| {
        let text = format!("{base}batch: {batch}\nseq_len: 128\n{extra}");
        peak_live(&spec(&text).unwrap().generate().unwrap())
    };
    let peak = |extra: &str| peak_of(64, extra);
    let plain = peak("optimizer: sgd\n");
    assert!(peak("optimizer: sgd\ncheckpoint: true\n") < plain);
    assert!(peak("optimizer: momentum\n") > plain);
    // With a batch of one the optimizer step is the peak: foreach holds every
    // temporary at once.
    let small = |extra: &str| peak_of(1, extra);
    assert!(small("optimizer: adam\n") > small("optimizer: adam\nforeach: false\n"));
    let kept = spec(&format!("{base}keep_grads: true\nsteps: 2\n"))
        .unwrap()
        .generate()
        .unwrap();
    let grads = kept
        .events
        .iter()
        .filter(|e| matches!(e, Event::Alloc { size_bytes, .. } if *size_bytes == 4 << 20))
        .count();
    // 4 parameters, 4 gradients once, 8 Adam states, 2 × 4 temporaries.
    assert_eq!(grads, 4 + 4 + 8 + 8);
}

/// Several streams: the input on stream 1, gradient buckets on streams 2 and 3 in turn,
/// each of at least `bucket_bytes` but the last.
#[test]
fn training_streams() {
    let g = spec("generate: training\nstreams: 4\nbucket_bytes: 6MiB\nsteps: 1\n").unwrap();
    let t = g.generate().unwrap();
    let streams: Vec<(u64, u64)> = t
        .events
        .iter()
        .filter_map(|e| match e {
            Event::Alloc {
                size_bytes, stream, ..
            } if *stream > 0 => Some((*stream, *size_bytes)),
            _ => None,
        })
        .collect();
    // Gradients in backward order: 4 MiB, 4 KiB (layer 2), 4 MiB (layer 1, filling
    // the first bucket), 4 KiB, 4 MiB, 4 KiB (the last bucket).
    assert_eq!(
        streams,
        [
            (1, 32 * 1024 * 4),
            (2, (8 << 20) + 4096),
            (3, (4 << 20) + 8192)
        ]
    );
}

/// Inference: exact growth reallocates every cache at every token, blocks every 64
/// tokens; a mark per batch; the caches of a batch are freed by its end.
#[test]
fn inference_growth() {
    let text =
        "generate: inference\nbatches: 2\nbatch: 2\nprompt_len: 10\noutput_len: 100\nlayers: 2\n";
    let allocs = |extra: &str| {
        let t = spec(&format!("{text}{extra}")).unwrap().generate().unwrap();
        peak_live(&t);
        let marks = t
            .events
            .iter()
            .filter(|e| matches!(e, Event::Mark { .. }))
            .count();
        assert_eq!(marks, 2);
        t.events
            .iter()
            .filter(|e| matches!(e, Event::Alloc { .. }))
            .count()
    };
    // Per batch: 2 layers × (K, V) at prefill + growths, 2 activations per layer per
    // position, a logits per position; parameters: embedding + 2 × 2.
    let fixed = 5 + 2 * (4 + 2 * 2 + 1 + 100 * (2 * 2 + 1));
    assert_eq!(allocs("growth: exact\n"), fixed + 2 * 100 * 4);
    // Capacity 64 at prefill, then 128 at token 65: one growth.
    assert_eq!(allocs("growth: {block: 64}\n"), fixed + 2 * 4);
    // Capacity 10, then 20, 40, 80, 160: four growths.
    assert_eq!(allocs("growth: double\n"), fixed + 2 * 4 * 4);
}

/// `--set` replaces the file's keys; the command line's kind must agree with the
/// file's; a list of seeds is read.
#[test]
fn settings_and_seeds() {
    let (g, seeds) = read_spec(
        Some((
            "generate: training\nseed: [3, 4]\nsteps: 2\n",
            Path::new("g.yaml"),
        )),
        Some("training"),
        &["steps=5".into(), "batch={uniform: [2, 9]}".into()],
    )
    .unwrap();
    assert_eq!(seeds, [3, 4]);
    let Generator::Training(s) = &g else { panic!() };
    assert_eq!((s.seed, s.steps, s.batch.upper_bound()), (3, 5, 9));
    let (g, _) = read_spec(None, Some("inference"), &[]).unwrap();
    assert_eq!(g, Generator::Inference(InferenceSpec::default()));
    let e = read_spec(
        Some(("generate: training\n", Path::new("g.yaml"))),
        Some("inference"),
        &[],
    )
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "g.yaml: line 1: generate: the spec is for 'training', the command line asks for inference"
    );
    let e = read_spec(None, Some("training"), &["steps=many".into()]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "on the command line: steps: 'many' is not a whole number"
    );
    let e = read_spec(None, Some("training"), &["steps".into()]).unwrap_err();
    assert!(
        e.to_string().contains("--set steps: expected KEY=VALUE"),
        "{e}"
    );
}

/// Bad specs: one line naming the file, the line and the key.
#[test]
fn bad_specs_name_file_line_and_key() {
    let cases: &[(&str, &str)] = &[
        ("steps: 2\n", "line 1: generate: missing (which generator: random, training, inference)"),
        ("generate: fractal\n", "line 1: generate: unknown generator 'fractal' (known: random, training, inference)"),
        ("[1, 2]\n", "line 1: a generator spec is a mapping"),
        ("generate: training\nsteps: 2\nstep: 3\n", "line 3: unknown key 'step' of the training generator (known: generate, seed, steps, "),
        ("generate: training\nsteps: -1\n", "line 2: steps: '-1' is not a whole number"),
        ("generate: training\nsteps: 1\nsteps: 2\n", "line 3: steps: given twice (first on line 2)"),
        ("generate: training\nbatch: {uniform: [4]}\n", "line 2: batch: uniform: [MIN, MAX], found 1 numbers"),
        ("generate: training\nbatch: {poisson: 3, uniform: [1, 2]}\n", "line 2: batch: one distribution only"),
        ("generate: training\nbatch: {min: 3}\n", "line 2: batch: no distribution"),
        ("generate: training\nbatch: {normal: [10, -1]}\n", "line 2: batch: normal [10, -1]: "),
        ("generate: training\nseq_len: {uniform: [1, 9], max: 0, min: 4}\n", "line 2: seq_len: min 4 is more than max 0"),
        ("generate: training\nbatch: {gamma: 2}\n", "line 2: unknown key 'gamma' of batch (known: uniform, normal, lognormal, poisson, geometric, min, max)"),
        ("generate: training\noptimizer: lion\n", "line 2: optimizer: unknown optimizer 'lion' (known: sgd, momentum, adam, adamw)"),
        ("generate: training\nlayers:\n  - {params: [8], activations: []}\n", "line 3: layers: 0: activations: at least one (the output)"),
        ("generate: training\nlayers:\n  - {params: [8]}\n", "line 3: layers: 0: activations: missing"),
        ("generate: training\nlayers:\n  - activations: [8]\n  - activations: [8x]\n", "line 4: layers: 1: activations: '8x' is not a number of elements"),
        ("generate: training\nlayers:\n  - {activations: [8], repeat: 0}\n", "line 3: layers: 0: repeat: 0 makes no layer"),
        ("generate: training\nlayers:\n  - {activations: [8], repeat: 100001}\n", "line 3: layers: 0: repeat: 100001 makes no layer or more than 100000 in all"),
        ("generate: training\nlayers:\n  - {activations: [8], shape: 1}\n", "line 3: unknown key 'shape' of layers: 0 (known: params, activations, checkpoint, repeat)"),
        ("generate: training\nlayers: {activations: [8]}\n", "line 2: layers: a list of layers"),
        ("generate: training\nlayers: []\n", "line 2: layers: at least one layer"),
        ("generate: training\nlayers:\n  - {params: [0], activations: [8]}\n", "line 3: layers: layer 0: a tensor of 0 elements"),
        ("generate: training\nstreams: 0\n", "line 2: streams: must be at least 1"),
        ("generate: training\ncheckpoint: sometimes\n", "line 2: checkpoint: 'sometimes' is not true or false"),
        ("generate: training\nbucket_bytes: 25 MiBs\n", "line 2: bucket_bytes: "),
        ("generate: training\nscratch: {count: 2, size: 3}\n", "line 2: unknown key 'size' of scratch (known: count, bytes, lifetime)"),
        ("generate: training\nscratch: {lifetime: {geometric: 0.5}}\n", "line 2: scratch: lifetime: geometric: the mean must be at least 1"),
        ("generate: training\nseed: []\n", "line 2: seed: no seeds given"),
        ("generate: inference\ngrowth: triple\n", "line 2: growth: 'triple' is not exact, double or {block: TOKENS}"),
        ("generate: inference\ngrowth: {block: 0}\n", "line 2: growth: block: must be at least 1 token"),
        ("generate: inference\nkv_heads: 0\n", "line 2: kv_heads: must be at least 1"),
        ("generate: inference\nlayers: 1000000\n", "line 2: layers: at most 100000"),
        ("generate: inference\nprompt_len: {lognormal: [0, 1]}\n", "line 2: prompt_len: lognormal: the median must be above 0"),
        ("generate: inference\nbatches: 3\nhead_dim: [1]\n", "line 3: head_dim: expected a single value, found a list"),
        ("generate: random\nsizes: cubic\n", "line 2: sizes: unknown distribution 'cubic' (known: log-uniform, log-normal)"),
        ("generate: random\nstreams: 0\n", "line 1: the random generator: streams must be at least 1"),
        ("generate: training\nsteps: [1\n", "line 3: not YAML"),
    ];
    for (text, expected) in cases {
        let e = spec(text).unwrap_err();
        let expected = format!("g.yaml: {expected}");
        assert!(
            e.starts_with(&expected),
            "{text:?}:\n  got      {e}\n  expected {expected}"
        );
    }
}

/// A structured generator holds one phase at a time: a long training run is made as it
/// is taken, and `generate_at_most` stops at its bound.
#[test]
fn streaming_and_bounds() {
    let g = spec("generate: training\nsteps: 1000000000\n").unwrap();
    let first: Vec<Event> = g.events().unwrap().take(100).collect();
    assert_eq!(first.len(), 100);
    let e = g.generate_at_most(1000).unwrap_err();
    assert_eq!(
        e.0,
        "the training generator: the trace has more than 1000 events"
    );
}

/// Names: `<kind>-seed<seed>`, and a long name that tells options apart.
#[test]
fn names() {
    let a = spec("generate: training\nseed: 2\n").unwrap();
    let b = spec("generate: training\nseed: 2\nsteps: 3\n").unwrap();
    assert_eq!(a.name(), "training-seed2");
    assert_eq!(a.name(), b.name());
    assert_ne!(a.long_name(), b.long_name());
    assert!(a.long_name().starts_with("training-seed2-"));
}

/// Scratch allocations live their drawn lifetime, counted in alloc and free events
/// (or until the end of their step): with a constant lifetime of 3, each is freed
/// exactly three alloc/free events after its own.
#[test]
fn scratch_lifetimes_are_counted_in_events() {
    let g = spec("generate: training\nsteps: 2\nscratch: {count: 1, bytes: 1000, lifetime: 3}\n")
        .unwrap();
    let t = g.generate().unwrap();
    let mut born = std::collections::HashMap::new();
    let mut n = 0u64;
    let mut lives = Vec::new();
    for e in &t.events {
        match e {
            Event::Alloc { id, size_bytes, .. } => {
                n += 1;
                if *size_bytes == 1000 {
                    born.insert(*id, n);
                }
            }
            Event::Free { id } => {
                n += 1;
                if let Some(b) = born.remove(id) {
                    lives.push(n - b);
                }
            }
            _ => {}
        }
    }
    // One burst per layer's forward and backward: 3 layers × 2 passes × 2 steps.
    assert_eq!(lives.len(), 12);
    assert!(lives.iter().all(|&l| l == 3), "{lives:?}");
}
