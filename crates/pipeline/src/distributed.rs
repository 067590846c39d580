//! Data-parallel training across processes: a launcher (torchrun, SLURM, Kubernetes) starts
//! one `dflash train` per GPU or host with `RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`
//! and `MASTER_PORT` set (`dflash_launch::LaunchEnv`), and the processes form one group
//! (`dflash_launch::ProcessGroup`, TCP through rank 0).
//!
//! Each process runs the whole pipeline of one replica: its loader, its target worker(s)
//! and one drafter replica. Micro-batch `m` of a step belongs to process `m % WORLD_SIZE`
//! (as it belongs to replica `m % D` in one process), and every optimizer step sums the
//! gradients and the loss statistics across the processes in rank order, so `N` processes
//! of one replica each compute what one process with `N` replicas does, bit for bit.
//!
//! Rank 0 owns the run directory: the checkpoints, the served drafter, `summary.json` and the
//! evaluation of tau (the other ranks wait for its measure before training, however long it
//! takes: `Processes::after_lead_work`). Rank `r > 0` keeps its own log (`metrics.jsonl`,
//! `memory_plan.json`, `error.txt`) in `RUN_DIR/rank-r`, and `--resume RUN_DIR` reads rank
//! 0's checkpoints, so every process needs the run directory on a shared file system to
//! resume. The first failure on any rank reaches every other rank through the group, which
//! stops them all.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use dflash_config::{PipelineSection, PlacementMode};
use dflash_core::Communicator;
use dflash_data::SkipCounts;
use dflash_launch::{LaunchEnv, ProcessGroup};

use crate::error::{PipelineError, Result};
use crate::job::JobPlan;
use crate::placement::Placement;
use crate::workers::OnAbort;

/// This process's group of training processes.
pub struct Processes {
    group: Arc<ProcessGroup>,
    env: LaunchEnv,
    /// The group's op timeout: how long a collective waits for the slowest rank.
    timeout: Duration,
}

impl Processes {
    /// The group the launcher's environment describes, connected; `None` for a plain run
    /// (no launcher variables, or `WORLD_SIZE=1`). `timeout` bounds the connection and then
    /// each all-reduce (a step's wait for the slowest rank).
    pub fn from_env(timeout: Duration) -> Result<Option<Processes>> {
        let launch = |e: dflash_launch::LaunchError| PipelineError::Job(format!("launch: {e}"));
        let Some(env) = LaunchEnv::from_env().map_err(launch)? else {
            return Ok(None);
        };
        if env.world_size < 2 {
            return Ok(None);
        }
        eprintln!(
            "rank {} of {} (local rank {}): joining the group at {}:{}",
            env.rank, env.world_size, env.local_rank, env.master_addr, env.master_port
        );
        let group = ProcessGroup::connect(&env, timeout).map_err(launch)?;
        group.set_op_timeout(timeout);
        Ok(Some(Processes {
            group: Arc::new(group),
            env,
            timeout,
        }))
    }

    pub fn rank(&self) -> usize {
        self.env.rank
    }

    pub fn world_size(&self) -> usize {
        self.env.world_size
    }

    pub fn is_lead(&self) -> bool {
        self.env.rank == 0
    }

    /// The communicator of this process's drafter replica.
    pub(crate) fn comm(&self) -> ProcessComm {
        ProcessComm(self.group.clone())
    }

    /// What the run calls on its first failure: tells every other rank that this one
    /// failed, and why, which releases their waits.
    pub(crate) fn abort_handle(&self) -> OnAbort {
        let group = self.group.clone();
        Box::new(move |why| group.abort(why))
    }

    /// Ends a phase of work that rank 0 alone does before training (featurising the
    /// evaluation set and measuring tau: as long as the set makes it), `done` being this
    /// rank's outcome of it. Every rank waits here for every other, the ranks other than 0
    /// beyond the group's op timeout, which bounds a step's wait for the slowest rank and not
    /// work like this: started early, their step 0 would time out in its all-reduce, and
    /// their target workers on full feature queues. A rank 0 that fails or ends still ends
    /// the wait at once: a failure here is told to every rank (and returned), and a process
    /// that ends closes its sockets.
    pub(crate) fn after_lead_work<T>(&self, done: Result<T>) -> Result<T> {
        let value = match done {
            Ok(v) => v,
            Err(e) => {
                self.group.abort(&crate::error::cause_chain(&e));
                return Err(e);
            }
        };
        if !self.is_lead() {
            self.group.set_op_timeout(Duration::MAX);
        }
        let waited = self.group.barrier();
        self.group.set_op_timeout(self.timeout);
        waited.map_err(|e| {
            PipelineError::Job(format!(
                "launch: waiting for every rank before training (rank 0 measures tau first): {e}"
            ))
        })?;
        Ok(value)
    }

    /// Rank 0's `bytes` on every rank (others' are ignored).
    pub(crate) fn broadcast(&self, bytes: &[u8]) -> Result<Vec<u8>> {
        self.group
            .broadcast(bytes)
            .map_err(|e| PipelineError::Job(format!("launch: {e}")))
    }

    /// The run directory every rank shares (rank 0's choice, `proposed` there) and this
    /// rank's own directory in it: the run directory itself on rank 0, `RUN_DIR/rank-r`
    /// elsewhere.
    pub(crate) fn run_dirs(&self, proposed: &Path) -> Result<(PathBuf, PathBuf)> {
        let bytes = proposed.to_string_lossy().into_owned().into_bytes();
        let shared = self.broadcast(&bytes)?;
        let shared = PathBuf::from(String::from_utf8_lossy(&shared).into_owned());
        let own = match self.env.rank {
            0 => shared.clone(),
            r => shared.join(format!("rank-{r}")),
        };
        Ok((shared, own))
    }

    /// Where this process's workers run: a launcher starts one process per GPU and says
    /// which by `LOCAL_RANK`, so, unless the config names devices (or lets `placement =
    /// "auto"` choose), every worker goes on device `LOCAL_RANK` (modulo the `devices` this
    /// process sees: 1 under a per-process `CUDA_VISIBLE_DEVICES`, so device 0).
    pub(crate) fn local_placement(
        &self,
        cfg: &PipelineSection,
        planned: Placement,
        devices: usize,
    ) -> Placement {
        local_placement(self.env.local_rank, cfg, planned, devices)
    }
}

/// `pipeline.placement = "auto"` measures every device this process sees and picks the best
/// split: under a launcher that sees several devices per process, every rank would measure
/// the same devices at once and choose the same ones. Refused there, naming what works.
pub(crate) fn check_auto_placement(
    world_size: usize,
    cfg: &PipelineSection,
    devices: usize,
) -> Result<()> {
    if world_size > 1 && cfg.placement == PlacementMode::Auto && devices > 1 {
        return Err(PipelineError::Job(format!(
            "pipeline.placement = \"auto\" with WORLD_SIZE = {world_size} and {devices} devices \
             visible to each process: every rank would measure and pick the same devices. \
             Leave placement at \"round-robin\" (each rank takes device LOCAL_RANK), or give \
             each process its own devices (CUDA_VISIBLE_DEVICES, or pipeline.target_devices \
             and pipeline.drafter_devices per rank)"
        )));
    }
    Ok(())
}

fn local_placement(
    local_rank: usize,
    cfg: &PipelineSection,
    planned: Placement,
    devices: usize,
) -> Placement {
    let named = cfg.target_devices.is_some() || cfg.drafter_devices.is_some();
    if named || cfg.placement == PlacementMode::Auto || devices < 2 {
        return planned;
    }
    let d = local_rank % devices;
    Placement {
        targets: vec![d; planned.targets.len()],
        drafters: vec![d; planned.drafters.len()],
    }
}

/// Every rank's `mine`, in rank order, on every rank: an all-gather built on the sum (each
/// rank writes its bytes, as f32 values 0..=255, into its own slot of a zeroed buffer, so
/// every sum is exact). For small records (a run's skip counts), not tensors.
pub(crate) fn all_gather_bytes(
    comm: &dyn Communicator,
    mine: &[u8],
    what: &str,
) -> Result<Vec<Vec<u8>>> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let fail = |e: String| PipelineError::Job(format!("gathering the ranks' {what}: {e}"));
    // Lengths first (exact in f32 below 2^24 bytes a rank).
    let mut lens = vec![0.0f32; world];
    lens[rank] = mine.len() as f32;
    comm.all_reduce_sum(&mut lens).map_err(fail)?;
    let lens: Vec<usize> = lens.iter().map(|&l| l as usize).collect();
    let starts: Vec<usize> = lens
        .iter()
        .scan(0, |at, &l| {
            let s = *at;
            *at += l;
            Some(s)
        })
        .collect();
    let mut all = vec![0.0f32; lens.iter().sum()];
    for (slot, &b) in all[starts[rank]..].iter_mut().zip(mine) {
        *slot = f32::from(b);
    }
    comm.all_reduce_sum(&mut all).map_err(fail)?;
    Ok((0..world)
        .map(|r| {
            all[starts[r]..starts[r] + lens[r]]
                .iter()
                .map(|&x| x as u8)
                .collect()
        })
        .collect())
}

/// The skip counts of every rank's share merged in rank order: the whole run's (each rank
/// counts only the samples of its own micro-batches).
pub(crate) fn all_ranks_counts(comm: &dyn Communicator, mine: &SkipCounts) -> Result<SkipCounts> {
    let bytes = serde_json::to_vec(mine).expect("skip counts serialise");
    let mut all = SkipCounts::default();
    for (r, b) in all_gather_bytes(comm, &bytes, "data counts")?
        .iter()
        .enumerate()
    {
        let c: SkipCounts = serde_json::from_slice(b).map_err(|e| {
            PipelineError::Job(format!("rank {r}'s data counts arrived garbled: {e}"))
        })?;
        all.merge(&c);
    }
    Ok(all)
}

/// What every rank must share for the replicas to train one drafter, as `key -> value`: the
/// recipe (the config's `drafter`, `data` and `train` sections; their paths aside, which a
/// node may mount elsewhere), a digest of the schedule the data gives (which samples, of
/// which lengths, each micro-batch of each step holds), and a sampled fingerprint of the
/// target's files (`crate::fingerprint`).
pub(crate) fn agreement_record(plan: &JobPlan) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let c = &plan.cfg;
    for (section, value) in [
        ("drafter", serde_json::to_value(&c.drafter)),
        ("data", serde_json::to_value(&c.data)),
        ("train", serde_json::to_value(&c.train)),
    ] {
        let value = value.unwrap_or_else(|e| serde_json::Value::String(e.to_string()));
        flatten(section, &value, &mut out);
    }
    for path in ["data.train", "data.eval", "drafter.init_from"] {
        out.remove(path);
    }
    out.insert(
        "the drafter's config".into(),
        plan.drafter.to_json().to_string(),
    );
    // `target.path` may differ between hosts; the files there may not.
    out.insert(
        "the target (config and weights, sampled)".into(),
        crate::fingerprint::target_fingerprint(&plan.target),
    );
    let mut h = dflash_data::rng::Fnv1a::default();
    for step in &plan.schedule.steps {
        step.epoch.hash(&mut h);
        for micro in &step.micro {
            for &i in micro {
                (i, plan.lengths.get(i)).hash(&mut h);
            }
            usize::MAX.hash(&mut h);
        }
    }
    out.insert(
        "the schedule (samples and lengths of each micro-batch)".into(),
        format!("{:016x}", h.finish()),
    );
    out
}

fn flatten(key: &str, v: &serde_json::Value, out: &mut BTreeMap<String, String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                flatten(&format!("{key}.{k}"), v, out);
            }
        }
        v => {
            out.insert(key.to_string(), v.to_string());
        }
    }
}

/// Every rank's `mine` ([`agreement_record`]) against rank 0's: on every rank alike, an error
/// naming the first rank that differs and each key where it does. A per-rank `--set` (such as
/// `train.seed=$RANK`) or a data file that differs between nodes would otherwise train the
/// replicas on different things without a word.
pub(crate) fn check_ranks_agree(
    comm: &dyn Communicator,
    mine: &BTreeMap<String, String>,
) -> Result<()> {
    let bytes = serde_json::to_vec(mine).expect("a map of strings serialises");
    let all = all_gather_bytes(comm, &bytes, "job descriptions")?;
    let records: Vec<BTreeMap<String, String>> = all
        .iter()
        .enumerate()
        .map(|(r, b)| {
            serde_json::from_slice(b).map_err(|e| {
                PipelineError::Job(format!("rank {r}'s job description arrived garbled: {e}"))
            })
        })
        .collect::<Result<_>>()?;
    let lead = &records[0];
    for (r, rec) in records.iter().enumerate().skip(1) {
        let keys: std::collections::BTreeSet<&String> = lead.keys().chain(rec.keys()).collect();
        let differ: Vec<String> = keys
            .into_iter()
            .filter(|k| lead.get(*k) != rec.get(*k))
            .map(|k| {
                let show = |v: Option<&String>| v.map_or("nothing".into(), Clone::clone);
                format!(
                    "{k} is {} on rank 0 and {} on rank {r}",
                    show(lead.get(k)),
                    show(rec.get(k))
                )
            })
            .collect();
        if !differ.is_empty() {
            return Err(PipelineError::Job(format!(
                "the ranks do not run one job: {}; every rank must run the same recipe on the \
                 same data (check per-rank --set values and each node's data files)",
                differ.join("; ")
            )));
        }
    }
    Ok(())
}

/// The all-reduce of a replica across the processes.
pub(crate) struct ProcessComm(Arc<ProcessGroup>);

impl Communicator for ProcessComm {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn world_size(&self) -> usize {
        self.0.world_size()
    }
    fn all_reduce_sum(&self, data: &mut [f32]) -> std::result::Result<(), String> {
        self.0.all_reduce_sum(data).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn planned() -> Placement {
        Placement {
            targets: vec![0, 1],
            drafters: vec![2],
        }
    }

    #[test]
    fn all_gather_bytes_gives_every_rank_each_ranks_bytes_in_order() {
        let comms = crate::comm::HostComm::group(3);
        let mine =
            |r: usize| -> Vec<u8> { (0..(5 * r + 1)).map(|i| (i * 97 + r * 31) as u8).collect() };
        let got: Vec<Vec<Vec<u8>>> = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|c| {
                    s.spawn(move || all_gather_bytes(c, &mine(c.rank()), "test bytes").unwrap())
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let want: Vec<Vec<u8>> = (0..3).map(mine).collect();
        for (r, g) in got.iter().enumerate() {
            assert_eq!(g, &want, "rank {r}");
        }
    }

    #[test]
    fn ranks_that_disagree_are_refused_on_every_rank_naming_each_difference() {
        let rec = |seed: &str, sched: &str| -> BTreeMap<String, String> {
            [
                ("train.seed", seed),
                ("train.lr", "0.0006"),
                ("schedule", sched),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
        };
        let run = |records: Vec<BTreeMap<String, String>>| -> Vec<Result<()>> {
            let comms = crate::comm::HostComm::group(records.len());
            std::thread::scope(|s| {
                let hs: Vec<_> = comms
                    .iter()
                    .zip(&records)
                    .map(|(c, r)| s.spawn(move || check_ranks_agree(c, r)))
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            })
        };
        for r in run(vec![rec("0", "ab"); 3]) {
            r.unwrap();
        }
        let results = run(vec![rec("0", "ab"), rec("0", "ab"), rec("2", "cd")]);
        for r in results {
            let e = r.unwrap_err().to_string();
            assert!(
                e.contains("train.seed is 0 on rank 0 and 2 on rank 2")
                    && e.contains("schedule is ab on rank 0 and cd on rank 2")
                    && !e.contains("train.lr"),
                "{e}"
            );
        }
    }

    #[test]
    fn auto_placement_under_a_launcher_is_refused_where_ranks_share_devices() {
        let auto = PipelineSection {
            placement: PlacementMode::Auto,
            ..PipelineSection::default()
        };
        let e = check_auto_placement(2, &auto, 8).unwrap_err().to_string();
        assert!(
            e.contains("pipeline.placement") && e.contains("LOCAL_RANK"),
            "{e}"
        );
        // One process, one device a process, or round robin: as planned.
        check_auto_placement(1, &auto, 8).unwrap();
        check_auto_placement(4, &auto, 1).unwrap();
        check_auto_placement(4, &PipelineSection::default(), 8).unwrap();
    }

    #[test]
    fn a_rank_runs_on_its_local_gpu_unless_the_config_places_it() {
        let cfg = PipelineSection::default();
        // Four GPUs on the host, local rank 5: device 1 for every worker.
        let p = local_placement(5, &cfg, planned(), 4);
        assert_eq!((p.targets, p.drafters), (vec![1, 1], vec![1]));
        // One visible device (CUDA_VISIBLE_DEVICES per process) or a CPU: as planned.
        assert_eq!(local_placement(5, &cfg, planned(), 1), planned());
        let named = PipelineSection {
            drafter_devices: Some(vec![3]),
            ..PipelineSection::default()
        };
        assert_eq!(local_placement(2, &named, planned(), 4), planned());
        let auto = PipelineSection {
            placement: PlacementMode::Auto,
            ..PipelineSection::default()
        };
        assert_eq!(local_placement(2, &auto, planned(), 4), planned());
    }
}
