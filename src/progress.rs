//! Progress on stderr for work that can run longer than a second: shown only when stderr
//! is a terminal, so pipes, files and tests see nothing of it.

use std::io::IsTerminal as _;

/// Whether progress is drawn: stderr is a terminal.
fn shown() -> bool {
    std::io::stderr().is_terminal()
}

/// A bar of `steps` replays (jobs of `compare`, `fit`, `sweep`, `bench`) on stderr,
/// hidden when stderr is not a terminal. Its message follows the count (a batch sets
/// it to the traces read so far while it still reads them).
pub fn jobs_bar(steps: u64) -> indicatif::ProgressBar {
    if !shown() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(steps);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} {pos}/{len} replays{msg} [{bar:40}] {elapsed_precise}, about {eta} left",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar
}

/// A spinner naming what is being done (reading a trace, checking it, writing one) and
/// for how long, for steps whose length is not known in advance; ticks on its own,
/// cleared when dropped. `None` when stderr is not a terminal.
pub struct Stage(indicatif::ProgressBar);

impl Stage {
    pub fn start(what: String) -> Option<Stage> {
        if !shown() {
            return None;
        }
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            indicatif::ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
                .expect("a valid template"),
        );
        bar.set_message(what);
        bar.enable_steady_tick(std::time::Duration::from_millis(100));
        Some(Stage(bar))
    }

    /// The next step, on the same spinner.
    pub fn set(this: &Option<Stage>, what: String) {
        if let Some(stage) = this {
            stage.0.set_message(what);
        }
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

/// Events replayed so far, on a spinner on stderr (only on a terminal: `None`
/// otherwise), updated every 65 536 events.
pub struct EventSpinner(indicatif::ProgressBar);

impl EventSpinner {
    pub fn on_terminal() -> Option<EventSpinner> {
        if !shown() {
            return None;
        }
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} {human_pos} events replayed in {elapsed}, {rate}",
            )
            .expect("a valid template")
            .with_key(
                "rate",
                |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                    let _ = w.write_str(&events_rate(state.per_sec()));
                },
            ),
        );
        Some(EventSpinner(bar))
    }
}

impl sim::Observer for EventSpinner {
    #[inline]
    fn after_event(&mut self, step: &sim::Step<'_>) {
        if step.index & 0xffff == 0 {
            self.0.set_position(step.index as u64);
        }
    }

    fn needs_stats_every_event(&self) -> bool {
        false
    }

    fn wants_device_ops(&self) -> bool {
        false
    }

    /// No step for what it is: the engine counts the events to the next update
    /// (`period`), with no test of the spinner per event.
    #[inline(always)]
    fn watches(&self, _index: usize, _event: &workloads::Event, _outcome: &sim::Outcome) -> bool {
        false
    }

    /// Every 65 536th event.
    fn period(&self) -> usize {
        0x10000
    }
}

/// A replay's speed for people: `5.65 M events/s`, `812.4 k events/s`, `950 events/s`
/// (indicatif's own `{per_sec}` prints every digit: `5,650,084.5114/s`).
fn events_rate(per_second: f64) -> String {
    let rate = if per_second.is_finite() {
        per_second.max(0.0)
    } else {
        0.0
    };
    if rate < 999.5 {
        format!("{rate:.0} events/s")
    } else if rate < 999_950.0 {
        format!("{:.1} k events/s", rate / 1e3)
    } else {
        format!("{:.2} M events/s", rate / 1e6)
    }
}

impl Drop for EventSpinner {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}

#[cfg(test)]
mod tests {
    use super::events_rate;

    /// The spinner's rate is short and in millions, not every digit of a float.
    #[test]
    fn event_rates_are_readable() {
        assert_eq!(events_rate(5_650_084.511_4), "5.65 M events/s");
        assert_eq!(events_rate(812_400.0), "812.4 k events/s");
        assert_eq!(events_rate(950.4), "950 events/s");
        assert_eq!(events_rate(0.0), "0 events/s");
        assert_eq!(events_rate(f64::NAN), "0 events/s");
        assert_eq!(events_rate(f64::INFINITY), "0 events/s");
        // No "1000 events/s" or "1000.0 k events/s" at the units' edges.
        assert_eq!(events_rate(999.7), "1.0 k events/s");
        assert_eq!(events_rate(999_960.0), "1.00 M events/s");
    }
}
