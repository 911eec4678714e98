//! The CLI's [`Progress`] sink: indicatif bars when stderr is a terminal, plain
//! lines otherwise (logs, pipes, CI), so a long `tandem generate` or `tandem import`
//! says how far it is either way. Standard output is left alone.
//!
//! Plain lines are rate-limited by progress, not by time: one line each time a
//! phase crosses another tenth of its total (at most ten lines per phase), so the
//! output is the same on every run and tests need no clock.

use std::io::{IsTerminal, Write};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use parking_lot::Mutex;

use crate::progress::Progress;

/// Bars on a terminal, plain lines to `out` otherwise.
pub(super) struct CliProgress {
    /// What runs, e.g. `generate rmat`: the prefix of every bar and line.
    label: String,
    state: Mutex<State>,
}

enum Mode {
    Bars(Option<ProgressBar>),
    Lines {
        out: Box<dyn Write + Send>,
        /// The tenths of the phase already printed.
        tenths: Tenths,
        started: Instant,
    },
}

struct State {
    phase: String,
    mode: Mode,
}

impl CliProgress {
    /// Bars on stderr when it is a terminal, plain lines on stderr otherwise.
    pub(super) fn stderr(label: &str) -> Self {
        if std::io::stderr().is_terminal() {
            Self::new(label, Mode::Bars(None))
        } else {
            Self::lines(label, Box::new(std::io::stderr()))
        }
    }

    /// Plain lines to `out`.
    fn lines(label: &str, out: Box<dyn Write + Send>) -> Self {
        Self::new(
            label,
            Mode::Lines {
                out,
                tenths: Tenths::new(),
                started: Instant::now(),
            },
        )
    }

    fn new(label: &str, mode: Mode) -> Self {
        Self {
            label: label.to_string(),
            state: Mutex::new(State {
                phase: String::new(),
                mode,
            }),
        }
    }
}

/// `1.5 GiB` for byte phases, the plain count otherwise.
fn amount(phase: &str, n: u64) -> String {
    if phase == "reading" {
        indicatif::BinaryBytes(n).to_string()
    } else {
        n.to_string()
    }
}

/// The plain lines' rate limit: one line each time progress crosses another
/// tenth of its total (by progress, not time, so the output is the same on
/// every run). `tandem train`'s epoch lines use it too.
#[derive(Clone, Copy, Debug)]
pub(super) struct Tenths {
    /// The next tenth that is news.
    next: u64,
}

impl Tenths {
    pub(super) fn new() -> Self {
        Self { next: 1 }
    }

    /// The tenth (1..=10) that `done` of `total` has reached, when it is past
    /// every tenth returned before; an empty total counts as complete.
    pub(super) fn cross(&mut self, done: u64, total: u64) -> Option<u64> {
        let tenth = (done * 10).checked_div(total).unwrap_or(10);
        (tenth >= self.next).then(|| {
            self.next = tenth + 1;
            tenth
        })
    }
}

impl Progress for CliProgress {
    fn update(&self, phase: &str, done: u64, total: u64) {
        let mut st = self.state.lock();
        let new_phase = st.phase != phase;
        if new_phase {
            st.phase = phase.to_string();
        }
        match &mut st.mode {
            Mode::Bars(bar) => {
                if new_phase {
                    if let Some(old) = bar.take() {
                        old.finish();
                    }
                    let b =
                        ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
                    let counts = if phase == "reading" {
                        "{binary_bytes}/{binary_total_bytes}"
                    } else {
                        "{human_pos}/{human_len}"
                    };
                    let template = format!(
                        "{{prefix}} {{msg:>9}} [{{bar:30}}] {counts} ({{elapsed}}, eta {{eta}})"
                    );
                    if let Ok(style) = ProgressStyle::with_template(&template) {
                        b.set_style(style.progress_chars("=> "));
                    }
                    b.set_prefix(self.label.clone());
                    b.set_message(phase.to_string());
                    *bar = Some(b);
                }
                if let Some(b) = bar {
                    b.set_position(done);
                    if done >= total {
                        b.finish();
                    }
                }
            }
            Mode::Lines {
                out,
                tenths,
                started,
            } => {
                if new_phase {
                    *tenths = Tenths::new();
                    *started = Instant::now();
                }
                if let Some(tenth) = tenths.cross(done, total) {
                    let _ = writeln!(
                        out,
                        "{}: {phase} {:>3}% ({}/{}) {:.1} s",
                        self.label,
                        tenth * 10,
                        amount(phase, done),
                        amount(phase, total),
                        started.elapsed().as_secs_f64()
                    );
                    let _ = out.flush();
                }
            }
        }
    }
}

impl Drop for CliProgress {
    fn drop(&mut self) {
        // A bar left unfinished by an error stops where it was.
        if let Mode::Bars(Some(b)) = &self.state.get_mut().mode {
            if !b.is_finished() {
                b.abandon();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A `Write` whose bytes the test reads back.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn plain_lines_once_per_tenth_and_per_phase() {
        let buf = Shared::default();
        let p = CliProgress::lines("generate rmat", Box::new(buf.clone()));
        for done in 0..=1000 {
            p.update("edges", done, 1000);
        }
        p.update("graph", 0, 1);
        p.update("graph", 1, 1);
        p.update("reading", 0, 0);
        let text = String::from_utf8(buf.0.lock().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 12, "{text}");
        assert!(lines[0].starts_with("generate rmat: edges  10% (100/1000)"));
        assert!(lines[9].starts_with("generate rmat: edges 100% (1000/1000)"));
        assert!(lines[10].starts_with("generate rmat: graph 100% (1/1)"));
        assert!(lines[11].starts_with("generate rmat: reading 100% (0 B/0 B)"));
    }

    #[test]
    fn big_jumps_print_one_line() {
        let buf = Shared::default();
        let p = CliProgress::lines("import edgelist", Box::new(buf.clone()));
        p.update("reading", 0, 4 << 20);
        p.update("reading", 3 << 20, 4 << 20);
        p.update("reading", 4 << 20, 4 << 20);
        let text = String::from_utf8(buf.0.lock().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].contains(" 70% (3.00 MiB/4.00 MiB)"), "{text}");
        assert!(lines[1].contains("100% (4.00 MiB/4.00 MiB)"), "{text}");
    }
}
