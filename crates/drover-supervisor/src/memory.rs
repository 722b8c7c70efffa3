//! A worker's resident memory, read from `/proc` (Linux).

/// Resident set size of process `pid` in bytes, or `None` when it is gone or `/proc` is
/// not there. `VmRSS` in `/proc/PID/status` is in kB, independent of the page size.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_rss(&status)
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line["VmRSS:".len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kb.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vm_rss() {
        let status = "Name:\tnode\nVmPeak:\t  99 kB\nVmRSS:\t   45312 kB\nThreads:\t7\n";
        assert_eq!(parse_vm_rss(status), Some(45312 * 1024));
        assert_eq!(parse_vm_rss("Name:\tkthreadd\n"), None);
        assert_eq!(parse_vm_rss("VmRSS:\tlots kB\n"), None);
    }

    #[test]
    fn own_rss_is_positive() {
        let rss = rss_bytes(std::process::id()).expect("/proc/self/status");
        assert!(rss > 0);
    }
}
