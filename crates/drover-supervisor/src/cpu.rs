//! How busy a worker's main thread is, read from `/proc` (Linux).
//!
//! The balancer holds requests back in its own queue only while a backend's CPU is
//! saturated (`drover_balance::Endpoint::is_saturated`): from latency alone it cannot
//! tell a request that works from one that waits on a timer or a database. Backends may
//! say it themselves (`endpoint-load-metrics`); for the workers it runs, drover reads
//! it without asking them. The main thread is what counts: it is a Node worker's event
//! loop and a Python worker's interpreter, and when it is busy every request waits. A
//! runtime that serves on many threads (Go) keeps its main thread mostly idle and so is
//! never held back, which is right: it runs requests in parallel.

use std::time::Instant;

/// How long the main thread of `pid` has been busy, in ns: running, or runnable and
/// waiting for a core. Both count, because a thread that waits for a core has work to do
/// and every request behind it waits too (on a machine with more busy threads than cores
/// a saturated worker runs well under 100 % of the time). `None` when it is gone or
/// `/proc` is not there. `schedstat` (time on a core, time waiting on a run queue) is
/// exact; `stat`'s utime and stime (clock ticks, 100 per second on Linux; no run-queue
/// time) are the fallback.
pub fn main_thread_busy_ns(pid: u32) -> Option<u64> {
    main_thread_ns(pid, true)
}

/// How long the main thread of `pid` has run on a core, in ns: `main_thread_busy_ns`
/// without the time it waited for one. On a machine that other processes' load
/// starves, a worker is busy all the time (it has work, and waits for a core) but
/// computes little: what a request has computed is the time it ran.
pub fn main_thread_run_ns(pid: u32) -> Option<u64> {
    main_thread_ns(pid, false)
}

fn main_thread_ns(pid: u32, with_waits: bool) -> Option<u64> {
    let task = format!("/proc/{pid}/task/{pid}");
    if let Some((running, waiting)) = std::fs::read_to_string(format!("{task}/schedstat"))
        .ok()
        .and_then(|s| parse_schedstat_parts(&s))
    {
        return Some(if with_waits {
            running + waiting
        } else {
            running
        });
    }
    let stat = std::fs::read_to_string(format!("{task}/stat")).ok()?;
    Stat::parse(&stat).map(|s| s.ticks * 10_000_000)
}

/// Busy and running time (ns, as `main_thread_busy_ns` and `main_thread_run_ns`) of
/// each thread of each process in process group `group`, by thread id (unique across
/// the machine while the thread lives). A pre-fork server (gunicorn, Puma, Apache's
/// prefork) works in children of the process drover started, whose main thread only
/// waits; Go and Java serve on threads other than the main one. Walks `/proc`: for rare
/// looks (while a worker's checks fail).
pub fn group_thread_times(group: u32) -> std::collections::HashMap<u32, ThreadTimes> {
    thread_times(&crate::listening::group_members(group))
}

/// `group_thread_times` of the processes `pids`, found already.
pub(crate) fn thread_times(pids: &[u32]) -> std::collections::HashMap<u32, ThreadTimes> {
    let mut times = std::collections::HashMap::new();
    for &pid in pids {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let Some(tid) = task
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some((run, wait)) = std::fs::read_to_string(task.path().join("schedstat"))
                .ok()
                .and_then(|s| parse_schedstat_parts(&s))
            {
                times.insert(
                    tid,
                    ThreadTimes {
                        busy: run + wait,
                        run,
                    },
                );
            }
        }
    }
    times
}

/// One thread's time so far, in ns: busy (running, or runnable and waiting for a core)
/// and running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadTimes {
    pub busy: u64,
    pub run: u64,
}

/// The thread that was busy longest between two readings of `group_thread_times`: its
/// busy and running time meanwhile. A thread that began since counts from zero.
pub fn busiest_since(
    then: &std::collections::HashMap<u32, ThreadTimes>,
    now: &std::collections::HashMap<u32, ThreadTimes>,
) -> Option<ThreadTimes> {
    now.iter()
        .map(|(tid, now)| {
            let then = then
                .get(tid)
                .copied()
                .unwrap_or(ThreadTimes { busy: 0, run: 0 });
            ThreadTimes {
                busy: now.busy.saturating_sub(then.busy),
                run: now.run.saturating_sub(then.run),
            }
        })
        .max_by_key(|spent| spent.busy)
}

/// Linux reports `stat`'s times in clock ticks of `USER_HZ`, which is 100 on every
/// architecture drover builds for (it is part of the user-space ABI, unlike `HZ`).
const USER_HZ: f64 = 100.0;

/// CPU time (user + system) all threads of process `pid` have used so far, in seconds,
/// from `/proc/PID/stat`; `None` when it is gone or `/proc` is not there. Children it
/// waited for are not counted: they are processes of their own.
pub fn process_cpu_seconds(pid: u32) -> Option<f64> {
    Stat::of(pid).map(|s| s.ticks as f64 / USER_HZ)
}

/// How many read and write system calls the main thread of `pid` has made (`syscr` +
/// `syscw` of `/proc/PID/task/PID/io`): one that computes in an endless loop makes
/// none, one that answers requests or logs does. `None` when it is gone or unreadable.
pub fn main_thread_io_calls(pid: u32) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/io")).ok()?;
    parse_io_calls(&io)
}

fn parse_io_calls(io: &str) -> Option<u64> {
    let field = |name: &str| {
        io.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse::<u64>().ok())
    };
    Some(field("syscr:")? + field("syscw:")?)
}

/// Whether process `pid` is stopped (`T`: SIGSTOP, SIGTSTP; `t`: a tracer holds it),
/// from the state field of `/proc/PID/stat`. A stopped process answers nothing and
/// acts on no signal but SIGKILL and SIGCONT.
pub fn is_stopped(pid: u32) -> bool {
    Stat::of(pid).is_some_and(|s| matches!(s.state, 'T' | 't'))
}

/// The process group `pid` is in (`stat`'s fifth field); `None` when it is gone.
pub fn process_group(pid: u32) -> Option<u32> {
    Stat::of(pid).map(|s| s.group)
}

/// Whether process `pid` has ended: gone from `/proc`, or a zombie its parent has not
/// reaped yet. `false` when `/proc` cannot tell (not mounted).
pub fn has_ended(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => Stat::parse(&stat).is_some_and(|s| s.has_ended()),
        Err(_) => std::path::Path::new("/proc/self/stat").exists(),
    }
}

/// Whether process `pid`, once in process group `group`, is gone from it: ended, or its
/// pid now names a process of another group (the pid was reused).
pub fn has_left_group(pid: u32, group: u32) -> bool {
    has_ended(pid) || process_group(pid).is_some_and(|now| now != group)
}

/// How long ago the youngest running child of process `pid` started; `None` when it has
/// none (zombies and stopped children do not count: neither will finish anything) or
/// `/proc` cannot tell. A worker whose main thread blocks on a program it ran
/// synchronously (Node's `execSync`, Python's `subprocess.run`) answers nothing, while
/// that program works. Linux lists a process's children only per thread, and only with
/// `CONFIG_PROC_CHILDREN`, so this reads every process's parent: a few hundred small
/// files, read only while a worker's probes fail.
pub fn youngest_child_age(pid: u32) -> Option<std::time::Duration> {
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?;
    let now_ticks = uptime.split_whitespace().next()?.parse::<f64>().ok()? * USER_HZ;
    let mut youngest: Option<u64> = None;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(child) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(s) = Stat::of(child) {
            if s.parent == pid && !s.has_ended() && !matches!(s.state, 'T' | 't') {
                youngest = Some(youngest.map_or(s.started, |y| y.max(s.started)));
            }
        }
    }
    let age_ticks = (now_ticks - youngest? as f64).max(0.0);
    Some(std::time::Duration::from_secs_f64(age_ticks / USER_HZ))
}

/// The fields of `/proc/PID/stat` drover reads; one parser for every reader (liveness,
/// CPU, process groups, orphans and zombies).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Stat {
    /// Field 3: `R`, `S`, `D`, `T`/`t` (stopped), `Z` (zombie), `X` (dead)…
    pub state: char,
    /// Field 4: the parent's pid.
    pub parent: u32,
    /// Field 5: the process group.
    pub group: u32,
    /// Fields 14 and 15: user and system CPU time, in clock ticks.
    pub ticks: u64,
    /// Field 22: when it started, in clock ticks after boot.
    pub started: u64,
}

impl Stat {
    /// Process `pid`'s, from `/proc`; `None` when it is gone or `/proc` is not there.
    pub(crate) fn of(pid: u32) -> Option<Stat> {
        Stat::parse(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
    }

    /// Fields are counted after the `)` that ends the command name, which may itself
    /// hold spaces and parentheses.
    pub(crate) fn parse(s: &str) -> Option<Stat> {
        let mut fields = s[s.rfind(')')? + 1..].split_whitespace();
        let state = fields.next()?.chars().next()?;
        let parent = fields.next()?.parse().ok()?;
        let group = fields.next()?.parse().ok()?;
        // Fields 6 to 13: session, tty, its group, flags, four fault counts.
        let mut fields = fields.skip(8);
        let utime: u64 = fields.next()?.parse().ok()?;
        let stime: u64 = fields.next()?.parse().ok()?;
        // Fields 16 to 21: children's times, priority, nice, threads, itrealvalue.
        let started = fields.nth(6)?.parse().ok()?;
        Some(Stat {
            state,
            parent,
            group,
            ticks: utime + stime,
            started,
        })
    }

    /// A zombie (its parent has not reaped it) or dead.
    pub(crate) fn has_ended(&self) -> bool {
        matches!(self.state, 'Z' | 'X')
    }
}

fn parse_schedstat(s: &str) -> Option<u64> {
    parse_schedstat_parts(s).map(|(running, waiting)| running + waiting)
}

/// `schedstat`'s time on a core and time waiting on a run queue, in ns.
fn parse_schedstat_parts(s: &str) -> Option<(u64, u64)> {
    let mut fields = s.split_whitespace().map(str::parse::<u64>);
    let running = fields.next()?.ok()?;
    let waiting = fields.next()?.ok()?;
    Some((running, waiting))
}

/// Turns successive readings of one process into utilisation (1.0 = the main thread
/// ran the whole time).
///
/// It keeps the main thread's `schedstat` (or `stat`) open and reads it again from
/// offset 0, which `/proc` answers with fresh figures: one `pread` per sample, where
/// opening the file by path each time took five calls (`openat`, `statx`, two `read`s,
/// `close`). drover samples every serving worker 40 times a second, so with 8 workers
/// that was 1,600 calls a second, idle or not. The open file names the task, not the
/// number: once the process is gone it reads as an error, even if its pid is reused.
#[derive(Debug, Default)]
pub struct CpuMeter {
    source: Option<BusySource>,
    last: Option<(u64, Instant)>,
}

#[derive(Debug)]
struct BusySource {
    pid: u32,
    /// `None` once it could not be opened or read: the process is gone, and a process
    /// with this pid later is another one.
    file: Option<std::fs::File>,
    /// `schedstat` (ns running + waiting), or else `stat` (ticks of user + system time).
    schedstat: bool,
}

impl BusySource {
    fn open(pid: u32) -> BusySource {
        let task = format!("/proc/{pid}/task/{pid}");
        let open = |name: &str| std::fs::File::open(format!("{task}/{name}")).ok();
        let schedstat = BusySource {
            pid,
            file: open("schedstat"),
            schedstat: true,
        };
        if schedstat.busy_ns().is_some() {
            return schedstat;
        }
        BusySource {
            pid,
            file: open("stat"),
            schedstat: false,
        }
    }

    fn busy_ns(&self) -> Option<u64> {
        use std::os::unix::fs::FileExt;
        // `stat` is one line of a few hundred bytes (the command name is 15 at most);
        // `schedstat` is three numbers.
        let mut buf = [0u8; 1024];
        let len = self.file.as_ref()?.read_at(&mut buf, 0).ok()?;
        let text = std::str::from_utf8(&buf[..len]).ok()?;
        if self.schedstat {
            parse_schedstat(text)
        } else {
            Stat::parse(text).map(|s| s.ticks * 10_000_000)
        }
    }
}

impl CpuMeter {
    /// The share of wall time `pid`'s main thread was busy since the last call for the
    /// same pid; `None` on the first call for a pid, or when it cannot be read.
    pub fn sample(&mut self, pid: u32) -> Option<f64> {
        let source = match &mut self.source {
            Some(source) if source.pid == pid => source,
            other => {
                self.last = None;
                other.insert(BusySource::open(pid))
            }
        };
        let Some(cpu) = source.busy_ns() else {
            source.file = None;
            self.last = None;
            return None;
        };
        let now = Instant::now();
        let (last_cpu, at) = self.last.replace((cpu, now))?;
        let wall = now.duration_since(at).as_nanos() as f64;
        (wall > 0.0).then(|| cpu.saturating_sub(last_cpu) as f64 / wall)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_calls_are_reads_and_writes() {
        let io = "rchar: 281771\nwchar: 13393\nsyscr: 73828\nsyscw: 539\nread_bytes: 0\n";
        assert_eq!(parse_io_calls(io), Some(74367));
        assert_eq!(parse_io_calls("rchar: 1\nsyscr: 2\n"), None);
        assert_eq!(parse_io_calls("syscr: x\nsyscw: 1\n"), None);
        let own = main_thread_io_calls(std::process::id()).expect("this test's own thread");
        assert!(own > 0);
    }

    #[test]
    fn the_busiest_thread_counts_a_new_one_from_zero() {
        let t = |busy, run| ThreadTimes { busy, run };
        let then = std::collections::HashMap::from([(1, t(100, 90)), (2, t(50, 50))]);
        let now =
            std::collections::HashMap::from([(1, t(150, 120)), (2, t(400, 100)), (3, t(80, 80))]);
        assert_eq!(busiest_since(&then, &now), Some(t(350, 50)));
        let only_new = std::collections::HashMap::from([(3, t(80, 80))]);
        assert_eq!(busiest_since(&then, &only_new), Some(t(80, 80)));
        assert_eq!(
            busiest_since(&then, &std::collections::HashMap::new()),
            None
        );
    }

    #[test]
    fn reads_every_thread_of_its_own_group() {
        let group = process_group(std::process::id()).unwrap();
        let times = group_thread_times(group);
        // `/proc/thread-self` links to `PID/task/TID`.
        let me: u32 = std::fs::read_link("/proc/thread-self")
            .unwrap()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        assert!(times.contains_key(&me), "{times:?}");
    }

    #[test]
    fn parses_schedstat_and_stat() {
        assert_eq!(
            parse_schedstat("116207129 38038077 258\n"),
            Some(116_207_129 + 38_038_077)
        );
        assert_eq!(parse_schedstat(""), None);
        assert_eq!(parse_schedstat("12 x 3"), None);
        // A command name with spaces and parentheses of its own.
        let stat = "4243 (node (worker) 1) S 4242 4242 4242 0 -1 4194560 1234 0 0 0 250 30 0 0 20 0 11 0 123456 5816320 239";
        assert_eq!(
            Stat::parse(stat),
            Some(Stat {
                state: 'S',
                parent: 4242,
                group: 4242,
                ticks: 280,
                started: 123_456
            })
        );
        let zombie = "4300 (a) b) Z 1 4300 4300 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 99 0 0";
        assert!(Stat::parse(zombie).unwrap().has_ended());
        assert_eq!(Stat::parse("4300 (sleep) S 4242 4242"), None);
        assert_eq!(Stat::parse("garbage"), None);
        // This process's own, as the kernel writes it.
        let me = Stat::of(std::process::id()).unwrap();
        assert_eq!(Some(me.group), process_group(std::process::id()));
        assert!(!me.has_ended());
    }

    #[test]
    fn a_child_just_started_is_young_and_none_is_none() {
        let me = std::process::id();
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let age = youngest_child_age(me).expect("a running child");
        assert!(age < std::time::Duration::from_secs(20), "{age:?}");
        child.kill().unwrap();
        child.wait().unwrap();
        // A process with no children (the child's pid, now gone, has none).
        assert_eq!(youngest_child_age(child.id()), None);
    }

    #[test]
    fn a_child_reads_as_ended_once_it_exits_reaped_or_not() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        assert!(!has_ended(child.id()));
        assert_eq!(
            process_group(child.id()),
            process_group(std::process::id()),
            "a child stays in its parent's group"
        );
        let group = process_group(child.id()).unwrap();
        assert!(!has_left_group(child.id(), group));
        assert!(
            has_left_group(child.id(), group + 1),
            "a pid found in another group is not the process drover knew"
        );
        child.kill().unwrap();
        // Not reaped yet: a zombie.
        let ended = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            has_ended(child.id())
        });
        assert!(ended);
        child.wait().unwrap();
        assert!(has_ended(child.id()));
    }

    #[test]
    fn a_stopped_process_reads_as_stopped() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = nix::unistd::Pid::from_raw(child.id() as i32);
        assert!(!is_stopped(child.id()));
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
        let stopped = (0..200).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(10));
            is_stopped(child.id())
        });
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(stopped);
        assert!(!is_stopped(u32::MAX), "no such process");
    }

    #[test]
    fn a_meter_reads_nothing_once_its_process_is_gone() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let mut meter = CpuMeter::default();
        assert_eq!(meter.sample(child.id()), None, "no window yet");
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(meter.sample(child.id()).is_some_and(|busy| busy < 0.5));
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(meter.sample(child.id()), None, "reaped");
        assert_eq!(meter.sample(child.id()), None, "and not opened again");
        // Where `schedstat` is missing, `stat`'s ticks are read the same way.
        let pid = std::process::id();
        let stat = BusySource {
            pid,
            file: std::fs::File::open(format!("/proc/{pid}/task/{pid}/stat")).ok(),
            schedstat: false,
        };
        assert!(stat.busy_ns().is_some());
        // The same meter takes the next process afresh.
        assert_eq!(meter.sample(pid), None);
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(meter.sample(pid).is_some());
    }

    #[test]
    fn a_spinning_thread_reads_as_busy_and_a_sleeping_one_as_idle() {
        let pid = std::process::id();
        let spin = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        let sleep = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let (mut a, mut b) = (CpuMeter::default(), CpuMeter::default());
        assert_eq!(a.sample(spin.id()), None);
        assert_eq!(b.sample(sleep.id()), None);
        std::thread::sleep(std::time::Duration::from_millis(400));
        let busy = a.sample(spin.id()).unwrap();
        let idle = b.sample(sleep.id()).unwrap();
        // The spinner has run for at least a few clock ticks of its own.
        let spun = process_cpu_seconds(spin.id()).unwrap();
        for mut child in [spin, sleep] {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Running or waiting for a core, the spinner is busy all the time.
        assert!(busy > 0.9, "spinning: {busy}");
        assert!(idle < 0.05, "sleeping: {idle}");
        assert!(spun > 0.0, "spinner used no CPU time: {spun}");
        assert!(main_thread_busy_ns(pid).is_some());
        assert!(process_cpu_seconds(pid).is_some_and(|s| s >= 0.0));
        assert_eq!(process_cpu_seconds(u32::MAX), None);
    }
}
