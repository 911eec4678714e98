//! Parsers for the Linux `/proc` files the counter sampler reads: `/proc/stat`
//! (machine CPU time), `/proc/self/stat` (this process's CPU time) and
//! `/proc/self/status` (resident memory). Pure functions over text, so they are
//! tested on fixed samples.
//!
//! All CPU times are in clock ticks (`USER_HZ`), the unit both `/proc/stat` and
//! `/proc/self/stat` use, so ratios of their differences need no tick rate.

/// Machine CPU time from the aggregate `cpu` line of `/proc/stat`, summed over
/// all CPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CpuTimes {
    /// user + nice + system + idle + iowait + irq + softirq + steal. (`guest` and
    /// `guest_nice` are already counted in user and nice.)
    pub(crate) total: u64,
    /// idle + iowait.
    pub(crate) idle: u64,
}

/// Parses the aggregate `cpu` line of `/proc/stat`.
pub(crate) fn parse_proc_stat(text: &str) -> Result<CpuTimes, String> {
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some("cpu"))
        .ok_or("no aggregate `cpu` line")?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|f| {
            f.parse()
                .map_err(|_| format!("`{f}` in the `cpu` line is not a tick count"))
        })
        .collect::<Result<_, _>>()?;
    if fields.len() < 4 {
        return Err(format!(
            "the `cpu` line has {} counters; expected at least 4 (user nice system idle)",
            fields.len()
        ));
    }
    let idle = fields[3] + fields.get(4).copied().unwrap_or(0);
    Ok(CpuTimes {
        total: fields.iter().sum(),
        idle,
    })
}

/// This process's user + system CPU time (ticks) from `/proc/self/stat`.
pub(crate) fn parse_self_stat(text: &str) -> Result<u64, String> {
    // The command name (field 2) is in parentheses and may itself contain spaces
    // and parentheses: the fields after it start after the *last* `)`.
    let rest = text
        .rfind(')')
        .map(|i| &text[i + 1..])
        .ok_or("no `)` closing the command name")?;
    // After the name: state is field 3; utime and stime are fields 14 and 15.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize, what: &str| -> Result<u64, String> {
        let f = fields
            .get(i)
            .ok_or_else(|| format!("only {} fields after the command name", fields.len()))?;
        f.parse()
            .map_err(|_| format!("{what} `{f}` is not a tick count"))
    };
    Ok(tick(11, "utime")? + tick(12, "stime")?)
}

/// Resident set size in bytes from the `VmRSS:` line of `/proc/self/status`.
pub(crate) fn parse_vm_rss(text: &str) -> Result<u64, String> {
    parse_status_kb(text, "VmRSS")
}

/// Peak resident set size ("high water mark") in bytes from the `VmHWM:` line of
/// `/proc/self/status`.
pub(crate) fn parse_vm_hwm(text: &str) -> Result<u64, String> {
    parse_status_kb(text, "VmHWM")
}

/// Resets this process's peak resident set size to its current size (writes `5`
/// to `/proc/self/clear_refs`, Linux 4.0 and later), so a later [`peak_rss`] is
/// the peak of what ran since. Returns whether the kernel took it.
pub fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// This process's resident set size in bytes now (`VmRSS` of
/// `/proc/self/status`); `None` where there is no such file (not Linux).
pub fn current_rss() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_rss(&text).ok()
}

/// The `key:` line of `/proc/self/status`, a number of kB, in bytes.
fn parse_status_kb(text: &str, key: &str) -> Result<u64, String> {
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
        .ok_or_else(|| format!("no `{key}:` line"))?;
    let mut it = line.split_whitespace();
    let n: u64 = it
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("`{key}:{line}`: expected a number of kB"))?;
    match it.next() {
        Some("kB") => Ok(n * 1024),
        other => Err(format!(
            "`{key}:{line}`: expected the unit kB, found {other:?}"
        )),
    }
}

/// This process's peak resident set size in bytes so far (`VmHWM` of
/// `/proc/self/status`); `None` where there is no such file (not Linux).
pub fn peak_rss() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    parse_vm_hwm(&text).ok()
}

/// Utilization in percent of the machine (all CPUs) between two `/proc/stat`
/// readings, and this process's share of the machine in percent given its tick
/// counts at the same moments. `None` when no time passed.
pub(crate) fn utilization(
    before: CpuTimes,
    after: CpuTimes,
    proc_before: Option<u64>,
    proc_after: Option<u64>,
) -> Option<(f64, Option<f64>)> {
    let total = after.total.checked_sub(before.total)?;
    if total == 0 {
        return None;
    }
    let idle = after.idle.saturating_sub(before.idle).min(total);
    let machine = 100.0 * (total - idle) as f64 / total as f64;
    let process = match (proc_before, proc_after) {
        (Some(b), Some(a)) => Some((100.0 * a.saturating_sub(b) as f64 / total as f64).min(100.0)),
        _ => None,
    };
    Some((machine, process))
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  4705 356 584 3699176 23060 0 277 0 0 0\n\
                        cpu0 1393280 32966 572056 13343292 6130 0 17875 0 23933 0\n\
                        cpu1 1 2 3 4 5 6 7 8 9 10\n\
                        intr 114930548 113199788 3 0 5 263 0 4 [... lots more numbers ...]\n\
                        ctxt 1990473\nbtime 1062191376\nprocesses 2915\n";

    #[test]
    fn proc_stat_aggregate_line() {
        let t = parse_proc_stat(STAT).unwrap();
        assert_eq!(t.total, 4705 + 356 + 584 + 3_699_176 + 23_060 + 277);
        assert_eq!(t.idle, 3_699_176 + 23_060);
        // Old kernels have only four counters.
        let old = parse_proc_stat("cpu 10 0 5 85\n").unwrap();
        assert_eq!((old.total, old.idle), (100, 85));
    }

    #[test]
    fn proc_stat_errors() {
        assert!(parse_proc_stat("cpu0 1 2 3 4\n")
            .unwrap_err()
            .contains("no aggregate"));
        assert!(parse_proc_stat("cpu 1 2 x 4\n")
            .unwrap_err()
            .contains("`x`"));
        assert!(parse_proc_stat("cpu 1 2\n")
            .unwrap_err()
            .contains("expected at least 4"));
    }

    #[test]
    fn self_stat_with_an_awkward_command_name() {
        let text = "4242 (tan dem) (x)) S 1 4242 4242 0 -1 4194560 1000 0 0 0 \
                    1234 567 0 0 20 0 3 0 100 123456789 2500 18446744073709551615\n";
        assert_eq!(parse_self_stat(text).unwrap(), 1234 + 567);
        assert!(parse_self_stat("12 (x) S 1 2")
            .unwrap_err()
            .contains("only 3 fields"));
        assert!(parse_self_stat("no parens").is_err());
    }

    #[test]
    fn vm_rss() {
        let text = "Name:\ttandem\nVmPeak:\t  200 kB\nVmRSS:\t   51200 kB\nThreads:\t3\n";
        assert_eq!(parse_vm_rss(text).unwrap(), 51_200 * 1024);
        assert!(parse_vm_rss("Name: x\n")
            .unwrap_err()
            .contains("no `VmRSS:`"));
        assert!(parse_vm_rss("VmRSS: 12 MB\n").unwrap_err().contains("kB"));
    }

    #[test]
    fn vm_hwm() {
        let text = "VmPeak:\t  200 kB\nVmHWM:\t   70000 kB\nVmRSS:\t   51200 kB\n";
        assert_eq!(parse_vm_hwm(text).unwrap(), 70_000 * 1024);
        assert_eq!(parse_vm_rss(text).unwrap(), 51_200 * 1024);
        assert!(parse_vm_hwm("VmRSS: 1 kB\n")
            .unwrap_err()
            .contains("no `VmHWM:`"));
    }

    #[test]
    fn utilization_from_differences() {
        let a = CpuTimes {
            total: 1000,
            idle: 800,
        };
        let b = CpuTimes {
            total: 1400,
            idle: 900,
        };
        let (m, p) = utilization(a, b, Some(50), Some(150)).unwrap();
        assert!((m - 75.0).abs() < 1e-12);
        assert!((p.unwrap() - 25.0).abs() < 1e-12);
        assert_eq!(utilization(a, a, None, None), None);
        assert_eq!(utilization(b, a, None, None), None);
        assert_eq!(utilization(a, b, None, Some(3)).unwrap().1, None);
    }

    #[test]
    fn this_machine_parses_when_it_has_proc() {
        let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
            eprintln!("skipping: no /proc/stat here");
            return;
        };
        assert!(parse_proc_stat(&stat).unwrap().total > 0);
        let me = std::fs::read_to_string("/proc/self/stat").unwrap();
        parse_self_stat(&me).unwrap();
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        assert!(parse_vm_rss(&status).unwrap() > 0);
        assert!(peak_rss().unwrap() >= parse_vm_rss(&status).unwrap() / 2);
    }

    /// The environment variable under which [`a_reset_lowers_the_peak`] runs
    /// its check, in a process of its own.
    const ALONE: &str = "TANDEM_PEAK_RSS_CHECK";

    /// A 256 MiB block touched and freed raises the peak; a reset brings it
    /// back down to about the current size. Checked in a child process that
    /// runs only this test: in the test binary's own process, other tests'
    /// threads allocate at the same time and move the peak.
    #[test]
    fn a_reset_lowers_the_peak() {
        if std::fs::metadata("/proc/self/status").is_err() {
            eprintln!("skipping: no /proc/self/status here");
            return;
        }
        if std::env::var_os(ALONE).is_none() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "trace::procfs::tests::a_reset_lowers_the_peak"])
                .args(["--test-threads", "1", "--nocapture"])
                .env(ALONE, "1")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(text.contains("1 passed"), "the child ran no test: {text}");
            return;
        }
        let block = vec![1u8; 256 << 20];
        std::hint::black_box(&block);
        drop(block);
        let high = peak_rss().unwrap();
        if reset_peak_rss() {
            assert!(peak_rss().unwrap() < high, "the reset lowered the peak");
        } else {
            eprintln!("note: /proc/self/clear_refs refused the reset (kernel before 4.0?)");
        }
    }
}
