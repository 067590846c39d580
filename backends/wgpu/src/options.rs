//! The knobs of a wgpu backend instance beyond [`dflash_core::registry::BackendOptions`]:
//! what ships ([`WgpuOptions::shipped`]) and the environment's switches over it
//! ([`WgpuOptions::from_env`]).

use dflash_core::{Error, Result};

use crate::GemmKernel;

/// Knobs of a backend instance beyond [`dflash_core::registry::BackendOptions`]. Its
/// `Default` is [`WgpuOptions::shipped`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WgpuOptions {
    /// Fill every output buffer with NaN before an op writes it (tests, debugging).
    pub poison: bool,
    /// Bind at most this many bytes per storage binding (below the adapter's limit), so that
    /// tests exercise the chunked paths on small tensors. `None`: the adapter's limit.
    pub max_binding_bytes: Option<u64>,
    /// Keep read-only tensors (frozen weights, features) in f16 where the device has
    /// `SHADER_F16` ([`crate::WgpuBackend::compute_format`]); off, or without the feature, f32.
    pub f16: bool,
    /// Row reductions (RMSNorm, the loss's row max and sum, sums of squares) on subgroup
    /// operations where the device has `SUBGROUP`; off, or without it, through workgroup
    /// memory ([`crate::WgpuBackend::subgroups`]).
    pub subgroups: bool,
    /// The GEMM kernel: [`GemmKernel::Large`] (`matmul128`) ships; each of the others is
    /// there to be tested or timed against it (`DFLASH_WGPU_GEMM=<entry point>` picks one,
    /// [`GemmKernel::entry`]). [`crate::WgpuBackend::gemm_kernel`] says which one runs.
    /// [`GemmKernel::Coop`] (tensor cores, operands rounded to f16) also decides the device:
    /// the instance gets its adapter's cooperative-matrix device, or does not start where the
    /// adapter cannot run it.
    pub gemm: GemmKernel,
    /// Split `wgpu-tiled`'s tile loops into dispatches of at most this many list iterations
    /// (tests: the multi-pass path, which CPU adapters need, on any adapter). `None`: one
    /// pass on a GPU, as many as the adapter's loop cap needs on a CPU adapter.
    pub attn_pass_tiles: Option<usize>,
    /// Run `wgpu-tiled`'s forward on the subgroup kernel (attention_fwd_sg.wgsl) wherever the
    /// adapter's subgroups fit its tiles (BK = DP / 4 keys), not only where the tiles chosen
    /// for workgroup memory are already those: at head dim <= 32 that is 8-key tiles, which
    /// 8-lane subgroups take (tests: the subgroup forward on a CPU adapter such as lavapipe,
    /// whose subgroups are too narrow for it at head dim 128).
    pub attn_subgroup_tiles: bool,
    /// The subgroup forward's scores from query rows held in registers, the head dim split
    /// over 8 lanes (attention_fwd_sg.wgsl, `QREG`), instead of a staged query tile: ~17 KiB
    /// less workgroup memory at head dim 128 and one workgroup load per 4 vec4 FMAs instead
    /// of 5. Applies wherever the subgroup forward runs (the tiles are still chosen for the
    /// staged tile's memory). On by default (H200: forward 16.9 against 14.8 TFLOP/s,
    /// docs/PERF.md); `DFLASH_WGPU_ATTN_QREG=0` turns it off.
    pub attn_qreg: bool,
    /// The subgroup forward on key tiles twice as wide, two keys a lane (BK = DP / 2: 32 x 64
    /// tiles at head dim 128, ~45 KiB with the query rows in registers, which it implies): half
    /// the tiles per key, so half the barriers and staging rounds, where the adapter's
    /// workgroup memory holds them. On by default (H200: forward 18.0 TFLOP/s);
    /// `DFLASH_WGPU_ATTN_WIDE=0` turns it off.
    pub attn_wide_tiles: bool,
    /// The backward's dq kernel on subgroups (attention_dq_sg.wgsl): q and d_out rows held in
    /// registers for the whole key list, K and V the only tiles staged (two stagings and three
    /// barriers a key tile instead of four and five), where the adapter's subgroups take DP / 4
    /// lanes. On by default (H200: with dk/dv's, forward + backward 11.3 against 7.6 TFLOP/s);
    /// `DFLASH_WGPU_ATTN_DQ_SG=0` turns it off.
    pub attn_dq_subgroups: bool,
    /// The backward's dk/dv kernel on subgroups (attention_dkdv_sg.wgsl): k and v rows held in
    /// registers for the whole list, Q and d_out the only tiles staged (two stagings and three
    /// barriers a query tile instead of five and six). On by default;
    /// `DFLASH_WGPU_ATTN_DKDV_SG=0` turns it off.
    pub attn_dkdv_subgroups: bool,
    /// `wgpu-tiled`'s forward on cooperative matrices (attention_fwd_coop.wgsl: tensor cores
    /// on NVIDIA), at head dims 65..=128 that are a multiple of 4: q, k, v and the
    /// probabilities rounded to f16 for the two products (finer than the CUDA backend's bf16,
    /// within f16's range of 65504), f32 accumulation, softmax and output; a NaN or infinity
    /// in v reaches every row of each 128-row query tile that visits a key tile holding it.
    /// Calls at other head dims, and calls split into passes (CPU adapters), run the f32
    /// forward; the backward is f32 throughout. Shipped where the adapter has what it needs
    /// ([`AttnCoop::WhereSupported`]: the cooperative-matrix device, and the f32 forward
    /// elsewhere, said once at start; [`crate::WgpuBackend::coop_attention_forward`] says
    /// which; its effect on training is measured by `validate.sh wgpu-train-d128`,
    /// docs/PERF.md); `DFLASH_WGPU_ATTN_COOP=0` keeps the f32 forward, `=1` requires the
    /// tensor-core one (an adapter without it refuses to start, naming what it lacks), `=auto`
    /// is the shipped choice. The kernel's subgroup shuffles are its own, so
    /// `DFLASH_WGPU_SUBGROUPS=0` leaves it.
    pub attn_coop: AttnCoop,
}

/// Whether `wgpu-tiled`'s attention forward runs on cooperative matrices
/// ([`WgpuOptions::attn_coop`]); the default is what ships.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AttnCoop {
    /// Never: the f32 kernel.
    Off,
    /// Where the adapter has what it needs ([`crate::device::coop_attention_lacks`]: nothing);
    /// the f32 kernel elsewhere, said once at start. Ships.
    #[default]
    WhereSupported,
    /// Always: an adapter without it refuses to start, naming what it lacks.
    Required,
}

impl AttnCoop {
    /// The switch's reading: unset keeps `default`, `0` is [`AttnCoop::Off`], `1`
    /// [`AttnCoop::Required`], `auto` [`AttnCoop::WhereSupported`].
    fn from_switch(value: Option<&str>, default: AttnCoop) -> Option<AttnCoop> {
        match value {
            None => Some(default),
            Some("0") => Some(AttnCoop::Off),
            Some("1") => Some(AttnCoop::Required),
            Some("auto") => Some(AttnCoop::WhereSupported),
            Some(_) => None,
        }
    }
}

impl Default for WgpuOptions {
    fn default() -> Self {
        Self::shipped()
    }
}

impl WgpuOptions {
    /// What the backend runs with when nothing is set: f16 storage and subgroup reductions
    /// where the device has them, the 128 x 128 GEMM tile ([`GemmKernel::Large`]), and
    /// `wgpu-tiled` on its subgroup kernels (query registers, two keys a lane, dq and dk/dv on
    /// subgroups) wherever the adapter's subgroups and workgroup memory take them, its
    /// forward on tensor cores where the adapter has cooperative matrices
    /// ([`WgpuOptions::attn_coop`]). Tests start from it so they cover what ships.
    pub fn shipped() -> Self {
        WgpuOptions {
            poison: false,
            max_binding_bytes: None,
            f16: true,
            subgroups: true,
            gemm: GemmKernel::Large,
            attn_pass_tiles: None,
            attn_subgroup_tiles: false,
            attn_qreg: true,
            attn_wide_tiles: true,
            attn_dq_subgroups: true,
            attn_dkdv_subgroups: true,
            attn_coop: AttnCoop::WhereSupported,
        }
    }

    /// [`Self::shipped`] with the environment's switches: `DFLASH_WGPU_POISON=1` turns poison
    /// on; `DFLASH_WGPU_F16=0` forces f32 on an adapter with `SHADER_F16` (so both paths run
    /// on one machine), `DFLASH_WGPU_SUBGROUPS=0` the workgroup-memory reductions,
    /// `DFLASH_WGPU_GEMM=<entry point>` the GEMM kernel (`matmul`, `matmul128`, `matmul128_db`,
    /// `matmul128_w`, `matmul128_n` or `matmul_coop`: [`GemmKernel`]), and
    /// `DFLASH_WGPU_ATTN_QREG`, `_WIDE`, `_DQ_SG`, `_DKDV_SG` `=0` each attention variant off
    /// (`=1` on), `DFLASH_WGPU_ATTN_COOP=0` the f32 attention forward everywhere (`=1` the
    /// tensor-core one required, `=auto` where the adapter has it, as shipped). An unknown
    /// `DFLASH_WGPU_GEMM` is an error naming the values it takes, never a silent fallback, and
    /// so is any of the switches it replaced (`DFLASH_WGPU_GEMM_TILE`, `_DB`, `_WIDE`): set,
    /// each would otherwise time the shipped kernel under another's name. Each on/off switch
    /// takes `0` or `1`, and any other value is an error naming it (`=true` would otherwise
    /// run the default).
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`Self::from_env`] over any lookup of the variables (`var(name)`: its value if set).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let err = |detail: String| Error::op("wgpu_init", "wgpu", detail);
        for (old, entry) in [
            ("DFLASH_WGPU_GEMM_TILE", "matmul"),
            ("DFLASH_WGPU_GEMM_DB", "matmul128_db"),
            ("DFLASH_WGPU_GEMM_WIDE", "matmul128_w"),
        ] {
            if var(old).is_some() {
                return Err(err(format!(
                    "{old} is no longer read: DFLASH_WGPU_GEMM={entry} picks that kernel"
                )));
            }
        }
        let flag = |name: &str, default: bool| match var(name).as_deref() {
            None => Ok(default),
            Some("0") => Ok(false),
            Some("1") => Ok(true),
            Some(v) => Err(err(format!("{name}={v:?}: expected 0 (off) or 1 (on)"))),
        };
        let s = Self::shipped();
        let gemm = match var("DFLASH_WGPU_GEMM") {
            Some(v) => GemmKernel::from_entry(&v).ok_or_else(|| {
                let names: Vec<&str> = GemmKernel::ALL.iter().map(|k| k.entry()).collect();
                err(format!(
                    "DFLASH_WGPU_GEMM={v:?}: expected one of {}",
                    names.join(", ")
                ))
            })?,
            None => s.gemm,
        };
        let coop = var("DFLASH_WGPU_ATTN_COOP");
        let attn_coop = AttnCoop::from_switch(coop.as_deref(), s.attn_coop).ok_or_else(|| {
            err(format!(
                "DFLASH_WGPU_ATTN_COOP={:?}: expected 0 (the f32 forward), 1 (the tensor-core \
                 forward, required) or auto (where the adapter has it)",
                coop.clone().unwrap_or_default()
            ))
        })?;
        Ok(WgpuOptions {
            poison: flag("DFLASH_WGPU_POISON", s.poison)?,
            f16: flag("DFLASH_WGPU_F16", s.f16)?,
            subgroups: flag("DFLASH_WGPU_SUBGROUPS", s.subgroups)?,
            gemm,
            attn_qreg: flag("DFLASH_WGPU_ATTN_QREG", s.attn_qreg)?,
            attn_wide_tiles: flag("DFLASH_WGPU_ATTN_WIDE", s.attn_wide_tiles)?,
            attn_dq_subgroups: flag("DFLASH_WGPU_ATTN_DQ_SG", s.attn_dq_subgroups)?,
            attn_dkdv_subgroups: flag("DFLASH_WGPU_ATTN_DKDV_SG", s.attn_dkdv_subgroups)?,
            attn_coop,
            ..s
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(set: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let set: Vec<(String, String)> = set
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| set.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    /// No switch set: the shipped options; each switch at `0` or `1` moves its own field.
    #[test]
    fn switches_read_zero_and_one() {
        assert_eq!(
            WgpuOptions::from_vars(vars(&[])).unwrap(),
            WgpuOptions::shipped()
        );
        // The types' own defaults agree with what ships.
        assert_eq!(WgpuOptions::default(), WgpuOptions::shipped());
        assert_eq!(AttnCoop::default(), WgpuOptions::shipped().attn_coop);
        let on = WgpuOptions::from_vars(vars(&[
            ("DFLASH_WGPU_ATTN_COOP", "1"),
            ("DFLASH_WGPU_F16", "0"),
        ]))
        .unwrap();
        assert!(on.attn_coop == AttnCoop::Required && !on.f16);
        assert_eq!(
            on,
            WgpuOptions {
                attn_coop: AttnCoop::Required,
                f16: false,
                ..WgpuOptions::shipped()
            }
        );
        // The attention forward's third value: where the adapter has the tensor-core one.
        for (value, coop) in [("0", AttnCoop::Off), ("auto", AttnCoop::WhereSupported)] {
            let o = WgpuOptions::from_vars(vars(&[("DFLASH_WGPU_ATTN_COOP", value)])).unwrap();
            assert_eq!(o.attn_coop, coop, "DFLASH_WGPU_ATTN_COOP={value}");
        }
    }

    /// Any other value is an error that names the switch and the value, never the default.
    #[test]
    fn a_switch_at_another_value_is_an_error_naming_it() {
        for (name, value) in [
            ("DFLASH_WGPU_ATTN_COOP", "true"),
            ("DFLASH_WGPU_SUBGROUPS", "off"),
            ("DFLASH_WGPU_POISON", ""),
        ] {
            let e = WgpuOptions::from_vars(vars(&[(name, value)])).unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains(name) && msg.contains(&format!("{value:?}")),
                "{msg}"
            );
        }
        let e = WgpuOptions::from_vars(vars(&[("DFLASH_WGPU_GEMM", "matmul256")])).unwrap_err();
        assert!(e.to_string().contains("matmul128"), "{e}");
    }
}
