//! Resident memory of processes, from `/proc/<pid>/status` (Linux): the peak (`VmHWM`) and
//! current (`VmRSS`) resident set, and the processes descending from one (for the browser's).

use std::path::Path;

/// One `kB` field of `/proc/<pid>/status` (such as `VmHWM`), in MB.
pub fn status_mb(pid: u32, field: &str) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = text.lines().find(|l| l.starts_with(&format!("{field}:")))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// The proportional set size (`Pss` of `/proc/<pid>/smaps_rollup`: shared pages counted
/// once across processes), in MB.
pub fn pss_mb(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let line = text.lines().find(|l| l.starts_with("Pss:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// `VmHWM` and `VmRSS` of `pid` as text, `peak X MB (now Y MB)`.
pub fn describe(pid: u32) -> String {
    match (status_mb(pid, "VmHWM"), status_mb(pid, "VmRSS")) {
        (Some(hwm), Some(rss)) => format!("peak {hwm:.0} MB (now {rss:.0} MB)"),
        _ => "unavailable (no /proc)".into(),
    }
}

/// The command name (`comm`) of `pid`.
pub fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_owned())
        .unwrap_or_default()
}

/// Every live process below `root` in the parent tree (not `root` itself).
pub fn descendants(root: u32) -> Vec<u32> {
    let mut parents = Vec::new();
    for entry in std::fs::read_dir(Path::new("/proc"))
        .into_iter()
        .flatten()
        .flatten()
    {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        parents.push((pid, ppid));
    }
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(pid, ppid) in &parents {
            if ppid == p {
                out.push(pid);
                frontier.push(pid);
            }
        }
    }
    out
}
