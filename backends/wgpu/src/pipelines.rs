//! WGSL compiled once per device into cached compute pipelines, the bind-group layouts they
//! share, and the recording of dispatches into one pending command encoder.
//!
//! Binding convention of every kernel: `@binding(0)` is a uniform block of parameters, then
//! the read-only storage buffers, then the read-write ones, all in group 0. Layouts are keyed
//! by `(reads, writes)` and shared by every pipeline with that signature.
//!
//! Work is recorded, not submitted: every op appends its compute passes (and buffer copies) to
//! the device's pending encoder, which is submitted when something must reach the host
//! (a download, a statistic, `synchronize`) or after [`FLUSH_EVERY`] dispatches, so a step is
//! a few submissions instead of one per kernel (wgpu's submission cost is large). Buffers
//! written from the host are always fresh (nothing pending reads them), except in-place host
//! writes, which flush first ([`crate::WgpuBackend::write_existing`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use dflash_core::{Error, Result};

use crate::device::Ctx;
use crate::device::errors::{self, Origin};

mod source;
pub(crate) use source::Family;
use source::runtime_checks;

/// Dispatches recorded before the pending encoder is submitted anyway (bounds the memory the
/// encoder's uniform blocks and bind groups hold).
const FLUSH_EVERY: usize = 256;

/// 32-bit words of every uniform block (the largest parameter struct has 16).
const UNIFORM_WORDS: usize = 16;
const UNIFORM_BYTES: u64 = UNIFORM_WORDS as u64 * 4;

/// One entry point of a family, with its pipeline-overridable constants.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Kernel<'a> {
    pub family: Family,
    pub entry: &'static str,
    pub consts: &'a [(&'static str, f64)],
    /// For the families that reduce rows: the subgroup variant of their reductions (the
    /// device must have `SUBGROUP`); ignored by the others.
    pub subgroups: bool,
}

impl Kernel<'static> {
    pub(crate) const fn new(family: Family, entry: &'static str) -> Self {
        Kernel {
            family,
            entry,
            consts: &[],
            subgroups: false,
        }
    }
}

impl<'a> Kernel<'a> {
    /// This kernel with its family's reductions on subgroups (`on`) or workgroup memory.
    pub(crate) const fn with_subgroups(self, on: bool) -> Self {
        Kernel {
            subgroups: on,
            ..self
        }
    }

    /// The module variant the kernel needs: its family, and the reduction variant where the
    /// family has two.
    fn module_key(&self) -> (Family, bool) {
        (self.family, self.subgroups && self.family.reduces())
    }
}

/// A byte range of a buffer bound to one storage binding.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bind<'a> {
    pub buf: &'a wgpu::Buffer,
    pub offset: u64,
    pub size: u64,
}

type Layouts = (Arc<wgpu::BindGroupLayout>, Arc<wgpu::PipelineLayout>);

/// The per-device caches.
pub(crate) struct Pipelines {
    modules: Mutex<HashMap<(Family, bool), Arc<wgpu::ShaderModule>>>,
    layouts: Mutex<HashMap<(u32, u32), Layouts>>,
    pipelines: Mutex<HashMap<String, Arc<wgpu::ComputePipeline>>>,
}

impl Pipelines {
    pub(crate) fn new(_device: &wgpu::Device) -> Self {
        Pipelines {
            modules: Mutex::default(),
            layouts: Mutex::default(),
            pipelines: Mutex::default(),
        }
    }
}

/// The encoder that ops record into, submitted by [`Ctx::flush`].
#[derive(Default)]
pub(crate) struct Pending {
    encoder: Option<wgpu::CommandEncoder>,
    recorded: usize,
    /// The uniform blocks of the encoder's dispatches: slot `recorded` of this ring is the
    /// block of the record being made, written with `queue.write_buffer` (applied at the
    /// next submit, before that submit's commands run and after every earlier submit's), so
    /// the ring is reused from slot 0 after each submit. One buffer for all dispatches
    /// instead of a new one per dispatch.
    uniforms: Option<(wgpu::Buffer, u64)>,
    /// `DFLASH_WGPU_PROFILE`: the dispatches' timestamps (made on the first dispatch).
    profile: Option<crate::profile::Profiler>,
    /// The profile's label for the next dispatch in place of its entry point.
    next_label: Option<String>,
    /// Who recorded the encoder's commands (`None`: recorded outside any backend instance's
    /// op), each once: told if the device rejects the submission
    /// ([`crate::device::errors::ErrorLog::rejected`]).
    origins: Vec<Option<Origin>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Ctx {
    fn layouts(&self, reads: u32, writes: u32) -> Layouts {
        let mut cache = lock(&self.pipelines.layouts);
        if let Some(l) = cache.get(&(reads, writes)) {
            return l.clone();
        }
        let storage = |read_only| wgpu::BindingType::Buffer {
            ty: wgpu::BufferBindingType::Storage { read_only },
            has_dynamic_offset: false,
            min_binding_size: None,
        };
        let mut entries = vec![wgpu::BindGroupLayoutEntry {
            binding: 0,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Uniform,
                has_dynamic_offset: true,
                min_binding_size: wgpu::BufferSize::new(UNIFORM_BYTES),
            },
            count: None,
        }];
        for i in 0..reads + writes {
            entries.push(wgpu::BindGroupLayoutEntry {
                binding: 1 + i,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: storage(i < reads),
                count: None,
            });
        }
        let bgl = self
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: Some("dflash"),
                entries: &entries,
            });
        let pl = self
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: Some("dflash"),
                bind_group_layouts: &[Some(&bgl)],
                immediate_size: 0,
            });
        let l = (Arc::new(bgl), Arc::new(pl));
        cache.insert((reads, writes), l.clone());
        l
    }

    fn module(&self, (family, subgroups): (Family, bool)) -> Arc<wgpu::ShaderModule> {
        let mut cache = lock(&self.pipelines.modules);
        cache
            .entry((family, subgroups))
            .or_insert_with(|| {
                let label = family.label(subgroups);
                let desc = wgpu::ShaderModuleDescriptor {
                    label: Some(&label),
                    source: wgpu::ShaderSource::Wgsl(family.source(subgroups).into()),
                };
                // SAFETY: every access stays bounds-checked, or (`bounds_proven_on_host`)
                // the host proves it in bounds before each dispatch; the loops end by
                // construction (see `runtime_checks`), which the conformance suite runs.
                Arc::new(unsafe {
                    self.device
                        .create_shader_module_trusted(desc, runtime_checks(family))
                })
            })
            .clone()
    }

    /// The pipeline of `k` with `reads` read-only and `writes` read-write storage bindings,
    /// compiled on first use; a WGSL or validation error is a typed error of `op`.
    pub(crate) fn pipeline(
        &self,
        op: &'static str,
        k: &Kernel<'_>,
        reads: u32,
        writes: u32,
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        let mk = k.module_key();
        let key = format!("{mk:?}/{}/{:?}/{reads}/{writes}", k.entry, k.consts);
        if let Some(p) = lock(&self.pipelines.pipelines).get(&key) {
            return Ok(p.clone());
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let module = self.module(mk);
        let (_, layout) = self.layouts(reads, writes);
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(k.entry),
                layout: Some(&layout),
                module: &module,
                entry_point: Some(k.entry),
                compilation_options: wgpu::PipelineCompilationOptions {
                    constants: k.consts,
                    zero_initialize_workgroup_memory: false,
                },
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            // A broken module stays broken: drop it so the message repeats, not a stale state.
            lock(&self.pipelines.modules).remove(&mk);
            return Err(Error::op(
                op,
                self.tag.clone(),
                format!(
                    "compiling {} entry point {:?} (constants {:?}) failed: {e}",
                    mk.0.label(mk.1),
                    k.entry,
                    k.consts
                ),
            ));
        }
        if self.pipeline_stats {
            crate::vulkan::stats::report(
                &self.device,
                &crate::vulkan::stats::Report {
                    label: &mk.0.label(mk.1),
                    source: &mk.0.source(mk.1),
                    entry: k.entry,
                    consts: k.consts,
                    checks: runtime_checks(mk.0),
                },
            );
        }
        let p = Arc::new(pipeline);
        lock(&self.pipelines.pipelines).insert(key, p.clone());
        Ok(p)
    }

    /// `groups` workgroups as a grid: one row of up to the per-dimension limit, then more rows
    /// (kernels recover the linear index with `wg_linear` and skip indices `>= groups`).
    pub(crate) fn grid(&self, op: &'static str, groups: u64) -> Result<(u32, u32)> {
        let max = self.limits.max_compute_workgroups_per_dimension.max(1) as u64;
        let x = groups.min(max);
        let y = groups.div_ceil(x.max(1));
        if y > max {
            return Err(Error::op(
                op,
                self.tag.clone(),
                format!("{groups} workgroups exceed a {max} x {max} grid"),
            ));
        }
        Ok((x as u32, y as u32))
    }

    /// Records one dispatch of `k` over `groups` workgroups (a 2-D grid past the
    /// per-dimension limit), with `params` as its uniform block; an error of `op` where the
    /// device is lost, the grid, the pipeline, the parameters or the bindings do not fit, or
    /// wgpu raised one ([`Self::check`]).
    ///
    /// Every instance on the device records into one encoder, and a command wgpu rejects
    /// fails the whole submission, the other instances' work in it included. So what wgpu
    /// would reject is refused here, before it is recorded: the bindings are checked on the
    /// host (the stage's storage-buffer limit; a buffer written by the dispatch not also bound
    /// read-only, which wgpu calls a usage conflict), and the bind group and uniform block are
    /// made inside an error scope whose error is this call's.
    pub(crate) fn dispatch(
        &self,
        op: &'static str,
        k: &Kernel<'_>,
        params: &[u32],
        reads: &[Bind<'_>],
        writes: &[Bind<'_>],
        groups: u64,
    ) -> Result<()> {
        self.alive(op)?;
        if groups == 0 {
            return Ok(());
        }
        let (gx, gy) = self.grid(op, groups)?;
        self.check_bindings(op, k, reads, writes)?;
        let (nr, nw) = (reads.len() as u32, writes.len() as u32);
        let pipeline = self.pipeline(op, k, nr, nw)?;
        let (bgl, _) = self.layouts(nr, nw);
        let bytes = self.uniform_block(op, k, params)?;
        let mut p = lock(&self.pending);
        let (ring, stride) = self.uniform_ring(&mut p);
        let offset = p.recorded as u64 * stride;
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        self.queue.write_buffer(&ring, offset, &bytes);
        let bind_group = self.bind_group(k, &bgl, &ring, reads, writes);
        if let Some(e) = pollster::block_on(scope.pop()) {
            // Nothing recorded: the slot's block is overwritten by the next dispatch's.
            return Err(Error::op(
                op,
                self.tag.clone(),
                format!(
                    "the bindings of {} were rejected (reads {:?}, writes {:?}): {e}",
                    k.entry,
                    crate::limits::ranges(reads),
                    crate::limits::ranges(writes)
                ),
            ));
        }
        // Dynamic offsets are u32; the ring is FLUSH_EVERY slots of at most a few KiB.
        let dynamic = [offset as u32];
        let label = p.next_label.take();
        let timed = self
            .profiler(&mut p)
            .and_then(|prof| prof.next(label.unwrap_or_else(|| k.entry.to_string())));
        self.record_locked(&mut p, |enc| {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some(k.entry),
                timestamp_writes: timed.as_ref().map(|(set, at)| {
                    wgpu::ComputePassTimestampWrites {
                        query_set: set,
                        beginning_of_pass_write_index: Some(*at),
                        end_of_pass_write_index: Some(at + 1),
                    }
                }),
            });
            pass.set_pipeline(&pipeline);
            pass.set_bind_group(0, &bind_group, &dynamic);
            pass.dispatch_workgroups(gx, gy, 1);
        });
        drop(p);
        self.check(op)
    }

    /// The bytes of `k`'s uniform block: `params` zero-padded to [`UNIFORM_WORDS`], the size
    /// of every kernel's parameter struct at most (a kernel may declare fields a call leaves at
    /// 0); more words than that are an error of `op`.
    fn uniform_block(&self, op: &'static str, k: &Kernel<'_>, params: &[u32]) -> Result<Vec<u8>> {
        if params.len() > UNIFORM_WORDS {
            return Err(Error::op(
                op,
                self.tag.clone(),
                format!(
                    "{} parameter words for {}, more than the uniform block's {UNIFORM_WORDS}",
                    params.len(),
                    k.entry
                ),
            ));
        }
        let mut words = params.to_vec();
        words.resize(UNIFORM_WORDS, 0);
        Ok(words.iter().flat_map(|w| w.to_le_bytes()).collect())
    }

    /// The bind group of one dispatch of `k` under `layout`: binding 0 one uniform block of
    /// `ring` (at the dynamic offset the dispatch passes), then `reads` and `writes` in order
    /// (the binding convention in the module docs).
    fn bind_group(
        &self,
        k: &Kernel<'_>,
        layout: &wgpu::BindGroupLayout,
        ring: &wgpu::Buffer,
        reads: &[Bind<'_>],
        writes: &[Bind<'_>],
    ) -> wgpu::BindGroup {
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: ring,
                offset: 0,
                size: wgpu::BufferSize::new(UNIFORM_BYTES),
            }),
        }];
        for (i, b) in reads.iter().chain(writes).enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: 1 + i as u32,
                resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                    buffer: b.buf,
                    offset: b.offset,
                    size: wgpu::BufferSize::new(b.size),
                }),
            });
        }
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(k.entry),
            layout,
            entries: &entries,
        })
    }

    /// The uniform ring (made on first use) and its slot stride: a block rounded up to the
    /// adapter's uniform offset alignment.
    fn uniform_ring(&self, p: &mut Pending) -> (wgpu::Buffer, u64) {
        p.uniforms
            .get_or_insert_with(|| {
                let align = u64::from(self.limits.min_uniform_buffer_offset_alignment.max(1));
                let stride = UNIFORM_BYTES.next_multiple_of(align);
                let ring = self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("dflash uniforms"),
                    size: stride * FLUSH_EVERY as u64,
                    usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                (ring, stride)
            })
            .clone()
    }

    /// Appends commands to the pending encoder (submitted every [`FLUSH_EVERY`] records).
    pub(crate) fn record(&self, f: impl FnOnce(&mut wgpu::CommandEncoder)) {
        let mut p = lock(&self.pending);
        self.record_locked(&mut p, f);
    }

    fn record_locked(&self, p: &mut Pending, f: impl FnOnce(&mut wgpu::CommandEncoder)) {
        let origin = errors::current();
        if !p.origins.contains(&origin) {
            p.origins.push(origin);
        }
        let enc = p.encoder.get_or_insert_with(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                    label: Some("dflash"),
                })
        });
        f(enc);
        p.recorded += 1;
        if p.recorded >= FLUSH_EVERY {
            self.submit_locked(p);
        }
    }

    /// Submits the pending encoder. wgpu reports what it rejects in it (recording is
    /// deferred to `finish`) in error scopes here, and the error goes to every instance whose
    /// work the encoder held ([`crate::device::errors::ErrorLog::rejected`]), not to whoever
    /// happened to flush.
    fn submit_locked(&self, p: &mut Pending) {
        p.recorded = 0;
        let origins = std::mem::take(&mut p.origins);
        if let Some(mut enc) = p.encoder.take() {
            use wgpu::ErrorFilter::{Internal, OutOfMemory, Validation};
            let scopes =
                [Validation, OutOfMemory, Internal].map(|f| self.device.push_error_scope(f));
            if let Some(prof) = &p.profile {
                prof.resolve(&mut enc);
            }
            self.queue.submit([enc.finish()]);
            // Popped innermost first.
            let rejected: Vec<String> = scopes
                .into_iter()
                .rev()
                .filter_map(|s| pollster::block_on(s.pop()))
                .map(|e| e.to_string())
                .collect();
            if !rejected.is_empty() {
                self.errors.rejected(&origins, &rejected.join("; "));
            }
            if let Some(prof) = &mut p.profile {
                prof.collect(&self.device);
            }
        }
        // Every buffer freed so far had its last use recorded in what was just submitted.
        self.pool.submitted();
    }

    /// Whether `DFLASH_WGPU_PROFILE` times this device's dispatches: set, and the device
    /// writes timestamps (said once where it does not).
    pub(crate) fn profiling(&self) -> bool {
        if !crate::profile::wanted() {
            return false;
        }
        let timestamps = self
            .device
            .features()
            .contains(wgpu::Features::TIMESTAMP_QUERY);
        if !timestamps {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                eprintln!(
                    "DFLASH_WGPU_PROFILE: {} has no TIMESTAMP_QUERY; no profile",
                    self.tag
                )
            });
        }
        timestamps
    }

    /// The profiler, when [`Self::profiling`].
    fn profiler<'p>(&self, p: &'p mut Pending) -> Option<&'p mut crate::profile::Profiler> {
        if !self.profiling() {
            return None;
        }
        Some(p.profile.get_or_insert_with(|| {
            crate::profile::Profiler::new(&self.device, &self.queue, FLUSH_EVERY)
        }))
    }

    /// Under `DFLASH_WGPU_PROFILE`, times the next dispatch under `label()` instead of its
    /// entry point (e.g. a GEMM under its shape); costs nothing otherwise.
    pub(crate) fn profile_label(&self, label: impl FnOnce() -> String) {
        if self.profiling() {
            lock(&self.pending).next_label = Some(label());
        }
    }

    /// The profile's totals since the last report (and a fresh start), if profiling.
    pub(crate) fn take_profile(&self) -> Option<String> {
        self.flush();
        lock(&self.pending).profile.as_mut()?.take_report()
    }

    /// Submits everything recorded so far (and the queue's pending host writes).
    pub(crate) fn flush(&self) {
        let mut p = lock(&self.pending);
        self.submit_locked(&mut p);
    }

    /// Submits and waits until the device is idle; reports any error raised meanwhile for
    /// the instance running on this thread, and the device's loss.
    pub(crate) fn wait(&self, op: &'static str) -> Result<()> {
        self.alive(op)?;
        self.flush();
        self.wait_idle(op)?;
        self.check(op)
    }
}

#[cfg(test)]
mod flag_order;
#[cfg(test)]
mod tests;
