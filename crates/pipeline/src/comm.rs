//! Host all-reduce between drafter replicas running as threads. Sums in rank order, so the
//! result is identical on every rank and independent of arrival order. An abortable barrier
//! lets a failing replica release the others instead of deadlocking them.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use dflash_core::Communicator;

struct BarrierState {
    arrived: usize,
    generation: u64,
    aborted: bool,
}

/// A reusable barrier whose waiters return an error once any party aborts.
pub struct AbortableBarrier {
    n: usize,
    state: Mutex<BarrierState>,
    cv: Condvar,
}

impl AbortableBarrier {
    pub fn new(n: usize) -> Self {
        AbortableBarrier {
            n,
            state: Mutex::new(BarrierState {
                arrived: 0,
                generation: 0,
                aborted: false,
            }),
            cv: Condvar::new(),
        }
    }

    pub fn wait(&self) -> Result<(), String> {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if s.aborted {
            return Err("aborted: another replica failed".into());
        }
        let generation = s.generation;
        s.arrived += 1;
        if s.arrived == self.n {
            s.arrived = 0;
            s.generation += 1;
            self.cv.notify_all();
            return Ok(());
        }
        while s.generation == generation && !s.aborted {
            s = self
                .cv
                .wait_timeout(s, Duration::from_millis(200))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        if s.aborted {
            Err("aborted: another replica failed".into())
        } else {
            Ok(())
        }
    }

    pub fn abort(&self) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).aborted = true;
        self.cv.notify_all();
    }
}

struct Group {
    slots: Mutex<Vec<Vec<f32>>>,
    barrier: AbortableBarrier,
}

/// One rank's handle of a thread group.
#[derive(Clone)]
pub struct HostComm {
    rank: usize,
    world: usize,
    group: Arc<Group>,
}

impl HostComm {
    /// Handles for ranks `0..world`.
    pub fn group(world: usize) -> Vec<HostComm> {
        let group = Arc::new(Group {
            slots: Mutex::new(vec![Vec::new(); world]),
            barrier: AbortableBarrier::new(world),
        });
        (0..world)
            .map(|rank| HostComm {
                rank,
                world,
                group: group.clone(),
            })
            .collect()
    }

    /// Releases every rank blocked in an all-reduce with an error.
    pub fn abort(&self) {
        self.group.barrier.abort();
    }
}

impl Communicator for HostComm {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<(), String> {
        if self.world == 1 {
            return Ok(());
        }
        self.group.slots.lock().unwrap_or_else(|e| e.into_inner())[self.rank] = data.to_vec();
        self.group.barrier.wait()?;
        {
            let slots = self.group.slots.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(bad) = slots.iter().position(|s| s.len() != data.len()) {
                return Err(format!(
                    "rank {bad} contributed {} values, rank {} {}",
                    slots[bad].len(),
                    self.rank,
                    data.len()
                ));
            }
            for (i, x) in data.iter_mut().enumerate() {
                let mut acc = 0.0f32;
                for s in slots.iter() {
                    acc += s[i];
                }
                *x = acc;
            }
        }
        // Nobody may overwrite a slot before every rank has read all of them.
        self.group.barrier.wait()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_reduce_sums_in_rank_order_on_every_rank() {
        let comms = HostComm::group(3);
        let handles: Vec<_> = comms
            .into_iter()
            .map(|c| {
                std::thread::spawn(move || {
                    let mut v = vec![c.rank() as f32 + 1.0, 10.0 * (c.rank() as f32 + 1.0)];
                    for _ in 0..50 {
                        let mut w = v.clone();
                        c.all_reduce_sum(&mut w).unwrap();
                        assert_eq!(w, vec![6.0, 60.0]);
                    }
                    c.all_reduce_sum(&mut v).unwrap();
                    v
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), vec![6.0, 60.0]);
        }
    }

    #[test]
    fn abort_releases_waiting_ranks() {
        let comms = HostComm::group(2);
        let c1 = comms[1].clone();
        let h = std::thread::spawn(move || c1.all_reduce_sum(&mut [1.0]));
        std::thread::sleep(Duration::from_millis(50));
        comms[0].abort();
        let err = h.join().unwrap().unwrap_err();
        assert!(err.contains("aborted"), "{err}");
    }
}
