//! Adapter selection, the limits in force, the registry entry, and clean errors: no adapter
//! (wgpu restricted to an API this machine lacks, in a child process), an adapter index out
//! of range, unknown attention kernels, the tensor-core forward's shipped setting (where the
//! adapter supports it), the memory a job's plan is checked against, and ops that are not
//! implemented yet.
//!
//! Skips cleanly without an adapter (except the no-adapter test, which needs none).

mod common;

use common::*;
use dflash_core::registry::{self, BackendOptions};
use dflash_core::{BackendInfo, Error};

/// The child half of `no_adapter_is_a_clean_unavailable_error`: runs only with
/// `DFLASH_WGPU_EXPECT_NONE=1`, where wgpu is restricted to an API with no adapter here.
#[test]
fn child_no_adapter() {
    if std::env::var("DFLASH_WGPU_EXPECT_NONE").is_err() {
        return;
    }
    dflash_backend_wgpu::link();
    assert_eq!(registry::device_count("wgpu").unwrap(), 0);
    match registry::create_backend("wgpu", &BackendOptions::default()) {
        Err(Error::Unavailable { name, reason }) => {
            assert_eq!(name, "wgpu");
            assert!(reason.contains("mesa-vulkan-drivers"), "{reason}");
            println!("CHILD-OK: {reason}");
        }
        Err(e) => panic!("expected Unavailable, got {e}"),
        Ok(_) => panic!("expected Unavailable, got a backend"),
    }
}

#[test]
fn no_adapter_is_a_clean_unavailable_error() {
    // Linux has no Metal (and macOS no DX12): wgpu finds no adapter through it.
    let api = if cfg!(target_os = "macos") {
        "dx12"
    } else {
        "metal"
    };
    let exe = std::env::current_exe().expect("test binary");
    let out = std::process::Command::new(exe)
        .args(["child_no_adapter", "--exact", "--nocapture"])
        .env("DFLASH_WGPU_EXPECT_NONE", "1")
        .env("WGPU_BACKEND", api)
        .output()
        .expect("run the child");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("CHILD-OK"), "{text}");
    println!("  WGPU_BACKEND={api}: Unavailable, naming mesa-vulkan-drivers");
}

/// The child half of `wgpu_adapter_name_keeps_only_the_named_adapters`: runs only with
/// `DFLASH_WGPU_EXPECT_NAMED` set, to the number of adapters `WGPU_ADAPTER_NAME` should leave
/// (`0`: none, and the error names the variable).
#[test]
fn child_adapter_name() {
    let Ok(want) = std::env::var("DFLASH_WGPU_EXPECT_NAMED") else {
        return;
    };
    dflash_backend_wgpu::link();
    let names = dflash_backend_wgpu::device::adapter_names();
    let wanted = std::env::var("WGPU_ADAPTER_NAME").unwrap().to_lowercase();
    assert!(
        names.iter().all(|n| n.to_lowercase().contains(&wanted)),
        "{names:?}"
    );
    if want == "0" {
        assert!(names.is_empty(), "{names:?}");
        match registry::create_backend("wgpu", &BackendOptions::default()) {
            Err(Error::Unavailable { reason, .. }) => {
                assert!(reason.contains("WGPU_ADAPTER_NAME") && reason.contains("matches none"));
                println!("CHILD-OK: {reason}");
            }
            Err(e) => panic!("expected Unavailable, got {e}"),
            Ok(_) => panic!("expected Unavailable, got a backend"),
        }
    } else {
        assert!(!names.is_empty());
        println!("CHILD-OK: {names:?}");
    }
}

/// `WGPU_ADAPTER_NAME` (as wgpu's `initialize_adapter_from_env` reads it) keeps the adapters
/// whose name contains it: the way to pick one the selection drops (lavapipe beside a GPU).
#[test]
fn wgpu_adapter_name_keeps_only_the_named_adapters() {
    if wgpu().is_none() {
        return;
    }
    let first = dflash_backend_wgpu::device::adapter_names()[0].clone();
    // The adapter's name, before " (API, kind)", in another case.
    let name = first
        .rsplit_once(" (")
        .map_or(first.as_str(), |(n, _)| n)
        .to_uppercase();
    for (value, expect) in [(name.as_str(), "1"), ("no-such-adapter-anywhere", "0")] {
        let exe = std::env::current_exe().expect("test binary");
        let out = std::process::Command::new(exe)
            .args(["child_adapter_name", "--exact", "--nocapture"])
            .env("DFLASH_WGPU_EXPECT_NAMED", expect)
            .env("WGPU_ADAPTER_NAME", value)
            .output()
            .expect("run the child");
        let text = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains("CHILD-OK"),
            "{value}: {text}"
        );
        println!("  WGPU_ADAPTER_NAME={value:?}: ok");
    }
}

#[test]
fn adapter_limits_and_registry() {
    let Some(be) = wgpu() else { return };
    let l = be.limits();
    let summary = be.summary();
    println!("  {summary}");
    // The adapter's own limits are in force, not WebGPU's defaults (lavapipe: 2 GiB buffers,
    // 32 KiB of workgroup memory, vs 256 MiB and 16 KiB).
    let defaults = wgpu::Limits::default();
    assert!(l.max_buffer_size >= defaults.max_buffer_size);
    assert!(l.max_compute_workgroup_storage_size >= defaults.max_compute_workgroup_storage_size);
    assert!(summary.contains("storage binding") && summary.contains("workgroup storage"));
    assert!(be.device().starts_with("wgpu:0 ("), "{}", be.device());
    assert_eq!(be.name(), "wgpu");
    assert!(registry::backend_names().contains(&"wgpu".to_string()));
    let n = registry::device_count("wgpu").unwrap();
    assert!(n >= 1);
    let e = match dflash_backend_wgpu::WgpuBackend::new(&BackendOptions {
        device: n,
        ..BackendOptions::default()
    }) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("device {n} of {n} accepted"),
    };
    assert!(
        e.contains(&format!("device {n} was asked for")) && e.contains("0: "),
        "{e}"
    );
    println!("  {e}");
}

/// The shipped attention forward (`AttnCoop::WhereSupported`, as the job reads it with no
/// switch set) starts on every adapter: the tensor-core forward only where the adapter has
/// cooperative matrices (lavapipe has none: the f32 forward), and never behind a host attention
/// kernel, which does not run the tiled one.
#[test]
fn coop_attention_where_supported_follows_the_adapter() {
    if wgpu().is_none() {
        return;
    }
    let shipped = dflash_backend_wgpu::WgpuOptions::from_vars(|_| None).unwrap();
    assert_eq!(
        shipped.attn_coop,
        dflash_backend_wgpu::AttnCoop::WhereSupported
    );
    let start = |attention: &str| {
        let opts = BackendOptions {
            attention: attention.into(),
            ..BackendOptions::default()
        };
        dflash_backend_wgpu::WgpuBackend::with_options(&opts, shipped).unwrap_or_else(|e| {
            panic!("the shipped options refused to start with {attention}: {e}")
        })
    };
    let tiled = start("wgpu-tiled");
    let lacks = dflash_backend_wgpu::device::coop_attention_lacks(0).unwrap();
    assert_eq!(
        tiled.coop_attention_forward(),
        lacks.is_empty(),
        "{lacks:?}"
    );
    if let Err(why) = dflash_backend_wgpu::device::cooperative_matrix_support(0) {
        assert!(!tiled.coop_attention_forward(), "{why}");
    }
    match lacks.is_empty() {
        true => println!("  shipped: the tensor-core forward"),
        false => println!(
            "  shipped: the f32 forward, the adapter lacks {}",
            lacks.join("; ")
        ),
    }
    assert!(!start("reference").coop_attention_forward());
}

#[test]
fn unknown_attention_kernel_lists_the_choices() {
    if wgpu().is_none() {
        return;
    }
    let opts = BackendOptions {
        attention: "no-such-kernel".into(),
        ..BackendOptions::default()
    };
    match dflash_backend_wgpu::WgpuBackend::new(&opts) {
        Err(Error::UnknownName { available, .. }) => {
            assert!(
                available.contains(&"wgpu-tiled".to_string()),
                "{available:?}"
            );
            assert!(available.contains(&"reference (host round trip)".to_string()));
        }
        Err(e) => panic!("expected UnknownName, got {e}"),
        Ok(_) => panic!("an unknown kernel was accepted"),
    }
}

#[test]
fn memory_stats_track_live_buffers() {
    let Some(be) = wgpu() else { return };
    use dflash_core::MemoryOps;
    // Other tests share the device: only what this one holds is certain.
    let t = be.zeros(&[1 << 20]).unwrap();
    let during = be.memory_stats().unwrap();
    assert!(during.in_use_bytes >= 4 << 20 && during.peak_bytes >= during.in_use_bytes);
    drop(t);
    be.synchronize().unwrap();
    println!("  memory_stats: {during:?}");
}

/// On Vulkan the backend reads its largest device-local heap, and what it holds (live tensors
/// and pooled buffers) is not free; a discrete GPU reports that as the memory a job's plan is
/// checked against, a CPU adapter (lavapipe) or an integrated GPU reports nothing, so the plan
/// asks the host. Other tests of this executable allocate on the same device at the same time,
/// so only the bound that holds whatever they do is asserted: with a 64 MiB tensor alive, free
/// is at most the total less 64 MiB.
#[test]
fn device_memory_is_the_heap_less_what_the_backend_holds() {
    let Some(be) = wgpu() else { return };
    let Some(mem) = be.device_memory() else {
        skip("not a Vulkan adapter: no device memory query, the memory plan uses host memory");
        return;
    };
    assert!(mem.total > 0, "no device-local heap: {mem:?}");
    assert!(mem.free <= mem.total, "{mem:?}");
    let n = 16 << 20;
    use dflash_core::MemoryOps;
    let t = be.zeros(&[n]).unwrap();
    let held = be.device_memory().unwrap();
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    println!(
        "  heap {:.2} GiB, free {:.2} GiB before and {:.2} GiB with 64 MiB held",
        gib(mem.total),
        gib(mem.free),
        gib(held.free)
    );
    assert_eq!(held.total, mem.total, "the heap does not change");
    assert!(
        held.free <= held.total - 4 * n as u64,
        "a live 64 MiB tensor counts as free: {held:?}"
    );
    drop(t);
    use dflash_backend_wgpu::wgpu::DeviceType;
    let host = matches!(
        be.adapter_info().device_type,
        DeviceType::Cpu | DeviceType::IntegratedGpu
    );
    match be.memory_capacity() {
        None => assert!(host, "a discrete GPU on Vulkan reports no memory capacity"),
        Some(cap) => {
            assert!(!host, "a host-memory adapter reported its heap: {cap:?}");
            assert_eq!(cap.total, mem.total);
        }
    }
}
