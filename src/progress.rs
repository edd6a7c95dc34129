//! Progress on stderr for work that can run longer than a second: shown only when stderr
//! is a terminal, so pipes, files and tests see nothing of it.

/// Events replayed so far, on a spinner on stderr (only on a terminal: `None`
/// otherwise), updated every 65 536 events.
pub struct EventSpinner(indicatif::ProgressBar);

impl EventSpinner {
    pub fn on_terminal() -> Option<EventSpinner> {
        use std::io::IsTerminal as _;
        if !std::io::stderr().is_terminal() {
            return None;
        }
        let bar = indicatif::ProgressBar::new_spinner();
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} {human_pos} events replayed, {per_sec}",
            )
            .expect("a valid template"),
        );
        Some(EventSpinner(bar))
    }
}

impl sim::Observer for EventSpinner {
    fn after_event(&mut self, step: &sim::Step<'_>) {
        if step.index & 0xffff == 0 {
            self.0.set_position(step.index as u64);
        }
    }
}

impl Drop for EventSpinner {
    fn drop(&mut self) {
        self.0.finish_and_clear();
    }
}
