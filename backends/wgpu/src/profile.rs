//! `DFLASH_WGPU_PROFILE=1`: device time per kernel, from timestamps the GPU writes at the start
//! and the end of each dispatch's compute pass (the adapter's `TIMESTAMP_QUERY`; without it the
//! switch says so once and does nothing).
//!
//! Each submission resolves its dispatches' timestamps and waits for them, so a profiled run
//! serialises the host with the device: the totals per kernel are right, the run's wall-clock
//! throughput is not. The totals go to stderr, largest first, when a backend of the device is
//! dropped (e.g. at the end of `dflash bench` or `dflash train`), and start again from zero.

use std::collections::HashMap;

/// Whether `DFLASH_WGPU_PROFILE` asks for a profile (`1` or `true`).
pub(crate) fn wanted() -> bool {
    static WANTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *WANTED.get_or_init(|| {
        matches!(
            std::env::var("DFLASH_WGPU_PROFILE").as_deref(),
            Ok("1") | Ok("true")
        )
    })
}

/// The timestamps of one encoder's dispatches and the totals so far.
pub(crate) struct Profiler {
    set: wgpu::QuerySet,
    /// `QUERY_RESOLVE` target and its mappable copy, two u64 per dispatch.
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
    capacity: usize,
    ns_per_tick: f64,
    /// The labels of the pending encoder's timed dispatches, in query order: the entry
    /// point, or what [`crate::device::Ctx::profile_label`] gave (a GEMM's shape).
    labels: Vec<String>,
    /// Per label: device nanoseconds and dispatches.
    totals: HashMap<String, (f64, u64)>,
}

impl Profiler {
    /// Room for `capacity` dispatches per submission.
    pub(crate) fn new(device: &wgpu::Device, queue: &wgpu::Queue, capacity: usize) -> Self {
        let bytes = (2 * capacity * 8) as u64;
        let buffer = |label, usage| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        Profiler {
            set: device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("dflash profile"),
                ty: wgpu::QueryType::Timestamp,
                count: 2 * capacity as u32,
            }),
            resolve: buffer(
                "dflash profile resolve",
                wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            ),
            readback: buffer(
                "dflash profile readback",
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            ),
            capacity,
            ns_per_tick: f64::from(queue.get_timestamp_period()),
            labels: Vec::new(),
            totals: HashMap::new(),
        }
    }

    /// The query set and the begin/end indices for the next dispatch, or `None`
    /// when this submission's slots are used up (that dispatch goes untimed).
    pub(crate) fn next(&mut self, label: String) -> Option<(wgpu::QuerySet, u32)> {
        if self.labels.len() >= self.capacity {
            return None;
        }
        let at = 2 * self.labels.len() as u32;
        self.labels.push(label);
        Some((self.set.clone(), at))
    }

    /// Records the resolve of this submission's timestamps at the end of `enc`.
    pub(crate) fn resolve(&self, enc: &mut wgpu::CommandEncoder) {
        let n = self.labels.len();
        if n == 0 {
            return;
        }
        enc.resolve_query_set(&self.set, 0..2 * n as u32, &self.resolve, 0);
        enc.copy_buffer_to_buffer(&self.resolve, 0, &self.readback, 0, (16 * n) as u64);
    }

    /// After the submission: waits for its timestamps and adds them to the totals.
    pub(crate) fn collect(&mut self, device: &wgpu::Device) {
        let n = self.labels.len();
        if n == 0 {
            return;
        }
        let slice = self.readback.slice(0..(16 * n) as u64);
        let (tx, rx) = std::sync::mpsc::channel();
        slice.map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r.is_ok());
        });
        // A device lost meanwhile (wgpu panics on it here) loses this submission's timings;
        // the device-lost callback has recorded the loss, which the next op reports.
        let mapped = match crate::device::errors::wait_idle(device) {
            // After a wait that went well the mapping has resolved, but its callback may be
            // running on another thread whose poll took it: wait for it (as downloads do).
            // Skipping it would leave the buffer mapped, and the next resolve's copy into a
            // mapped buffer would make wgpu reject that whole shared submission.
            crate::device::errors::Waited::Idle => rx.recv().unwrap_or(false),
            // A failed wait may never run the callback: never block on it.
            _ => match rx.try_recv() {
                Ok(ok) => ok,
                Err(std::sync::mpsc::TryRecvError::Empty) => {
                    // Still pending: unmapping cancels the map, so the buffer is free for the
                    // next resolve. The scope keeps what a lost device says about it (or a
                    // map that failed meanwhile) from reaching another op's error log.
                    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
                    self.readback.unmap();
                    let _ = pollster::block_on(scope.pop());
                    false
                }
                Err(std::sync::mpsc::TryRecvError::Disconnected) => false,
            },
        };
        if mapped {
            if let Ok(data) = slice.get_mapped_range() {
                let tick = |j: usize| {
                    let b: [u8; 8] = data[8 * j..8 * j + 8].try_into().expect("8 bytes");
                    u64::from_le_bytes(b)
                };
                for (i, label) in self.labels.drain(..).enumerate() {
                    let ticks = tick(2 * i + 1).saturating_sub(tick(2 * i));
                    let t = self.totals.entry(label).or_default();
                    t.0 += ticks as f64 * self.ns_per_tick;
                    t.1 += 1;
                }
            }
            // Whenever the map succeeded, whether or not its range could be read.
            self.readback.unmap();
        }
        self.labels.clear();
    }

    /// The totals since the last report, largest first, and a fresh start; `None` if empty.
    pub(crate) fn take_report(&mut self) -> Option<String> {
        if self.totals.is_empty() {
            return None;
        }
        let mut rows: Vec<_> = self.totals.drain().collect();
        rows.sort_by(|a, b| b.1.0.total_cmp(&a.1.0));
        let all: f64 = rows.iter().map(|r| r.1.0).sum();
        let mut out = format!(
            "wgpu profile: {:.1} ms of device time in {} kernels\n",
            all / 1e6,
            rows.len()
        );
        for (entry, (ns, count)) in rows {
            out += &format!(
                "  {entry:<40} {:>10.2} ms {:>5.1}% {count:>8} dispatches {:>9.1} us each\n",
                ns / 1e6,
                100.0 * ns / all.max(1.0),
                ns / 1e3 / count as f64
            );
        }
        Some(out)
    }
}
