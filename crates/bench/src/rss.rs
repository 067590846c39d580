//! Peak anonymous host memory (`RssAnon`, the page cache of memory-mapped files aside) of a
//! process, sampled while it runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// `RssAnon` of process `pid` (this process where `None`) in bytes; `None` where it cannot be
/// read (not Linux, or the process is gone).
pub(crate) fn rss_anon_bytes(pid: Option<u32>) -> Option<u64> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_string(),
    };
    let status = std::fs::read_to_string(path).ok()?;
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Samples this process's `RssAnon` every 50 ms on a thread of its own while alive.
pub(crate) struct RssSampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    pub(crate) fn of_this_process() -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(rss_anon_bytes(None).unwrap_or(0)));
        let (s, p) = (stop.clone(), peak.clone());
        let handle = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Some(b) = rss_anon_bytes(None) {
                    p.fetch_max(b, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        RssSampler {
            stop,
            peak,
            handle: Some(handle),
        }
    }

    /// Stops sampling; the peak in GB.
    pub(crate) fn peak_gb(mut self) -> f64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        self.peak.load(Ordering::Relaxed) as f64 / 1e9
    }
}
